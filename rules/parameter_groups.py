"""Whether every parameter group a function fills reaches the optimizer it builds (GL025)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from gradlint.findings import Severity
from gradlint.model import LoopModel
from gradlint.queries import function_holding
from gradlint.rule import Report, Rule, call_of
from gradlint.rules.parameters import _builds_optimizer
from gradlint.syntax import callee_name, receiver, walk

# Calls on a collection that put something into it without handing the collection anywhere.
_FILLING_METHODS = frozenset({"append", "extend", "insert"})


class ParameterGroupNeverAdded(Rule):
    """A function fills a parameter group (or list) and never hands it to the optimizer it builds.

    **Why it matters.** Parameter groups are often collected by name, one
    group per learning rate: ``params = {"lr": 5e-2, "params": []}``, a loop
    over ``named_parameters()`` that appends the matching ones, then
    ``parameters.append(params)``. Forget the last line for one group and
    the optimizer is built without it: those parameters (a CRF, a head, a
    prompt) get gradients on every backward, are never stepped, and keep
    their initial values. Nothing raises; the model just trains worse.

    **Fix.** Hand the group over: ``parameters.append(params)`` before the
    optimizer is built, or name it in the constructor.

    **Stays quiet when** the collection is read anywhere after it is filled
    (handed to the optimizer, to a list, to ``add_param_group``, to a
    function, logged, returned), when it is not filled from a loop over
    ``parameters()`` / ``named_parameters()``, or when the optimizer is not
    built over collections filled the same way
    (``fixtures/parameters/ok_gl025_every_group_added.py``).

    **Bad**::

        parameters = []
        params = {"lr": args.lr, "params": []}
        for name, param in model.named_parameters():
            if "bert" in name:
                params["params"].append(param)
        parameters.append(params)

        params = {"lr": 5e-2, "params": []}
        for name, param in model.named_parameters():
            if "crf" in name or name.startswith("fc"):
                params["params"].append(param)

        optimizer = optim.AdamW(parameters)

    **Good**::

        params = {"lr": 5e-2, "params": []}
        for name, param in model.named_parameters():
            if "crf" in name or name.startswith("fc"):
                params["params"].append(param)
        parameters.append(params)

        optimizer = optim.AdamW(parameters)
    """

    code = "GL025"
    name = "parameter-group-never-added"
    summary = "a parameter group filled from `named_parameters()` never reaches the optimizer built after it"
    severity = Severity.ERROR
    fix = None  # where the group belongs (which list, which position) is the author's call
    needs = ((call_of("parameters"), "append"), (call_of("named_parameters"), "append"))

    def check(self, model: LoopModel) -> Iterator[Report]:
        for function in _functions_building_optimizers(model):
            statements = _statements_of(model, function)
            optimizers = [
                (position, node) for position, node in enumerate(statements)
                if type(node) is cst.Call and _builds_optimizer(model, node)
            ]
            if not optimizers:
                continue
            for group in _groups_filled(model, statements):
                if group.handed:
                    continue
                later = [(p, call) for p, call in optimizers if p > group.position]
                built_over = [call for _, call in later if _over_filled_collections(call, statements)]
                if not built_over:
                    continue
                optimizer = built_over[0]
                loop = group.loop
                yield Report(
                    group.binding,
                    f"`{group.name}` is filled with the parameters of `{model.code(loop.iter)}` in the loop at line "
                    f"{model.line(loop)}, but nothing hands it to `{model.code(optimizer.func)}(...)` at line "
                    f"{model.line(optimizer)} or to anything else: those parameters get gradients and are never "
                    f"stepped; add `{group.name}` to the groups the optimizer is given",
                )


@dataclass(frozen=True)
class _Group:
    """One binding of a collection name, filled with parameters, and whether it is read before its next binding."""

    name: str
    binding: cst.Assign
    position: int
    loop: cst.For
    parameter: cst.BaseExpression
    handed: bool


def _functions_building_optimizers(model: LoopModel) -> list[cst.FunctionDef]:
    """The functions that build an optimizer themselves, each once, in source order."""
    found: dict[int, cst.FunctionDef] = {}
    for node in model.file.every_node(model.module):
        if type(node) is cst.Call and _builds_optimizer(model, node):
            function = function_holding(model, node)
            if function is not None:
                found.setdefault(id(function), function)
    return list(found.values())


def _statements_of(model: LoopModel, function: cst.FunctionDef) -> list[cst.CSTNode]:
    """Every node of the function's body in source order, nested functions and classes left out."""
    found: list[cst.CSTNode] = []
    pending: list[cst.CSTNode] = [function.body]
    while pending:
        node = pending.pop()
        found.append(node)
        pending.extend(
            reversed([c for c in model.file.children(node) if type(c) not in (cst.FunctionDef, cst.ClassDef, cst.Lambda)])
        )
    return found


def _empty_collection(value: cst.BaseExpression) -> bool:
    """``[]``, ``list()``, or a dict literal of a parameter group (``{"lr": ..., "params": []}``)."""
    if type(value) is cst.List:
        return not value.elements
    if type(value) is cst.Call:
        return callee_name(value) == "list" and not value.args
    if type(value) is cst.Dict:
        keys = {
            element.key.evaluated_value for element in value.elements
            if type(element) is cst.DictElement and type(element.key) is cst.SimpleString
        }
        return bool(keys & {"params", "lr", "weight_decay"})
    return False


def _parameter_loops(statements: list[cst.CSTNode]) -> dict[str, cst.For]:
    """The names a ``for`` over ``x.parameters()`` / ``x.named_parameters()`` binds each parameter to."""
    loops: dict[str, cst.For] = {}
    for node in statements:
        if type(node) is not cst.For or type(node.iter) is not cst.Call:
            continue
        method = callee_name(node.iter)
        if method == "parameters" and type(node.target) is cst.Name:
            loops[node.target.value] = node
        elif method == "named_parameters" and type(node.target) is cst.Tuple and len(node.target.elements) == 2:
            second = node.target.elements[1].value
            if type(second) is cst.Name:
                loops[second.value] = node
    return loops


def _filled_name(call: cst.Call) -> str | None:
    """The collection ``g.append(x)`` or ``g["params"].append(x)`` fills."""
    if callee_name(call) not in _FILLING_METHODS:
        return None
    target = receiver(call)
    if type(target) is cst.Subscript:
        target = target.value
    return target.value if type(target) is cst.Name else None


def _bindings(statements: list[cst.CSTNode]) -> list[tuple[int, str, cst.Assign, cst.BaseExpression]]:
    """Every ``name = value`` in order, also each pair of ``a, b = x, y``: position, name, statement, value."""
    found = []
    for position, node in enumerate(statements):
        if type(node) is not cst.Assign or len(node.targets) != 1:
            continue
        target = node.targets[0].target
        if type(target) is cst.Name:
            found.append((position, target.value, node, node.value))
        elif type(target) in (cst.Tuple, cst.List) and type(node.value) in (cst.Tuple, cst.List) \
                and len(target.elements) == len(node.value.elements):
            for name, value in zip(target.elements, node.value.elements):
                if type(name.value) is cst.Name:
                    found.append((position, name.value.value, node, value.value))
    return found


def _fills(statements: list[cst.CSTNode], loops: dict[str, cst.For]) -> list[tuple[int, str, cst.Name]]:
    """``g.append(p)`` / ``g["params"].append(p)`` with ``p`` a loop's parameter: position, collection, parameter."""
    return [
        (position, _filled_name(node), node.args[0].value)
        for position, node in enumerate(statements)
        if type(node) is cst.Call and _filled_name(node) is not None and len(node.args) == 1
        and type(node.args[0].value) is cst.Name and node.args[0].value.value in loops
    ]


def _groups_filled(model: LoopModel, statements: list[cst.CSTNode]) -> Iterator[_Group]:
    loops = _parameter_loops(statements)
    fills = _fills(statements, loops)
    if not fills:
        return
    bindings = _bindings(statements)
    parents = model.parents or {}
    for position, name, binding, value in bindings:
        if not _empty_collection(value):
            continue
        end = _next_sibling_binding(binding, name, bindings, position, parents)
        inside = [parameter for at, filled, parameter in fills if filled == name and position < at < (end or len(statements))]
        if not inside:
            continue
        span = statements[_past(statements, position, parents):end]
        yield _Group(
            name, binding, position, loops[inside[0].value], inside[0],
            handed=_read_in(span, name, parents),
        )


def _past(statements: list[cst.CSTNode], position: int, parents: dict) -> int:
    """The position right after the subtree of the node at ``position`` (nodes are in pre-order)."""
    top = statements[position]
    after = position + 1
    while after < len(statements):
        node = parents.get(statements[after])
        while node is not None and node is not top:
            node = parents.get(node)
        if node is None:
            break
        after += 1
    return after


def _next_sibling_binding(binding, name, bindings, position, parents) -> int | None:
    """Where the name is bound again in the same block: the span of this binding ends there (a binding in a branch
    may not run, so the span goes on past it)."""
    block = parents.get(parents.get(binding))
    for later_position, later_name, later, _ in bindings:
        if later_position > position and later_name == name and later is not binding \
                and parents.get(parents.get(later)) is block:
            return later_position
    return None


def _read_in(span: list[cst.CSTNode], name: str, parents: dict) -> bool:
    """Whether the name is used in the span for anything but filling it (``g.append``, ``g["params"].append``,
    ``g["params"] = ...``): handed to a list or a call, returned, logged."""
    for node in span:
        if type(node) is not cst.Name or node.value != name:
            continue
        parent = parents.get(node)
        if type(parent) is cst.Attribute and parent.value is node and parent.attr.value in _FILLING_METHODS:
            continue
        if type(parent) is cst.Subscript and parent.value is node:
            above = parents.get(parent)
            if type(above) is cst.Attribute and above.attr.value in _FILLING_METHODS:
                continue
            if type(above) is cst.AssignTarget:
                continue
        if _bound_here(node, parents):
            continue
        return True
    return False


def _bound_here(name: cst.Name, parents: dict) -> bool:
    """Whether the name is a target being bound (``g = ...``, ``a, g = ...``, ``for g in ...``), not a read."""
    child, parent = name, parents.get(name)
    while type(parent) is cst.Element and type(parents.get(parent)) in (cst.Tuple, cst.List):
        child = parents.get(parent)
        parent = parents.get(child)
    return type(parent) is cst.AssignTarget or (type(parent) in (cst.For, cst.CompFor) and parent.target is child)


def _over_filled_collections(call: cst.Call, statements: list[cst.CSTNode]) -> bool:
    """Whether the optimizer is built over collections filled from parameter loops in this function: its arguments
    name one, or a name whose value, or whose ``append``, names one (``groups = [{"params": decay}]``,
    ``parameters.append(params)``)."""
    loops = _parameter_loops(statements)
    filled = {name for _, name, _ in _fills(statements, loops)}
    holding = set(filled)
    for _, name, _, value in _bindings(statements):
        if any(n.value in filled for n in _names(value)):
            holding.add(name)
    for node in statements:
        if type(node) is cst.Call and _filled_name(node) is not None \
                and any(n.value in filled for arg in node.args for n in _names(arg.value)):
            holding.add(_filled_name(node))
    return any(n.value in holding for arg in call.args for n in _names(arg.value))


def _names(node: cst.CSTNode) -> Iterator[cst.Name]:
    return (n for n in walk(node) if type(n) is cst.Name)
