"""Whether every parameter group a function fills reaches the optimizer it builds, and holds each parameter once (GL025, GL026)."""

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
        constructions = _optimizer_constructions(model)
        for function in _functions_building_optimizers(model, constructions):
            statements = list(model.file.walk(function.body))
            built = {id(call) for call in constructions}
            optimizers = [(position, node) for position, node in enumerate(statements) if id(node) in built]
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


def _optimizer_constructions(model: LoopModel) -> list[cst.Call]:
    """Every call of the module that builds an optimizer: read once per module, for GL025 and GL026."""

    def read() -> list[cst.Call]:
        return [
            node for node in model.file.every_node(model.module)
            if type(node) is cst.Call and _builds_optimizer(model, node)
        ]

    return model.file.once((_optimizer_constructions,), read)


def _functions_building_optimizers(model: LoopModel, constructions: list[cst.Call]) -> list[cst.FunctionDef]:
    """The functions that build an optimizer themselves, each once."""
    found: dict[int, cst.FunctionDef] = {}
    for call in constructions:
        function = function_holding(model, call)
        if function is not None:
            found.setdefault(id(function), function)
    return list(found.values())


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


class ParametersRepeatedInGroup(Rule):
    """A parameter group is filled by walking ``modules()`` and, for each, its ``parameters()``: every parameter is in it once per module that holds it.

    **Why it matters.** ``model.modules()`` yields the model, every
    container and every layer; ``m.parameters()`` yields the parameters of
    ``m`` *and of everything under it*. Nesting the two hands the optimizer a
    ResNet bottleneck's weight three or four times (the stage, the block, the
    layer). PyTorch only warns ("optimizer contains a parameter group with
    duplicate parameters"), then applies the update to that tensor once per
    copy: those layers train at a multiple of the learning rate, the deeper
    the more, and momentum is updated that many times per step.

    **Fix.** Walk the parameters once: ``yield from b[i].parameters()``, or
    ``m.parameters(recurse=False)`` inside the walk over ``modules()``.

    **Stays quiet when** the inner walk passes ``recurse=False``, the module
    is first narrowed by an ``isinstance`` test (leaf layers such as
    ``nn.Conv2d`` hold no submodules), or what the walk collects is not
    handed to an optimizer or a parameter group in the module
    (``fixtures/parameters/ok_gl026_parameters_walked_once.py``).

    **Bad**::

        def get_1x_lr_params(self):
            for block in [self.conv1, self.layer1, self.layer2]:
                for module in block.modules():
                    for p in module.parameters():
                        if p.requires_grad:
                            yield p

        def optim_parameters(self, lr):
            return [{"params": self.get_1x_lr_params(), "lr": lr}]

    **Good**::

        def get_1x_lr_params(self):
            for block in [self.conv1, self.layer1, self.layer2]:
                for p in block.parameters():
                    if p.requires_grad:
                        yield p
    """

    code = "GL026"
    name = "parameters-repeated-in-group"
    summary = "a parameter group walks `modules()` and each one's `parameters()`: nested parameters repeat"
    severity = Severity.ERROR
    fix = None  # whether to walk parameters() once or pass recurse=False is the author's call
    needs = ((call_of("modules"), call_of("parameters")),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        handed = _handed_to_optimizers(model)
        for node in model.file.every_node(model.module):
            if type(node) is not cst.For or type(node.iter) is not cst.Call:
                continue
            walked = _modules_walk_target(node)
            if walked is None:
                continue
            for inner in walk(node.body):
                if type(inner) is not cst.For or type(inner.iter) is not cst.Call or type(inner.target) is not cst.Name:
                    continue
                if callee_name(inner.iter) != "parameters" or any(a.keyword is not None for a in inner.iter.args):
                    continue
                owner = receiver(inner.iter)
                if type(owner) is not cst.Name or owner.value != walked or _narrowed_by_isinstance(model, inner, node, walked):
                    continue
                function = function_holding(model, node)
                if function is None or not _collected_for_an_optimizer(model, function, inner, handed):
                    continue
                yield Report(
                    inner.iter,
                    f"`{model.code(inner.iter)}` runs for every module `{model.code(node.iter)}` yields, and each "
                    f"module's parameters include those of the modules under it: every parameter reaches the "
                    f"optimizer once per module that holds it, and is updated that many times per step; walk "
                    f"`parameters()` once, or pass `recurse=False`",
                )


def _modules_walk_target(loop: cst.For) -> str | None:
    """``m`` of ``for m in x.modules():`` or ``for name, m in x.named_modules():``."""
    method = callee_name(loop.iter)
    if method == "modules" and type(loop.target) is cst.Name:
        return loop.target.value
    if method == "named_modules" and type(loop.target) is cst.Tuple and len(loop.target.elements) == 2:
        second = loop.target.elements[1].value
        return second.value if type(second) is cst.Name else None
    return None


def _narrowed_by_isinstance(model: LoopModel, inner: cst.For, outer: cst.For, walked: str) -> bool:
    """Whether an ``isinstance(m, ...)`` test on the walked module guards the inner walk (or skips others with
    ``continue``) inside the outer loop."""
    for node in walk(outer.body):
        if type(node) is cst.Call and callee_name(node) == "isinstance" and node.args:
            first = node.args[0].value
            if type(first) is cst.Name and first.value == walked:
                return True
    return False


def _collected_for_an_optimizer(model: LoopModel, function: cst.FunctionDef, inner: cst.For, handed: set[str]) -> bool:
    """Whether the inner loop's parameter is yielded by a function the module hands to an optimizer or a parameter
    group, or appended to a list the function hands to one."""
    parameter = inner.target.value
    for node in walk(inner.body):
        if type(node) is cst.Yield and type(node.value) is cst.Name and node.value.value == parameter:
            return function.name.value in handed
        if type(node) is cst.Call and callee_name(node) in _FILLING_METHODS and len(node.args) == 1:
            argument = node.args[0].value
            filled = _filled_name(node)
            if type(argument) is cst.Name and argument.value == parameter and filled is not None:
                return filled in handed or function.name.value in handed
    return False


def _handed_to_optimizers(model: LoopModel) -> set[str]:
    """The names read in an optimizer construction's arguments or in a ``"params"`` entry of a dict, module-wide (a
    function called there, ``self.get_1x_lr_params()``, counts by its last name)."""
    values: list[cst.CSTNode] = [a.value for call in _optimizer_constructions(model) for a in call.args]
    values += [
        node.value for node in model.file.every_node(model.module)
        if type(node) is cst.DictElement and type(node.key) is cst.SimpleString and node.key.evaluated_value == "params"
    ]
    return {inner.value for value in values for inner in walk(value) if type(inner) is cst.Name}
