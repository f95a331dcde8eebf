"""``--fix`` turns every buggy fixture into its fixed twin, exactly; the twin lints clean of the fixed rules; a second run changes nothing."""

from __future__ import annotations


import pytest

from fix_harness import FIXED, buggy_fixtures, codes_for, fix_fixture, missing_rules, twin_of
from fixture_markers import FIXTURES
from gradlint.rules import RULES_BY_CODE

BUGGY = buggy_fixtures()
WITH_TWIN = [p for p in BUGGY if twin_of(p).exists()]
WITHOUT_TWIN = [p for p in BUGGY if not twin_of(p).exists()]


def _id(path):
    return str(path.relative_to(FIXTURES))


@pytest.mark.parametrize("buggy", WITH_TWIN, ids=_id)
def test_fix_produces_the_twin_exactly(buggy):
    text = buggy.read_text(encoding="utf-8")
    if missing_rules(text):
        pytest.skip(f"{', '.join(missing_rules(text))} not in this build; its fix is tested from events meanwhile")
    outcome = fix_fixture(buggy)
    assert outcome.result.error is None, outcome.result.error
    assert outcome.text == twin_of(buggy).read_text(encoding="utf-8")
    assert outcome.fixed >= 1


@pytest.mark.parametrize("buggy", WITH_TWIN, ids=_id)
def test_twin_is_clean_of_the_fixed_rules_and_fixing_it_again_changes_nothing(buggy):
    text = buggy.read_text(encoding="utf-8")
    if missing_rules(text):
        pytest.skip(f"{', '.join(missing_rules(text))} not in this build")
    twin = twin_of(buggy)
    again = fix_fixture(buggy, twin.read_text(encoding="utf-8"))
    assert again.result.error is None, again.result.error
    assert again.fixed == 0
    assert again.text == twin.read_text(encoding="utf-8")
    fixed_codes = {c for c in codes_for(text) if RULES_BY_CODE[c].fix is not None}
    assert not [f for f in again.result.findings if f.code in fixed_codes]


def test_every_twin_belongs_to_one_buggy_fixture():
    twins = {twin_of(p) for p in WITH_TWIN}
    orphans = sorted(str(p.relative_to(FIXED)) for p in FIXED.rglob("*.py") if p not in twins)
    assert not orphans, f"twins without a buggy fixture: {orphans}"


@pytest.mark.parametrize("buggy", WITHOUT_TWIN, ids=_id)
def test_buggy_fixture_without_a_twin_offers_no_fix(buggy):
    """A buggy fixture has no twin only when none of its findings has a fix (a shape the fixes leave alone)."""
    outcome = fix_fixture(buggy)
    assert outcome.result.error is None, outcome.result.error
    assert outcome.fixed == 0 and outcome.text == buggy.read_text(encoding="utf-8"), (
        f"{buggy} is fixable: add its twin at {twin_of(buggy)}"
    )
    assert all(f.fix is None for f in outcome.result.findings)
