"""What a rule is: a code, a name, a one-line summary, documentation, and a check over the loop model."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator
from typing import ClassVar

import libcst as cst

from gradlint.findings import FixKind, Severity
from gradlint.fixes.edits import Fix
from gradlint.model import Event, LoopModel
# The prefilter tokens, also importable from here as the rules have always imported them.
from gradlint.tokens import BACKWARD, SCALER, STEP, AnyOf, CallNeed, Need, Spelled, call_of, word  # noqa: F401


@dataclasses.dataclass(frozen=True)
class Report:
    """What a rule's check yields: the node to point at, the message naming the objects involved, and the fix.

    ``fix`` is how to repair this very finding (whether it is safe is the
    rule's :attr:`Rule.fix`); None when the rule has no fix or the code is not
    shaped for one.

    ``event`` is the event whose ``node`` is reported, and ``against`` the
    events it is judged against (the step a clip runs before): when the event
    was inlined from a helper and the others were not inlined through the same
    calls, the finding is placed at the call the user must change (see
    :func:`gradlint.linter.report_site`). A rule names them where its finding
    is about where or how often the event runs (a clear, clip, unscale or
    scheduler step in the wrong place, a step never cleared); where it is
    about what the event's own line says (a step that bypasses the scaler,
    a zeroing that keeps buffers), the line itself is the one to change, and
    the rule leaves ``event`` unset.
    """

    node: cst.CSTNode
    message: str
    fix: Fix | None = None
    event: Event | None = None
    against: tuple[Event, ...] = ()
    # The count the defect needs above 1 (``args.gradient_accumulation_steps``): when the run declares it with the
    # default 1, the message says the finding is latent (:mod:`gradlint.setting_defaults`)
    setting: cst.BaseExpression | None = None


class Rule:
    """Base class of every rule. The class docstring is the rule's documentation.

    Subclasses set the class attributes and implement :meth:`check`. A rule
    reads the :class:`~gradlint.model.LoopModel` only; it never walks the
    syntax tree for what the model already knows.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    severity: ClassVar[Severity] = Severity.ERROR
    fix: ClassVar[FixKind | None] = None
    # Opportunities (severity info) are off unless selected explicitly.
    enabled_by_default: ClassVar[bool] = True
    # The prefilter: a file must contain at least one of these tokens for this
    # rule to fire, or it is never parsed. A token is a substring, a pattern
    # (``call_of("step")``, ``word("grad")``, ``Spelled("grad", pattern)`` for a slow
    # pattern behind a quick substring), ``AnyOf(...)`` substrings, or a tuple of
    # tokens that must all be present. Every way of writing code the rule fires on must match: err
    # on the side of too many.
    needs: ClassVar[tuple[Need, ...]] = ("backward",)

    def check(self, model: LoopModel) -> Iterator[Report]:
        """Yield one report per problem found in ``model``."""
        raise NotImplementedError

    @classmethod
    def documentation(cls) -> str:
        """The rule's documentation: its docstring, dedented."""
        return inspect.cleandoc(cls.__doc__ or "")


class Settled:
    """The nodes that already have a report whose fix applies.

    The linter keeps one report per node: the first one whose fix applies,
    or else the first one. A rule that would report the same node once per
    step of a loop can skip the node once it is settled, without changing
    what is reported, and stays linear in the size of the loop.
    """

    def __init__(self) -> None:
        self._nodes: set[int] = set()

    def __contains__(self, node: cst.CSTNode) -> bool:
        return id(node) in self._nodes

    def note(self, report: Report) -> Report:
        """Remember ``report``'s node if its fix applies; return the report."""
        if report.fix is not None and report.fix.edits() is not None:
            self._nodes.add(id(report.node))
        return report
