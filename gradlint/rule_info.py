"""What is known of a rule without importing it: enough to select rules, prefilter a file and list the rules.

A rule's module imports LibCST and the loop model, which takes most of a
second to load. The command line decides which files to parse from the
entries of :mod:`gradlint.catalogue` instead (generated from the rule
classes, kept current by a test) and imports the rules only for the files
that pass the prefilter.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from gradlint.findings import FixKind, Severity
from gradlint.tokens import Need

if TYPE_CHECKING:
    from gradlint.rule import Rule


@dataclasses.dataclass(frozen=True)
class RuleInfo:
    """A rule's traits and prefilter tokens, with the same names as the class attributes of :class:`~gradlint.rule.Rule`."""

    code: str
    name: str
    summary: str
    severity: Severity
    fix: FixKind | None
    enabled_by_default: bool
    needs: tuple[Need, ...]

    def rule(self) -> type[Rule]:
        """The rule class itself (imports every rule, and LibCST, on first use)."""
        from gradlint.rules import RULES_BY_CODE

        return RULES_BY_CODE[self.code]
