"""Runtime tests need torch; without it the whole directory is skipped."""

from __future__ import annotations

import importlib.util
import os
import re

import pytest

if importlib.util.find_spec("torch") is None:
    collect_ignore_glob = ["*.py"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "fixtures")
MARKER = re.compile(r"#\s*expect:\s*(GL\d{3})")


def marker_findings(path: str) -> list:
    """``Finding`` s built from the ``# expect: GLnnn`` markers of a fixture, as the static linter would report them."""
    from gradlint.findings import Finding, Severity

    found = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            for code in MARKER.findall(line):
                found.append(Finding(path, n, 1, n, 1, code, "expected", "from marker", Severity.ERROR, None))
    return found


def fixture_path(name: str) -> str:
    return os.path.join(FIXTURES, name)


@pytest.fixture
def markers():
    return marker_findings


@pytest.fixture
def fixtures_dir():
    return FIXTURES
