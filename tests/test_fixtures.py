"""Every fixture script reports exactly the findings its ``# expect:`` markers name: no more, no fewer."""

from __future__ import annotations

import dataclasses

import pytest

from fixture_markers import FIXTURES, expected_findings, extra_selected, marker_fixtures
from gradlint.config import Config
from gradlint.linter import lint_file
from gradlint.rules import ALL_RULES

FIXTURE_FILES = marker_fixtures()


def _config_for(text: str) -> Config:
    extra = extra_selected(text)
    if not extra:
        return Config()
    defaults = tuple(r.code for r in ALL_RULES if r.enabled_by_default)
    return dataclasses.replace(Config(), select=defaults + extra)


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_findings_match_markers(path):
    text = path.read_text(encoding="utf-8")
    result = lint_file(str(path), _config_for(text))
    assert result.error is None, result.error
    found = {(f.line, f.code) for f in result.findings}
    expected = expected_findings(text)
    missing = sorted(expected - found)
    extra = sorted(found - expected)
    messages = {(f.line, f.code): f.message for f in result.findings}
    assert not missing and not extra, (
        f"missing: {missing}\nunexpected: {[(line, code, messages[(line, code)]) for line, code in extra]}"
    )


def test_fixture_corpus_is_large_and_mostly_correct_code():
    silent = [p for p in FIXTURE_FILES if not expected_findings(p.read_text(encoding="utf-8"))]
    assert len(FIXTURE_FILES) >= 40
    assert len(silent) * 2 >= len(FIXTURE_FILES)


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.code)
def test_every_rule_has_a_fixture_that_triggers_it(rule):
    triggering = [p for p in FIXTURE_FILES if any(code == rule.code for _, code in expected_findings(p.read_text(encoding="utf-8")))]
    assert triggering, f"no fixture expects {rule.code}"
