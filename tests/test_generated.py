"""The files generated from the rule classes are current: the catalogue and the rule pages."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradlint import catalogue
from gradlint.generate import COMMAND, RULE_PAGES, expected_files, stale_files
from gradlint.rules import ALL_RULES
from gradlint.tokens import token_key

ROOT = Path(__file__).resolve().parent.parent


def test_generated_files_are_current():
    stale = stale_files(ROOT, expected_files(ALL_RULES))
    assert not stale, f"out of date with the rule classes: {[p.as_posix() for p in stale]}; run `{COMMAND}`"


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.code)
def test_catalogue_entry_has_the_rules_traits_and_tokens(rule):
    entry = catalogue.RULES_BY_CODE[rule.code]
    assert (entry.name, entry.summary, entry.severity, entry.fix, entry.enabled_by_default) == (
        rule.name, rule.summary, rule.severity, rule.fix, rule.enabled_by_default,
    )
    assert [token_key(t) for t in entry.needs] == [token_key(t) for t in rule.needs]
    assert entry.rule() is rule


def test_catalogue_lists_the_rules_in_order():
    assert [entry.code for entry in catalogue.ALL_RULES] == [rule.code for rule in ALL_RULES]


def test_a_changed_missing_or_orphan_page_is_stale(tmp_path):
    expected = expected_files(ALL_RULES)
    for path, text in expected.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    assert stale_files(tmp_path, expected) == []
    changed = tmp_path / RULE_PAGES / "GL003.md"
    changed.write_text(changed.read_text(encoding="utf-8").replace("Fix.", "Repair."), encoding="utf-8")
    (tmp_path / RULE_PAGES / "GL001.md").unlink()
    (tmp_path / RULE_PAGES / "GL999.md").write_text("# a rule that is gone\n", encoding="utf-8")
    assert sorted(p.name for p in stale_files(tmp_path, expected)) == ["GL001.md", "GL003.md", "GL999.md"]
