"""Pairing buggy fixtures with their fixed twins, and fixing them the way ``gradlint --fix`` would."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from fixture_markers import FIXTURES, expected_findings, extra_selected, marker_fixtures
from gradlint.config import Config
from gradlint.findings import FixKind
from gradlint.fixer import FixOutcome, fix_text
from gradlint.rules import ALL_RULES, RULES_BY_CODE

FIXED = FIXTURES / "fixed"

# Rules the golden test turns on for one fixture only: ``# fix-select: GL204`` (off-by-default rules
# whose finding the fixture does not assert with an ``# expect:`` marker).
_FIX_SELECT = re.compile(r"^#\s*fix-select:\s*(?P<codes>.+)$", re.MULTILINE)


def twin_of(buggy: Path) -> Path:
    """Where the fixed twin of a buggy fixture lives: ``fixtures/fixed/<same relative path>``."""
    return FIXED / buggy.relative_to(FIXTURES)


def fix_selected(text: str) -> tuple[str, ...]:
    """The codes a ``# fix-select:`` line asks the golden test to turn on."""
    match = _FIX_SELECT.search(text)
    return tuple(c.strip() for c in match.group("codes").split(",")) if match else ()


def codes_for(text: str) -> set[str]:
    """Every rule a fixture's fixing involves: its markers and its selections."""
    return {code for _, code in expected_findings(text)} | set(extra_selected(text)) | set(fix_selected(text))


def config_for(text: str) -> Config:
    """The default rules plus whatever the fixture selects."""
    extra = tuple(extra_selected(text)) + fix_selected(text)
    if not extra:
        return Config()
    defaults = tuple(r.code for r in ALL_RULES if r.enabled_by_default)
    return dataclasses.replace(Config(), select=defaults + extra)


def needs_unsafe(text: str) -> bool:
    """Whether fixing this fixture needs ``--unsafe-fixes`` (one of its rules has an unsafe fix)."""
    return any(RULES_BY_CODE[c].fix is FixKind.UNSAFE for c in codes_for(text) if c in RULES_BY_CODE)


def missing_rules(text: str) -> list[str]:
    """Codes the fixture relies on that this build does not have yet."""
    return sorted(c for c in codes_for(text) if c not in RULES_BY_CODE)


def fix_fixture(path: Path, text: str | None = None) -> FixOutcome:
    """``gradlint --fix`` (``--unsafe-fixes`` where needed) on a fixture's text, nothing written."""
    text = path.read_text(encoding="utf-8") if text is None else text
    original = path.read_text(encoding="utf-8")
    return fix_text(text, str(path), config_for(original), unsafe=needs_unsafe(original))


def buggy_fixtures() -> list[Path]:
    """Fixtures with something to fix: an ``# expect:`` marker of a rule that has a fix (or is not here yet), or a twin."""
    found = []
    for path in marker_fixtures():
        text = path.read_text(encoding="utf-8")
        codes = {code for _, code in expected_findings(text)}
        fixable = any(code not in RULES_BY_CODE or RULES_BY_CODE[code].fix is not None for code in codes)
        if fixable or twin_of(path).exists():
            found.append(path)
    return found
