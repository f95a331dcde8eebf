"""Fixes for the clearing rules (GL001–GL005): add, move or lighten the clear of gradients."""

from __future__ import annotations

import libcst as cst

from gradlint.fixes.edits import Edit, Fix, Insert, Remove, Replace, parse_statements
from gradlint.fixes.locate import after_step, code, movable, optimizer_of_step, statement_of, tensor_backward_receiver
from gradlint.model import Event, Frame, FrameKind, LoopModel
from gradlint.parsed_file import ParsedFile
from gradlint.queries import Accumulation
from gradlint.syntax import callee_name, is_grad, keyword_arg, positional_args, receiver, walk


def add_zero_grad(model: LoopModel, step: Event) -> Fix:
    """GL001: ``opt.zero_grad()`` right after the step (after ``scaler.update()`` when a scaler steps it)."""

    def build() -> list[Edit] | None:
        if step.framework == "closure":
            return None  # the clear belongs inside the closure, which may run several times per step
        optimizer = optimizer_of_step(model.module, step)
        anchor = after_step(model.file, step)
        if optimizer is None or anchor is None:
            return None
        return [Insert(anchor, parse_statements(f"{optimizer}.zero_grad()\n"))]

    return Fix("clear the gradients right after the step", build)


def move_after_step(model: LoopModel, zero: Event, step: Event) -> Fix:
    """GL002 / GL003: move the clear to just after the step, in the step's block (under its guard)."""

    def build() -> list[Edit] | None:
        if zero.call_chain != step.call_chain:
            return None  # the clear and the step live in different functions
        unit = _clear_statement(model.file, zero, step)
        anchor = after_step(model.file, step)
        if unit is None or anchor is None or unit is anchor:
            return None
        return [Remove(unit), Insert(anchor, (movable(model.file, unit),))]

    return Fix("move the clear to just after the step", build)


def _clear_statement(parsed: ParsedFile, zero: Event, step: Event) -> cst.CSTNode | None:
    """The statement that clears: the call's own statement, or the whole ``for p in ...parameters()`` loop.

    The frames the clear has beyond those it shares with the step may only be
    loops and ``with`` blocks: a clear under a condition of its own is left alone.
    """
    shared = _shared_prefix(zero.frames, step.frames)
    extra = list(zero.frames[shared:])
    if zero.manual:
        loop = _parameter_loop(extra)
        if loop is None:
            return None
        extra = extra[: extra.index(loop)]
        unit = loop.node
        if not _only_clears(unit):
            return None  # the loop does more (copies gradients before freeing them): moving it moves that too
    else:
        unit = statement_of(parsed, zero.node)
        if not (type(unit) is cst.Expr and unit.value is zero.node):
            return None
    if any(f.kind is FrameKind.BRANCH for f in extra):
        return None
    return unit


def _only_clears(loop: cst.For) -> bool:
    """Whether every simple statement of a parameter loop touches ``.grad`` itself (``p.grad = None``,
    ``p.grad.zero_()``, ``p.grad.detach_()``), so moving the loop moves nothing else."""
    for node in walk(loop.body):
        if type(node) is cst.Assign:
            if not all(_is_grad_attribute(t.target) for t in node.targets) or not _clearing_value(node.value):
                return False
        elif type(node) is cst.Expr:
            call = node.value
            if not (type(call) is cst.Call and type(call.func) is cst.Attribute and _mentions_grad(call.func.value)):
                return False
        elif type(node) in (cst.AugAssign, cst.AnnAssign, cst.Return, cst.Del):
            return False
    return True


def _clearing_value(value: cst.BaseExpression) -> bool:
    """``None`` or a fresh zero tensor: what a clear stores into ``.grad`` (a copied gradient is no clear)."""
    if type(value) is cst.Name:
        return value.value == "None"
    return type(value) is cst.Call and callee_name(value) in ("zeros_like", "zeros")


def _is_grad_attribute(node: cst.BaseExpression) -> bool:
    return type(node) is cst.Attribute and node.attr.value == "grad"


def _mentions_grad(node: cst.BaseExpression) -> bool:
    return any(type(n) is cst.Attribute and n.attr.value == "grad" for n in walk(node))


def _shared_prefix(a: tuple[Frame, ...], b: tuple[Frame, ...]) -> int:
    count = 0
    for x, y in zip(a, b):
        if x is not y:
            break
        count += 1
    return count


def _parameter_loop(frames: list[Frame]) -> Frame | None:
    """The outermost of the trailing loops over parameters (``for p in model.parameters()``, ``param_groups``)."""
    found = None
    for frame in reversed(frames):
        if frame.kind is not FrameKind.LOOP or type(frame.node) is not cst.For or not _over_parameters(frame.node):
            break
        found = frame
    return found


def _over_parameters(loop: cst.For) -> bool:
    for node in walk(loop.iter):
        if type(node) is cst.Call and callee_name(node) in ("parameters", "named_parameters"):
            return True
        if type(node) is cst.Attribute and node.attr.value == "param_groups":
            return True
        if type(node) is cst.SimpleString and node.evaluated_value == "params":
            return True
    return False


def divide_loss(model: LoopModel, backward: Event, acc: Accumulation) -> Fix:
    """GL004: divide the loss handed to backward by the guard's accumulation count.

    ``(loss / accum).backward()`` by default; a separate ``loss = loss / accum``
    line when the module already normalises losses that way.
    """

    def build() -> list[Edit] | None:
        module = model.module
        loss, count = backward.loss, acc.count
        if loss is None or count is None or backward.call_chain:
            return None
        statement = statement_of(model.file, backward.node)
        if statement is None:
            return None
        if type(loss) is cst.Name and model.index.divides_by_assignment:
            return [Insert(statement, parse_statements(f"{loss.value} = {loss.value} / {_atom(module, count)}\n"), before=True)]
        in_receiver = receiver(backward.node) is loss if type(backward.node) is cst.Call else False
        if in_receiver and tensor_backward_receiver(backward.node) is None:
            return None  # torch.autograd.backward(loss): the receiver is a module, not the loss
        divisor = count.deep_clone()

        def make(node: cst.CSTNode) -> cst.CSTNode:
            divided = cst.BinaryOperation(left=_parenthesised(node), operator=cst.Divide(), right=_parenthesised(divisor))
            return _wrap(divided) if in_receiver else divided

        return [Replace(loss, make)]

    return Fix("divide the loss by the accumulation count", build)


_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)


def _parenthesised(node: cst.BaseExpression) -> cst.BaseExpression:
    """``node`` as an operand of ``/``: in parentheses unless it is an atom."""
    if isinstance(node, _ATOMS) or node.lpar:
        return node
    return _wrap(node)


def _wrap(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _atom(module: cst.Module, node: cst.BaseExpression) -> str:
    text = code(module, node)
    return text if isinstance(node, _ATOMS) or node.lpar else f"({text})"


def free_gradients(model: LoopModel, zero: Event) -> Fix:
    """GL005: ``set_to_none=False`` becomes ``True``; a manual zeroing loop becomes ``model.zero_grad(set_to_none=True)``."""
    if zero.manual:
        return Fix("clear with model.zero_grad(set_to_none=True)", lambda: _replace_zeroing_loop(model, zero))

    def build() -> list[Edit] | None:
        call = zero.node
        if type(call) is not cst.Call:
            return None
        arg = keyword_arg(call, "set_to_none") or next(iter(positional_args(call)), None)
        if arg is None:
            return None
        return [Replace(arg.value, lambda node: cst.Name("True").with_changes(lpar=node.lpar, rpar=node.rpar))]

    return Fix("set_to_none=True", build)


def _replace_zeroing_loop(model: LoopModel, zero: Event) -> list[Edit] | None:
    """``for p in model.parameters(): p.grad.zero_()`` → ``model.zero_grad(set_to_none=True)``."""
    loop = next((f.node for f in reversed(zero.frames) if f.kind is FrameKind.LOOP and type(f.node) is cst.For), None)
    if loop is None or type(loop.iter) is not cst.Call or callee_name(loop.iter) not in ("parameters", "named_parameters"):
        return None
    owner = receiver(loop.iter)
    if owner is None or loop.iter.args or loop.orelse is not None or not _only_clears_gradients(loop.body):
        return None
    owner_code = code(model.module, owner)

    def make(node: cst.CSTNode) -> cst.CSTNode:
        (line,) = parse_statements(f"{owner_code}.zero_grad(set_to_none=True)\n")
        return line.with_changes(leading_lines=node.leading_lines)

    return [Replace(loop, make)]


def _only_clears_gradients(block: cst.BaseSuite) -> bool:
    """Whether a loop body does nothing but clear ``p.grad`` (guarded by ``if p.grad is not None``)."""
    statements = block.body if type(block) is cst.IndentedBlock else [block]
    for statement in statements:
        if type(statement) is cst.If:
            if statement.orelse is not None or ".grad" not in cst.Module([]).code_for_node(statement.test):
                return False
            if not _only_clears_gradients(statement.body):
                return False
        elif type(statement) in (cst.SimpleStatementLine, cst.SimpleStatementSuite):
            if not all(_clears_gradient(small) for small in statement.body):
                return False
        else:
            return False
    return True


def _clears_gradient(small: cst.BaseSmallStatement) -> bool:
    if type(small) is cst.Pass:
        return True
    if type(small) is cst.Expr and type(small.value) is cst.Call:
        return callee_name(small.value) in ("zero_", "fill_", "mul_", "detach_", "requires_grad_") and is_grad(receiver(small.value))
    if type(small) is cst.Assign and len(small.targets) == 1:
        return is_grad(small.targets[0].target)
    return False
