"""Prefilter tokens: what a file's text must spell for a rule to fire.

A rule lists its tokens in :attr:`gradlint.rule.Rule.needs`;
:mod:`gradlint.prefilter` searches a text for them before anything parses it.
This module imports nothing heavy, so that the command line can decide which
files to parse before it loads LibCST or any rule.
"""

from __future__ import annotations

import re
from typing import Union


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
# ``backward`` or of a framework's backward method (``manual_backward``: the
# registry's ``frameworks.BACKWARD_METHODS``, spelled out here so that start-up
# loads no LibCST; tests/test_frameworks.py holds the two equal), of ``torch.autograd.backward`` imported
# under another name (``backward as bw``), or a CUDA graph's ``replay()``;
# a STEP is a call of ``step`` or ``optimizer_step``, or of a function of
# another file handed an optimizer that it steps (``trainer.optimize(opt)``).
# A scaler is known by a name or constructor containing
# "scaler" in any case; that search is slow, so it goes last in a tuple.
BACKWARD = CallNeed(r"backward" + _CALL_GAP + r"(?:\(|as(?!\w))", names=("backward", "manual_backward", "replay"), alias_import=True)
STEP = call_of("step", handed=True)
SCALER = re.compile("caler", re.IGNORECASE)


# A call handed an argument named as an optimizer (``loss_scaler(loss, optimizer, update_grad=...)``): a function of
# another file may backpropagate or step for this one. A file that spells one may hand its loss to a backward helper.
HANDS_AN_OPTIMIZER = CallNeed(r"(?i)[(,]\s*(?:\w+\.)*\w*opt\w*\s*[,):=]", handed=True)


# What every gradient-release set-up spells (torch's hook and ``_apply_optimizer_in_backward``, and the frameworks'
# ``release_tokens``: ``gradlint.release_setups.RELEASE_TOKENS``, spelled out here so that start-up loads no LibCST;
# tests/test_frameworks.py holds the two equal). A file that spells one may set release up for another file of its run.
RELEASE_SPELLINGS = AnyOf("post_accumulate_grad_hook", "in_backward", "gradient_release", "in_bwd", "InBackward", "GradientRelease")


def token_key(token: Need) -> tuple:
    """What ``token`` searches for, as a hashable value: two tokens with the same key match the same texts."""
    if isinstance(token, tuple):
        return ("all", tuple(token_key(part) for part in token))
    if isinstance(token, str):
        return ("substring", token)
    if isinstance(token, re.Pattern):
        return ("pattern", token.pattern, token.flags)
    if isinstance(token, Spelled):
        return ("spelled", token.literal, token.pattern.pattern, token.pattern.flags)
    if isinstance(token, AnyOf):
        return ("any", token.substrings)
    if isinstance(token, CallNeed):
        return ("call", token.pattern.pattern, token.pattern.flags, token.suffixes, tuple(sorted(token.names)), token.alias_import, token.handed)
    raise TypeError(f"not a prefilter token: {token!r}")
