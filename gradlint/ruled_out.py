"""Code that an earlier ``raise`` of its function rules out.

``if use_amp and use_gradcache: raise ValueError(...)`` at the top of a
function means that further down, under ``if use_gradcache:`` and then ``if
use_amp:``, nothing ever runs: the settings that would take that path stop
the function first. A finding there describes code that cannot run. Only
the plainest case is read: an ``if`` with no ``else`` whose body ends in
``raise``, before the node in a block that holds it, whose test is an ``or``
of ``and``s; the branches around the node, each taken on its ``if`` side,
must spell every term of one of those ``and``s, and no name the raised test
reads may be bound again between the two.
"""

from __future__ import annotations

import libcst as cst

from gradlint.model import LoopModel
from gradlint.queries import function_holding
from gradlint.syntax import boolean_terms, dotted_name, walk


def ruled_out(model: LoopModel, node: cst.CSTNode) -> bool:
    """Whether ``node`` lies only on paths that an earlier ``if ...: raise`` of its function has already refused."""
    function = function_holding(model, node)
    if function is None:
        return False
    taken = _tests_taken_to(model, node, function)
    if not taken:
        return False
    parents = model.parents or {}
    child, block = node, parents.get(node)
    while block is not None and block is not function:
        if type(block) is cst.IndentedBlock:
            statements = list(block.body)
            at = next((i for i, s in enumerate(statements) if s is child), 0)
            for position, statement in enumerate(statements[:at]):
                refused = _raised_test(statement)
                if refused is not None and _implied(model, refused, taken) and not _assigned_after(
                    model, refused, statements[position + 1:at + 1]
                ):
                    return True
        child, block = block, parents.get(block)
    return False


def _implied(model: LoopModel, refused: cst.BaseExpression, taken: set[str]) -> bool:
    """Whether the tests taken spell every term of one ``and`` of the ``or`` the raise refused."""
    return any(_and_terms(model, alternative) <= taken for alternative in boolean_terms(refused, cst.Or))


def _tests_taken_to(model: LoopModel, node: cst.CSTNode, function: cst.FunctionDef) -> set[str]:
    """The terms of the ``and``-tests of every ``if`` whose body (not its ``else``) holds ``node``, up to ``function``."""
    parents = model.parents or {}
    taken: set[str] = set()
    child, current = node, parents.get(node)
    while current is not None and current is not function:
        if type(current) is cst.If and child is current.body:
            taken |= _and_terms(model, current.test)
        child, current = current, parents.get(current)
    return taken


def _and_terms(model: LoopModel, test: cst.BaseExpression) -> set[str]:
    """The code of each term of an ``and`` (the test itself when it is none)."""
    return {model.code(term) for term in boolean_terms(test, cst.And)}


def _raised_test(statement: cst.CSTNode) -> cst.BaseExpression | None:
    """The test of ``if test: raise ...`` (no ``else``), or None."""
    if type(statement) is not cst.If or statement.orelse is not None or type(statement.body) is not cst.IndentedBlock:
        return None
    last = statement.body.body[-1] if statement.body.body else None
    if type(last) is cst.SimpleStatementLine and type(last.body[-1]) is cst.Raise:
        return statement.test
    return None


def _assigned_after(model: LoopModel, test: cst.BaseExpression, statements: list[cst.CSTNode]) -> bool:
    """Whether something the test reads (``self.args.local_rank``) or holds it (``self.args``) is bound again in the
    statements."""
    read = {dotted_name(n) for n in walk(test) if type(n) in (cst.Name, cst.Attribute)} - {None}
    for statement in statements:
        for node in walk(statement):
            targets: list[cst.CSTNode] = []
            if type(node) is cst.Assign:
                targets = [t.target for t in node.targets]
            elif type(node) is cst.AugAssign or (type(node) is cst.AnnAssign and node.value is not None):
                targets = [node.target]  # ``self.args: TrainingArguments`` alone binds nothing
            elif type(node) is cst.For:
                targets = [node.target]
            for target in targets:
                parts = [e.value for e in target.elements] if type(target) in (cst.Tuple, cst.List) else [target]
                bound = {dotted_name(part) for part in parts} - {None}
                if any(r == b or r.startswith(b + ".") for r in read for b in bound):
                    return True
    return False
