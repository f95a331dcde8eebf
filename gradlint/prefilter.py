"""The prefilter: which rules could fire on a text, decided before LibCST parses it.

Two levels, each a superset of what the loop model reacts to:

1. **Text**: every rule lists tokens (:attr:`gradlint.rule.Rule.needs`) that
   code it fires on must spell. A file without the tokens of any selected
   rule is never parsed at all.
2. **Calls**: a token for a call (:class:`gradlint.rule.CallNeed`:
   ``backward``, ``step``, ``zero_grad``...) also matches the word in a
   docstring, a comment or a ``def``. Where Python's own tree of the file is
   at hand (the project index parses it anyway, and it is several times
   cheaper than LibCST's), such a token counts only when the module really
   calls the name (:func:`called_names`). Library code full of
   ``*_backward`` functions and docs about ``step()`` is then left unparsed.

A module written for another autodiff library (:mod:`gradlint.foreign_code`)
fires no rule.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from gradlint.foreign_code import written_for_another_library
from gradlint.objects import ObjKind, kind_from_name
from gradlint.python_nodes import FiledTree
from gradlint.tokens import CallNeed, Need

if TYPE_CHECKING:
    from gradlint.rule import Rule


def needed_tokens(rules: Iterable[type[Rule]]) -> tuple[Need, ...]:
    """The prefilter tokens of ``rules``: a file must contain at least one for any of them to fire."""
    tokens: list[Need] = []
    for rule in rules:
        tokens.extend(t for t in rule.needs if t not in tokens)
    return tuple(tokens)


def might_fire(text: str, rules: Sequence[type[Rule]]) -> bool:
    """The cheap prefilter: whether ``text`` contains the tokens of at least one of ``rules``.

    Each token is searched for at most once per text, and the tokens of a
    tuple in order, stopping at the first one that is absent.
    """
    search = _TokenSearch(text)
    return any(search.present(token) for token in needed_tokens(rules)) and not written_for_another_library(text)


def rules_that_might_fire(
    text: str, rules: Sequence[type[Rule]], called: frozenset[str] | None = None
) -> list[type[Rule]]:
    """The rules among ``rules`` whose prefilter tokens ``text`` contains, each token searched for at most once.

    A rule whose tokens are absent cannot fire (:attr:`Rule.needs`), so a
    parsed file is checked with these rules only. ``called``, the names the
    module calls (:func:`called_names`), narrows call tokens to real calls.
    """
    search = _TokenSearch(text, called)
    firing = [rule for rule in rules if any(search.present(token) for token in rule.needs)]
    return [] if firing and written_for_another_library(text) else firing


# In :func:`called_names`' answer: the module imports ``backward`` under another name
# (``from torch.autograd import backward as bw``), so any call may be a backward.
BACKWARD_ALIAS = "<backward imported as another name>"
# In :func:`called_names`' answer: some call is handed an argument named as an optimizer (``optimize(self.opt)``).
HANDS_OPTIMIZER = "<an optimizer handed to a call>"


def called_names(tree: FiledTree) -> frozenset[str]:
    """The last name of every callee in ``tree`` (``opt.step()`` → ``step``), and the markers that apply.

    :data:`BACKWARD_ALIAS` when ``backward`` is imported under another name;
    :data:`HANDS_OPTIMIZER` when a call is handed an optimizer as an argument.
    """
    names: set[str] = set()
    nodes = tree.by_type()
    for node in nodes.get(ast.Call, ()):
        func = node.func
        if type(func) is ast.Attribute:
            names.add(func.attr)
        elif type(func) is ast.Name:
            names.add(func.id)
        if HANDS_OPTIMIZER not in names and any(_names_optimizer(arg) for arg in node.args):
            names.add(HANDS_OPTIMIZER)
    for node in nodes.get(ast.ImportFrom, ()):
        if any(alias.name == "backward" and alias.asname for alias in node.names):
            names.add(BACKWARD_ALIAS)
    return frozenset(names)


def _names_optimizer(node: ast.expr) -> bool:
    """``opt``, ``self.optimizer``: an argument whose name says it is an optimizer."""
    last = node.id if type(node) is ast.Name else node.attr if type(node) is ast.Attribute else None
    return last is not None and "opt" in last.lower() and kind_from_name(last) is ObjKind.OPTIMIZER


# What the prefilter reads in place of what another file of the run does for this one: a release set-up (a call of a
# function of another file that sets gradient release up), and a scaled backward (before a callback of this file
# that the run runs while the gradients are still scaled).
RELEASE_STAND_IN = "register_post_accumulate_grad_hook"
SCALED_BACKWARD_STAND_IN = "scaler.scale(loss).backward()"
# ... and a backward in a helper of another file that this file hands its loss and optimizer (``backs:``).
HELPER_BACKWARD_STAND_IN = "loss.backward()"


def text_in_context(text: str, context: Iterable[str]) -> str:
    """The text as the prefilter reads it, knowing the file's context (:meth:`gradlint.project_index.ProjectIndex.context_of`).

    A call of a function of another file of the run that sets gradient
    release up (``releases:``) is a release set-up the text does not spell,
    and a callback of this file that the run runs after a scaled backward
    (``scaled:``) sees gradients the text does not scale, and a call of a
    backward helper of another file (``backs:``) backpropagates where the
    text spells no backward: the text reads as if it spelled them. The same text is returned when nothing applies.
    """
    from gradlint.project_index import BACKWARD_HELPER, RELEASES, SCALED_DISPATCH

    added = []
    if any(name.startswith(RELEASES) and name[len(RELEASES):] in text for name in context):
        added.append(RELEASE_STAND_IN)
    if any(name.startswith(SCALED_DISPATCH) for name in context):
        added.append(SCALED_BACKWARD_STAND_IN)
    if any(name.startswith(BACKWARD_HELPER) for name in context):
        added.append(HELPER_BACKWARD_STAND_IN)
    return "\n".join((text, *added)) if added else text


class _TokenSearch:
    """Whether a text contains prefilter tokens, each token searched for once."""

    def __init__(self, text: str, called: frozenset[str] | None = None) -> None:
        self.text = text
        self.called = called
        self.found: dict[object, bool] = {}

    def present(self, token: Need) -> bool:
        """Whether the text contains ``token`` (every part of a tuple, searched in order until one is absent)."""
        if isinstance(token, tuple):
            return all(self.present(t) for t in token)
        found = self.found.get(token)
        if found is None:
            if isinstance(token, str):
                found = token in self.text
            else:
                found = token.search(self.text) is not None
                if found and self.called is not None and isinstance(token, CallNeed):
                    found = token.called_in(self.called, BACKWARD_ALIAS, HANDS_OPTIMIZER)
            self.found[token] = found
        return found
