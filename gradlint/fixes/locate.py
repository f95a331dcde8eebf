"""Finding one's way around a module for a fix: which statement holds a call, what comes after it.

Events point at calls; fixes edit statements. These helpers climb from a
node to its statement and look at the statements around it, using the
parent map the module index made (:meth:`gradlint.parsed_file.ParsedFile.parent_map`).
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from gradlint.fixes.edits import Statement, as_line, without_blank_lines
from gradlint.model import Event
from gradlint.parsed_file import ParsedFile
from gradlint.syntax import children, dotted_name, method_name, positional_args, receiver, walk

def descendants(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node under ``node`` (itself included), nested functions and classes too."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(children(current))


def statement_of(parsed: ParsedFile, node: cst.CSTNode) -> Statement | None:
    """The small or compound statement that holds ``node``."""
    table = parsed.parent_map()
    current: cst.CSTNode | None = node
    while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
        current = table.get(current)
    return current


def line_of(parsed: ParsedFile, statement: Statement) -> cst.BaseStatement:
    """The line (or compound statement) a statement is written as."""
    if isinstance(statement, cst.BaseSmallStatement):
        return parsed.parent_map()[statement]
    return statement


def alone_on_line(parsed: ParsedFile, statement: Statement) -> bool:
    """Whether a small statement has a line of its own (not ``a; b``, not ``if x: a``)."""
    if isinstance(statement, cst.BaseCompoundStatement):
        return True
    line = line_of(parsed, statement)
    return type(line) is cst.SimpleStatementLine and len(line.body) == 1


def following(parsed: ParsedFile, statement: Statement) -> Iterator[Statement]:
    """The statements after ``statement`` in its block: the rest of its line first, then the later lines."""
    table = parsed.parent_map()
    line = line_of(parsed, statement)
    if line is not statement:
        body = list(line.body)
        yield from body[body.index(statement) + 1 :]
        if type(line) is cst.SimpleStatementSuite:
            return
    block = table.get(line)
    if type(block) not in (cst.Module, cst.IndentedBlock):
        return
    siblings = list(block.body)
    for later in siblings[siblings.index(line) + 1 :]:
        if type(later) is cst.SimpleStatementLine:
            yield from later.body
        else:
            yield later


def movable(parsed: ParsedFile, statement: Statement) -> cst.BaseStatement:
    """What to insert elsewhere when ``statement`` moves: its whole line (comments kept) when it has one."""
    if alone_on_line(parsed, statement):
        return without_blank_lines(line_of(parsed, statement))
    return as_line(statement)


def optimizer_of_step(module: cst.Module, step: Event) -> str | None:
    """The optimizer as written at a step: ``opt`` in ``opt.step()`` and in ``scaler.step(opt)``."""
    call = step.node
    if type(call) is not cst.Call:
        return None
    if step.via_scaler is not None or method_name(call) != "step":
        args = positional_args(call)
        return code(module, args[0].value) if args else None  # scaler.step(opt), xm.optimizer_step(opt)
    recv = receiver(call)
    return code(module, recv) if recv is not None else None


def scaler_of_step(module: cst.Module, step: Event) -> str | None:
    """The scaler as written at ``scaler.step(opt)``."""
    if step.via_scaler is None or type(step.node) is not cst.Call or receiver(step.node) is None:
        return None
    return code(module, receiver(step.node))


def after_step(parsed: ParsedFile, step: Event) -> Statement | None:
    """Where code that belongs right after a step goes: after the step, or after the ``scaler.update()`` that follows it.

    The update counts only when every path from the step reaches it: a statement between them that may leave
    the block (``if (i + 1) % k != 0: continue``) keeps the anchor at the step.
    """
    statement = statement_of(parsed, step.node)
    if not isinstance(statement, cst.BaseSmallStatement):
        return None  # a step inside an if/while test: no obvious "right after"
    scaler = scaler_of_step(parsed.module, step)
    if scaler is not None:
        for later in following(parsed, statement):
            if is_call_to(later, "update", scaler, parsed.module):
                return later
            if _may_leave(later):
                break
    return statement


def _may_leave(statement: Statement) -> bool:
    """Whether a statement is, or holds, a ``continue``, ``break``, ``return`` or ``raise``."""
    return any(isinstance(node, (cst.Continue, cst.Break, cst.Return, cst.Raise)) for node in walk(statement))


def code(module: cst.Module, node: cst.CSTNode) -> str:
    """A node's source text as written."""
    return module.code_for_node(node).strip()


def tensor_backward_receiver(call: cst.CSTNode) -> cst.BaseExpression | None:
    """``loss`` in ``loss.backward()``; None for ``torch.autograd.backward(loss)`` and anything else."""
    if type(call) is not cst.Call or method_name(call) != "backward":
        return None
    recv = receiver(call)
    name = dotted_name(recv) if recv is not None else None
    if name is not None and name.rsplit(".", 1)[-1] == "autograd":
        return None
    return recv


def is_call_to(statement: Statement, method: str, receiver_code: str, module: cst.Module) -> bool:
    """Whether a small statement is just ``<receiver_code>.<method>(...)``."""
    if type(statement) is not cst.Expr or type(statement.value) is not cst.Call:
        return False
    call = statement.value
    recv = receiver(call)
    return method_name(call) == method and recv is not None and code(module, recv) == receiver_code
