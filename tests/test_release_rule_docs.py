"""``gradlint rule`` documents the release, scheduler and distributed rules."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gradlint.cli import main
from gradlint.findings import FixKind, Severity
from gradlint.rules import RULES_BY_CODE

NEW_RULES = {
    "GL201": (Severity.ERROR, None, ("bfloat16", "inf/NaN")),
    "GL202": (Severity.ERROR, None, ("optimizer accumulation",)),
    "GL203": (Severity.ERROR, None, ("StableAdamW", "inside the hook")),
    "GL204": (Severity.INFO, FixKind.UNSAFE, ("gradlint measure", "activations")),
    "GL301": (Severity.ERROR, FixKind.SAFE, ("once per epoch",)),
    "GL302": (Severity.WARNING, None, ("no_sync", "require_backward_grad_sync")),
}


@pytest.mark.parametrize("code", sorted(NEW_RULES))
def test_rule_command_prints_the_documentation(code):
    severity, fix, phrases = NEW_RULES[code]
    rule = RULES_BY_CODE[code]
    assert (rule.severity, rule.fix) == (severity, fix)
    result = CliRunner().invoke(main, ["rule", code.lower()])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"{code} {rule.name} ({severity.value}, ")
    for section in ("\nWhy it matters. ", "\nFix. ", "\nBad:\n", "\nGood:\n"):  # rendered for a terminal
        assert section in result.output
    for phrase in phrases:
        assert phrase in result.output


def test_only_the_release_candidate_is_off_by_default():
    assert [code for code in NEW_RULES if not RULES_BY_CODE[code].enabled_by_default] == ["GL204"]
    assert "off unless selected" in CliRunner().invoke(main, ["rule", "GL204"]).output
