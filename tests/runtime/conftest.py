"""Runtime tests need torch; without it the whole directory is skipped."""

from __future__ import annotations

import importlib.util
import os
import re
import sys

import pytest

if importlib.util.find_spec("torch") is None:
    collect_ignore_glob = ["*.py"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "fixtures")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torch_state.py, shared by the tests here
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


def pytest_collection_modifyitems(config, items):
    """``slow`` runtime tests run in CI (``CI=true``) and when asked for: ``-m slow`` or ``GRADLINT_SLOW=1``."""
    if "slow" in (config.getoption("-m") or "") or os.environ.get("GRADLINT_SLOW") == "1" or os.environ.get("CI") == "true":
        return
    here = os.path.dirname(os.path.abspath(__file__))
    skip = pytest.mark.skip(reason="slow: run with -m slow or GRADLINT_SLOW=1")
    for item in items:
        if "slow" in item.keywords and str(item.fspath).startswith(here):
            item.add_marker(skip)
