"""What a rule is: a code, a name, a one-line summary, documentation, and a check over the loop model."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Iterator
from typing import ClassVar, Union

import libcst as cst

from gradlint import frameworks

from gradlint.findings import FixKind, Severity
from gradlint.fixes.edits import Fix
from gradlint.model import LoopModel


# One prefilter token: a substring, a compiled pattern the text must match, or a
# tuple of tokens that must all be present.
Need = Union[str, "re.Pattern[str]", "CallNeed", "Spelled", "AnyOf", tuple]


class Spelled:
    """A prefilter token: a pattern, searched only in texts that hold ``literal``, a substring of every match.

    A pattern that may start at any ``.`` or word is slow to scan a whole
    text with; a plain ``in`` for the literal rejects most texts first.
    """

    def __init__(self, literal: str, pattern: str) -> None:
        self.literal = literal
        self.pattern = re.compile(pattern)

    def search(self, text: str) -> "re.Match[str] | None":
        """The first match of the pattern in ``text``, if the literal is there at all."""
        return self.pattern.search(text) if self.literal in text else None

    def __repr__(self) -> str:
        return f"Spelled({self.literal!r}, {self.pattern.pattern!r})"


class AnyOf:
    """A prefilter token: any of several substrings (a plain ``in`` each, faster than one alternation pattern)."""

    def __init__(self, *substrings: str) -> None:
        self.substrings = substrings

    def search(self, text: str) -> str | None:
        """The first of the substrings that ``text`` contains, or None."""
        return next((s for s in self.substrings if s in text), None)

    def __repr__(self) -> str:
        return f"AnyOf{self.substrings!r}"


class CallNeed:
    """A prefilter token for a call: a pattern the text must match, and the callee names that make it a real call.

    The pattern decides on text alone, and errs towards matching (the word in
    a docstring or a ``def`` matches too). Where Python's tree of the module
    is at hand, :meth:`called_in` narrows it to the module's real calls
    (:mod:`gradlint.prefilter`): a callee whose last name ends with one of
    ``suffixes`` or is one of ``names``; with ``alias_import``, any call when
    the module imports ``backward`` under another name; with ``handed``, any
    call handed an argument named as an optimizer (a function of another file
    may step it).
    """

    def __init__(
        self, pattern: str, *, suffixes: tuple[str, ...] = (), names: tuple[str, ...] = (), alias_import: bool = False, handed: bool = False
    ) -> None:
        self.pattern = re.compile(pattern)
        self.suffixes = suffixes
        self.names = frozenset(names)
        self.alias_import = alias_import
        self.handed = handed

    def search(self, text: str) -> "re.Match[str] | None":
        """The first match of the text pattern in ``text``."""
        return self.pattern.search(text)

    def called_in(self, called: frozenset[str], alias_marker: str, handed_marker: str) -> bool:
        """Whether a module calling ``called`` (last names of callees, and the markers) really makes this call."""
        if (self.alias_import and alias_marker in called) or (self.handed and handed_marker in called):
            return True
        if not self.names.isdisjoint(called):
            return True
        return any(name.endswith(self.suffixes) for name in called) if self.suffixes else False

    def __repr__(self) -> str:
        return f"CallNeed({self.pattern.pattern!r})"


_CALL_GAP = r"(?:[\s\\)]|#[^\n]*(?![^\n]))*"


def call_of(name: str, *, handed: bool = False) -> CallNeed:
    """A prefilter token for a call of ``name``: the name, then ``(`` after blanks, ``)``, ``\\`` or comments.

    It matches every way a call can be written (``opt.step()``, ``opt.step (``,
    ``(loss.backward)()``) and skips the word in prose (``backward compatible``).
    Like the text, which does not anchor the name, any callee whose name ends
    with ``name`` counts as the call (``xm.optimizer_step(opt)`` for ``step``).
    """
    return CallNeed(re.escape(name) + _CALL_GAP + r"\(", suffixes=(name,), handed=handed)


def word(name: str) -> "re.Pattern[str]":
    """A prefilter token for ``name`` as a whole identifier (``p.grad``, not ``requires_grad``)."""
    escaped = re.escape(name)
    # The look-behind comes after the literal so that the search can scan for the literal quickly.
    return re.compile(rf"{escaped}(?<!\w{escaped})(?!\w)")


# Tokens for what the loop model recognises. A BACKWARD event is a call of
# ``backward`` or of a framework's backward method (``frameworks.BACKWARD_METHODS``:
# ``manual_backward``), of ``torch.autograd.backward`` imported
# under another name (``backward as bw``), or a CUDA graph's ``replay()``;
# a STEP is a call of ``step`` or ``optimizer_step``, or of a function of
# another file handed an optimizer that it steps (``trainer.optimize(opt)``).
# A scaler is known by a name or constructor containing
# "scaler" in any case; that search is slow, so it goes last in a tuple.
_BACKWARD_NAMES = ("backward", *sorted(frameworks.BACKWARD_METHODS - {"backward"}), "replay")
BACKWARD = CallNeed(r"backward" + _CALL_GAP + r"(?:\(|as(?!\w))", names=_BACKWARD_NAMES, alias_import=True)
STEP = call_of("step", handed=True)
SCALER = re.compile("caler", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Report:
    """What a rule's check yields: the node to point at, the message naming the objects involved, and the fix.

    ``fix`` is how to repair this very finding (whether it is safe is the
    rule's :attr:`Rule.fix`); None when the rule has no fix or the code is not
    shaped for one.
    """

    node: cst.CSTNode
    message: str
    fix: Fix | None = None


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
