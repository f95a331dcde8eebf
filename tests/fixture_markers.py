"""Reading ``# expect: GL00N`` markers out of fixture scripts."""

from __future__ import annotations

import re
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

_EXPECT = re.compile(r"#\s*expect:\s*(?P<codes>GL\d{3}(?:\s*,\s*GL\d{3})*)")
_SELECT = re.compile(r"^#\s*fixture-select:\s*(?P<codes>.+)$", re.MULTILINE)


def expected_findings(text: str) -> set[tuple[int, str]]:
    """``(line, code)`` for every ``# expect: GL001, GL005`` marker in a fixture."""
    expected = set()
    for number, line in enumerate(text.splitlines(), start=1):
        match = _EXPECT.search(line)
        if match:
            for code in match.group("codes").split(","):
                expected.add((number, code.strip()))
    return expected


def extra_selected(text: str) -> tuple[str, ...]:
    """Rules a fixture turns on beyond the defaults, from a ``# fixture-select: GL204`` line."""
    match = _SELECT.search(text)
    return tuple(c.strip() for c in match.group("codes").split(",")) if match else ()


CROSSFILE = FIXTURES / "crossfile"


def marker_fixtures() -> list[Path]:
    """Every single-file fixture script checked against its markers.

    Golden fixed twins live in ``fixtures/fixed``; the folders of
    ``fixtures/crossfile`` are linted as one run each (:func:`crossfile_cases`).
    """
    return sorted(p for p in FIXTURES.rglob("*.py") if not {"fixed", "crossfile"} & set(p.relative_to(FIXTURES).parts))


def crossfile_cases() -> list[Path]:
    """The folders of ``fixtures/crossfile``: several modules of one package, checked together."""
    return sorted(p for p in CROSSFILE.iterdir() if p.is_dir())
