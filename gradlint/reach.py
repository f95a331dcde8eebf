"""Which networks an optimizer holds, and which of them a backpropagated loss reaches.

An optimizer is built over networks' parameters: ``Adam(netD.parameters())``,
a list or set made of them (``params = list(a.parameters()) +
list(b.parameters())``), the left side of a set difference (``set(vae.parameters())
- set(vae.discr.parameters())`` holds ``vae`` without ``discr``), a part's own
``model.discr_parameters()`` (``model.discr``), or a framework's list by
position (Lightning's ``opt_g, opt_d = self.optimizers()`` from what
``configure_optimizers`` returns). Networks are named by their dotted path
without ``self.``; an element of a list of networks picked by a variable as
``q_nets[*]`` (every element in turn: ``q_opts.append(Adam(q_nets[i].parameters()))``
in a loop, and ``q_opts[i]`` stands for all that was appended), by a constant
as ``q_nets[0]``.

A loss reaches a network's parameters when the code that computes it, followed
back through the assignments of its function (and into the returns of a
function of the module it calls), calls the network (``netD(fake)``) or a
network that holds it (``self.vae(img)`` for ``vae.discr``), outside
``.detach()`` and ``torch.no_grad()``; a list read by the loss is followed into
what the function appended to it above the read (``q_values.append(q_nets[j](x))``),
and a call of any element of ``q_nets[*]`` reaches it. Unknown code is never read as reaching:
what this module answers makes a rule speak, so it answers only what the code
shows.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from gradlint import frameworks
from gradlint.module_index import Unpacked
from gradlint.queries import function_holding
from gradlint.syntax import (
    bool_literal, callee_name, children, comprehension_clauses, dotted_name, parameter_names, positional_args, receiver, walk,
)

if TYPE_CHECKING:
    from gradlint.model import Event, LoopModel

__all__ = ["Reach", "calls_computing_loss", "loss_reaching_call", "owners_of_construction", "parameter_owners", "reaching_call", "requires_grad_switched_off"]

_PART_PARAMETERS = re.compile(r"^(\w+)_parameters$")  # ``model.discr_parameters()``: the parameters of ``model.discr``
_CUTS_GRAPH = frozenset({"detach", "detach_", "item", "tolist", "numpy", "cpu_detach"})
_NO_GRAD = frozenset({"no_grad", "inference_mode"})
_SWITCH_WORDS = re.compile(r"requires_grad|freeze|toggle", re.IGNORECASE)


def _path(name: str) -> str:
    """``self.model.discr`` → ``model.discr``: how networks are compared across spellings."""
    parts = name.split(".")
    while len(parts) > 1 and parts[0] in ("self", "cls"):
        parts = parts[1:]
    return ".".join(parts)


def _network(node: cst.BaseExpression | None) -> str | None:
    """The network an expression names, as :func:`_path` spells it; an element of a collection of networks
    (``self.q_nets[i]``) as ``q_nets[*]`` when picked by a variable (built, stepped or called for every element in
    turn), as ``q_nets[0]`` when picked by a constant; None for anything else."""
    if type(node) is cst.Subscript:
        base = dotted_name(node.value)
        if base is None or len(node.slice) != 1 or type(node.slice[0].slice) is not cst.Index:
            return None
        key = node.slice[0].slice.value
        if type(key) is cst.Name:
            return f"{_path(base)}[*]"
        if type(key) in (cst.Integer, cst.SimpleString):
            return f"{_path(base)}[{key.value}]"
        return None
    name = dotted_name(node) if node is not None else None
    return _path(name) if name is not None else None


def _element_key(name: str) -> tuple[str, str | None]:
    """``q_nets[*]`` → ``("q_nets", "*")``; ``netD`` → ``("netD", None)``."""
    if name.endswith("]") and "[" in name:
        base, key = name[:-1].split("[", 1)
        return base, key
    return name, None


def _calls_network(called: str, owner: str) -> bool:
    """Whether a call of the network ``called`` runs the parameters of ``owner``: the same network (also by its last
    name, ``self.netD`` and ``netD``), or an element of a collection whose every element ``owner`` stands for."""
    if called == owner or called.rsplit(".", 1)[-1] == owner.rsplit(".", 1)[-1]:
        return True
    called_base, called_key = _element_key(called)
    owner_base, owner_key = _element_key(owner)
    return (
        owner_key == "*" and called_key is not None
        and (called_base == owner_base or called_base.rsplit(".", 1)[-1] == owner_base.rsplit(".", 1)[-1])
    )


def parameter_owners(model: "LoopModel", optimizer: str) -> frozenset[str]:
    """The networks whose parameters ``optimizer`` was visibly built over (dotted paths without ``self.``)."""
    if model.index is None:
        return frozenset()

    def read() -> frozenset[str]:
        found: set[str] = set()
        _owners_of_name(model, optimizer, found, set(), 0)
        return frozenset(found)

    return model.file.once((parameter_owners, optimizer), read)  # asked again for every step of the optimizer


def owners_of_construction(model: "LoopModel", call: cst.Call) -> frozenset[str]:
    """The networks an optimizer construction is handed the parameters of (``self`` for ``self.parameters()``)."""
    if model.index is None:
        return frozenset()
    found: set[str] = set()
    _owners_in(model, call, found, set(), 0)
    return frozenset(found)


def _owners_of_name(model: "LoopModel", name: str, found: set[str], seen: set[str], depth: int) -> None:
    if name in seen or depth > 4:
        return
    seen.add(name)
    base, key = _element_key(name)
    if key is not None and not key.isdigit() and key[:1] not in "'\"" and not model.index.assigned_anywhere(name):
        # ``self.q_optimizers[q_i]``, stepped for every element in turn: what any element of the list was built over
        _owners_of_name(model, base, found, seen, depth + 1)
        return
    for value in [*model.index.assigned_anywhere(name), *model.index.appended_anywhere(name)]:
        if type(value) is Unpacked:
            _owners_of_unpacked(model, value, found, seen, depth)
        elif isinstance(value, cst.BaseExpression):
            _owners_in(model, value, found, seen, depth)


def _owners_of_unpacked(model: "LoopModel", value: Unpacked, found: set[str], seen: set[str], depth: int) -> None:
    call = value.value
    if type(call) is not cst.Call:
        return
    name = callee_name(call)
    hook = frameworks.OPTIMIZERS_OF_HOOK.get(name or "")
    if hook is not None:
        for function in model.index.functions:
            if function.name.value != hook:
                continue
            for returned in model.index.returned(function):
                element = _element_at(_optimizer_list(returned), value.position)
                if element is not None:
                    _owners_in(model, element, found, seen, depth + 1, function)
        return
    if name in frameworks.RETURNS_GIVEN:
        args = [a for a in call.args if a.keyword is None]
        if value.position < len(args):
            _owners_in(model, args[value.position].value, found, seen, depth + 1)
        return
    # ``self.opt_vq, self.opt_disc = self.configure_optimizers()``: element ``position`` of what the module's own
    # function returns (``return opt_vq, opt_disc``), read in that function
    helper = model.index.resolve_function(call, function_holding(model, call))
    if helper is None or f"def {id(helper)}" in seen or depth >= 4:
        return
    seen.add(f"def {id(helper)}")
    for returned in model.index.returned(helper):
        element = _element_at(returned, value.position)
        if element is not None:
            _owners_in(model, element, found, seen, depth + 1, helper)


def _optimizer_list(returned: cst.BaseExpression) -> cst.BaseExpression:
    """``[opt_g, opt_d], [sched_g, sched_d]``: the optimizers are the first list."""
    if type(returned) is cst.Tuple and returned.elements and type(returned.elements[0].value) in (cst.List, cst.Tuple):
        return returned.elements[0].value
    return returned


def _element_at(container: cst.BaseExpression, position: int) -> cst.BaseExpression | None:
    if type(container) in (cst.List, cst.Tuple) and position < len(container.elements):
        element = container.elements[position]
        return None if type(element) is cst.StarredElement else element.value
    return None


def _owners_in(
    model: "LoopModel", value: cst.BaseExpression, found: set[str], seen: set[str], depth: int,
    function: cst.FunctionDef | None = None,
) -> None:
    """The owners of the parameters an expression (a constructor call, a parameter list) is made of."""
    stack: list[cst.CSTNode] = [value]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is cst.BinaryOperation and type(node.operator) is cst.Subtract:
            stack.append(node.left)  # a set difference holds its left side without its right
            continue
        if kind is cst.Call:
            method = callee_name(node)
            owner = _network(receiver(node))
            if owner is not None and method in ("parameters", "named_parameters"):
                found.add(owner)
                continue
            helper = model.index.resolve_function(node, function_holding(model, node))
            if helper is not None:  # ``self.min_parameters()``: what the module's method returns
                if f"def {id(helper)}" not in seen and depth < 4:
                    seen.add(f"def {id(helper)}")
                    for returned in model.index.returned(helper):
                        _owners_in(model, returned, found, seen, depth + 1, helper)
                continue
            part = _PART_PARAMETERS.match(method or "")
            if owner is not None and part is not None and not owner.endswith("]"):
                found.add(f"{owner}.{part.group(1)}")
                continue
            if method in frameworks.RETURNS_GIVEN_ALONE and len(node.args) == 1:
                stack.append(node.args[0].value)
                continue
            stack.extend(arg.value for arg in node.args)
            continue
        if kind in (cst.Name, cst.Attribute):
            name = dotted_name(node)
            if name is not None:
                local = model.index.assignments.get(function, {}).get(name) if function is not None else None
                if local:
                    key = f"{id(function)} {name}"  # ``x = x + [...]`` in a loop: each local followed once
                    if key not in seen and depth <= 8:
                        seen.add(key)
                        for each in local:
                            if isinstance(each, cst.BaseExpression):
                                _owners_in(model, each, found, seen, depth + 1, function)
                else:
                    _owners_of_name(model, name, found, seen, depth + 1)
            continue
        if kind in (cst.List, cst.Tuple, cst.Set):
            stack.extend(e.value for e in node.elements)
        elif kind in (cst.ListComp, cst.GeneratorExp, cst.SetComp):
            stack.extend(f.iter for f in comprehension_clauses(node.for_in))
        elif kind is cst.Dict:
            stack.extend(e.value for e in node.elements if type(e) is cst.DictElement)
        elif kind is cst.BinaryOperation:
            stack.extend((node.left, node.right))
        elif kind is cst.StarredElement:
            stack.append(node.value)


class Reach:
    """How a loss reaches a network: the call in its computation, and whether that call runs a network holding it."""

    def __init__(self, call: cst.Call, owner: str, through: str | None) -> None:
        self.call = call
        self.owner = owner  # the optimizer's network reached
        self.through = through  # the network called that holds it (``vae`` for ``vae.discr``), or None: called itself


def reaching_call(
    model: "LoopModel", backward: "Event", owners: frozenset[str], others: frozenset[str] = frozenset()
) -> Reach | None:
    """The first call in the computation of the backward's loss that runs one of ``owners`` (or a network holding one).

    ``others`` are the networks the loss is meant for. A call of a network that
    holds one of them runs that one for sure and the rest of the network only
    as its forward decides (``vae(img, return_discr_loss=True)`` may detach
    what ``vae`` generates): it does not count as reaching the rest.
    """
    if backward.loss is None:
        return None
    return loss_reaching_call(model, backward.loss, owners, others)


def loss_reaching_call(
    model: "LoopModel", loss: cst.BaseExpression, owners: frozenset[str], others: frozenset[str] = frozenset(),
    *, judged_by: frozenset[str] = frozenset(),
) -> Reach | None:
    """:func:`reaching_call` for a loss expression of the module (one term of a summed loss: ``lossG`` in
    ``loss = lossD + lossG``), followed back from where it is read. The inputs of calls of the ``judged_by`` networks
    are not followed: what reaches ``owners`` only there is one of those networks judging their output
    (``disc_fake = self.discriminator(decoded_images)``)."""
    if model.index is None or not owners:
        return None
    function = function_holding(model, loss)
    for call in _calls_computing(model, loss, function, helpers=True, judged_by=judged_by):
        called = _network(call.func)
        if called is None or _under_no_grad(model, call):
            continue
        called = _aliased_network(model, called, function_holding(model, call))
        if any(other.startswith(called + ".") for other in others):
            continue
        for owner in sorted(owners):
            if _calls_network(called, owner):
                return Reach(call, owner, None)
            if owner.startswith(called + "."):
                return Reach(call, owner, called)
    return None


def _aliased_network(model: "LoopModel", called: str, function: cst.FunctionDef | None) -> str:
    """The network a local name stands for when the function binds it only to one (``G, D = self.generator,
    self.discriminator`` or ``D = self.discriminator``, then ``D(fake)``); else the name itself."""
    if "." in called:
        return called
    aliases = set()
    for value in model.index.assignments.get(function, {}).get(called, []):  # ``G, D = a, b`` is indexed element by element
        if type(value) not in (cst.Name, cst.Attribute):
            return called
        aliases.add(dotted_name(value))
    return aliases.pop() if len(aliases) == 1 and None not in aliases else called


def calls_computing_loss(model: "LoopModel", loss: cst.BaseExpression) -> list[cst.Call]:
    """The calls a loss is computed from, as :func:`loss_reaching_call` follows them (back through its function's
    assignments and into the returns of the module's helpers it calls), less those under ``torch.no_grad()``."""
    if model.index is None:
        return []
    function = function_holding(model, loss)
    return [call for call in _calls_computing(model, loss, function, helpers=True) if not _under_no_grad(model, call)]


def _calls_computing(
    model: "LoopModel", loss: cst.BaseExpression, function: cst.FunctionDef | None, *, helpers: bool,
    judged_by: frozenset[str] = frozenset(),
) -> list[cst.Call]:
    """The calls whose results the loss is computed from, followed back through the function's assignments: for each
    name, the latest assignment above the line that reads it (all of them when none is above: set in an earlier pass
    of a loop); not into the arguments of calls of the ``judged_by`` networks."""
    table = model.index.assignments.get(function, {})
    filled = model.index.appended.get(function, {})
    pending: list[tuple[cst.BaseExpression, int]] = [(loss, model.line(loss))]
    followed: set[int] = set()
    calls: list[cst.Call] = []
    while pending:
        expression, line = pending.pop()
        for node in _graph_nodes(expression, judged_by):
            kind = type(node)
            if kind is cst.Call:
                calls.append(node)
                if helpers:
                    helper = model.index.resolve_function(node, function)
                    if helper is not None and helper is not function:
                        for returned in model.index.returned(helper):
                            calls.extend(_calls_computing(model, returned, helper, helpers=False))
            elif kind is cst.Name or kind is cst.Attribute:
                name = dotted_name(node)
                values = table.get(name) if name is not None else None
                appended = [v for v in filled.get(name, []) if model.line(v) < line] if name is not None else []
                for value in [*_latest_above(model, values or [], line), *appended]:
                    if id(value) in followed:
                        continue
                    followed.add(id(value))
                    if type(value) is not Unpacked:
                        pending.append((value, model.line(value)))
                    elif helpers and (element := _returned_element(model, value, function)) is not None:
                        calls.extend(element)
                    else:
                        pending.append((value.value, model.line(value.value)))
    return calls


def _latest_above(model: "LoopModel", values: list, line: int) -> list:
    """The assignments of a name that reach ``line``: the latest above it, with those in the other branches of the
    ``if`` that holds it (``if active: loss_G = stft + adv else: loss_G = stft``: either may run); all of them when
    none is above (set in an earlier pass of a loop)."""
    lines = [model.line(v.value if type(v) is Unpacked else v) for v in values]
    above = [n for n in lines if n < line]
    if not above:
        return list(values)
    latest = max(above)
    chosen = [v for v, n in zip(values, lines) if n == latest]
    branches = _enclosing_if(model, chosen[0].value if type(chosen[0]) is Unpacked else chosen[0])
    if branches is None:
        return chosen
    start, _, end, _ = model.position(branches)
    return [v for v, n in zip(values, lines) if n == latest or (start <= n <= end and n < line)]


def _enclosing_if(model: "LoopModel", node: cst.CSTNode) -> cst.If | None:
    """The nearest ``if`` (with an ``else``) around an assignment, within its function."""
    parents = model.parents or {}
    current = parents.get(node)
    while current is not None and type(current) not in (cst.FunctionDef, cst.For, cst.While):
        if type(current) is cst.If and current.orelse is not None:
            return current
        current = parents.get(current)
    return None


def _returned_element(model: "LoopModel", value: Unpacked, function: cst.FunctionDef | None) -> list[cst.Call] | None:
    """``audio, audio_gen = self._process_batch(batch)``: the calls computing element ``position`` of what a helper of
    the module returns as a tuple (``return audio, audio_gen``), when every return is a tuple; None otherwise."""
    if type(value.value) is not cst.Call:
        return None
    helper = model.index.resolve_function(value.value, function)
    returns = model.index.returned(helper) if helper is not None and helper is not function else []
    if not returns or any(type(r) is not cst.Tuple or len(r.elements) <= value.position for r in returns):
        return None
    calls: list[cst.Call] = []
    for returned in returns:
        calls.extend(_calls_computing(model, returned.elements[value.position].value, helper, helpers=False))
    return calls


def _graph_nodes(expression: cst.BaseExpression, judged_by: frozenset[str] = frozenset()) -> list[cst.CSTNode]:
    """The nodes of an expression through which gradients flow: not under ``.detach()``, ``.item()``, a lambda, nor
    in the arguments of a call of one of the ``judged_by`` networks."""
    nodes: list[cst.CSTNode] = []
    stack: list[cst.CSTNode] = [expression]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value in _CUTS_GRAPH:
            continue
        nodes.append(node)
        if kind is cst.Call:
            stack.append(node.func)
            called = _network(node.func) if judged_by else None
            if called is not None and any(_calls_network(called, judge) for judge in judged_by):
                continue
            stack.extend(arg.value for arg in node.args)  # not a keyword's name
        elif kind is cst.Attribute:
            stack.append(node.value)  # not the attribute's own name
        elif kind is not cst.Lambda:
            stack.extend(children(node))
    return nodes


def _under_no_grad(model: "LoopModel", node: cst.CSTNode) -> bool:
    """Whether ``node`` runs inside ``with torch.no_grad():`` (or ``inference_mode``) of its function."""
    parents = model.parents or {}
    current = parents.get(node)
    while current is not None and type(current) is not cst.FunctionDef:
        if type(current) is cst.With and any(
            type(item.item) is cst.Call and callee_name(item.item) in _NO_GRAD for item in current.items
        ):
            return True
        current = parents.get(current)
    return False


def requires_grad_switched_off(model: "LoopModel", owners: frozenset[str]) -> bool:
    """Whether the module may switch ``requires_grad`` off for one of ``owners`` at some point.

    Read widely, since a switch makes another loss's backward leave the network
    alone: ``netD.requires_grad_(False)``, ``p.requires_grad = flag`` in a loop
    over a network's parameters, a helper whose name says it
    (``set_requires_grad([netD], False)``, ``freeze(netD)``), a framework's
    toggle (Lightning's ``toggle_optimizer``). Only a switch that names
    another network, and never a value other than True, leaves the owners on.
    """
    if model.index is None:
        return False
    for node in model.file.every_node(model.module):
        kind = type(node)
        if kind is cst.Call:
            name = callee_name(node) or ""
            if name in frameworks.GRAD_TOGGLES:
                if _toggle_keeps(model, node, owners):
                    continue  # ``self.toggle_optimizer(opt_d)``: only the parameters of other optimizers go off
                return True
            if name == "requires_grad_":
                if node.args and bool_literal(node.args[0].value) is True or not node.args:
                    continue
                if _may_be_owner(model, receiver(node), node, owners):
                    return True
            elif _SWITCH_WORDS.search(name) and not _turns_on(node):
                subjects = [arg.value for arg in node.args if bool_literal(arg.value) is None]
                if not subjects or any(_may_be_owner(model, s, node, owners) for s in subjects):
                    return True
        elif kind is cst.Assign and any(
            type(t.target) is cst.Attribute and t.target.attr.value == "requires_grad" for t in node.targets
        ):
            if bool_literal(node.value) is True:
                continue
            target = next(t.target for t in node.targets if type(t.target) is cst.Attribute)
            if _may_be_owner(model, target.value, node, owners):
                return True
    return False


def _toggle_keeps(model: "LoopModel", call: cst.Call, owners: frozenset[str]) -> bool:
    """Whether a framework's toggle (Lightning's ``toggle_optimizer(opt)``, which switches ``requires_grad`` off for
    every parameter the optimizer it is handed does not hold) is handed an optimizer over ``owners``: it leaves them
    on."""
    args = positional_args(call)
    handed = dotted_name(args[0].value) if args else None
    return handed is not None and bool(parameter_owners(model, handed) & owners)


def _turns_on(call: cst.Call) -> bool:
    """``set_requires_grad(net, True)``, ``unfreeze(net)``: a switch that only turns gradients on."""
    name = (callee_name(call) or "").lower()
    if name.startswith(("unfreeze", "untoggle")):
        return True
    return any(bool_literal(arg.value) is True for arg in call.args) and not any(
        bool_literal(arg.value) is False for arg in call.args
    )


def _may_be_owner(
    model: "LoopModel", subject: cst.BaseExpression | None, at: cst.CSTNode, owners: frozenset[str], depth: int = 0
) -> bool:
    """Whether a switched object may be one of the networks: it is one, or holds one, or it cannot be told. A loop
    variable over something's parameters is judged by that, a list by its elements, a function's parameter by what
    the module's calls of the function hand it."""
    if depth > 3:
        return True
    if type(subject) in (cst.List, cst.Tuple):
        return any(
            type(e) is cst.StarredElement or _may_be_owner(model, e.value, at, owners, depth + 1) for e in subject.elements
        )
    name = dotted_name(subject)
    if name is None:
        return True
    root = name.split(".")[0]
    loop = _loop_binding(model, at, root)
    if loop is not None:
        return _may_be_owner(model, loop, loop, owners, depth + 1)
    switched = _path(name)
    if any(
        switched == owner or owner.startswith(switched + ".") or switched.rsplit(".", 1)[-1] == owner.rsplit(".", 1)[-1]
        for owner in owners
    ):
        return True  # a part of the network switched off (``netD.backbone``) leaves the rest of it on
    function = function_holding(model, at)
    return function is not None and root in parameter_names(function) and _handed_owner(model, function, root, owners, depth + 1)


def _handed_owner(
    model: "LoopModel", function: cst.FunctionDef, parameter: str, owners: frozenset[str], depth: int
) -> bool:
    """Whether a call of the module hands ``function`` one of the networks as ``parameter`` (or something that cannot
    be told). With no call in the module, the parameter is the network as the function names it: the loop judged
    here does not run the function."""
    position = parameter_names(function).index(parameter)
    if function.params.params and function.params.params[0].name.value in ("self", "cls"):
        position -= 1  # a method's calls do not spell its receiver
    for call in _calls_by_name(model).get(function.name.value, ()):
        handed = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == parameter), None)
        positional = [a.value for a in call.args if a.keyword is None]
        if handed is None and 0 <= position < len(positional):
            handed = positional[position]
        if handed is None or _may_be_owner(model, handed, call, owners, depth):
            return True
    return False


def _calls_by_name(model: "LoopModel") -> dict[str, list[cst.Call]]:
    """Every call of the module by the name it calls, read once per module (asked for each switched parameter)."""

    def read() -> dict[str, list[cst.Call]]:
        table: dict[str, list[cst.Call]] = {}
        for node in model.file.every_node(model.module):
            if type(node) is cst.Call:
                name = callee_name(node)
                if name is not None:
                    table.setdefault(name, []).append(node)
        return table

    return model.file.once((_calls_by_name,), read)


def _loop_binding(model: "LoopModel", at: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """What ``name`` iterates over when an enclosing ``for`` binds it (``for p in netD.parameters():`` → the call)."""
    parents = model.parents or {}
    current = parents.get(at)
    while current is not None and type(current) is not cst.FunctionDef:
        if type(current) is cst.For and any(type(n) is cst.Name and n.value == name for n in walk(current.target)):
            iterated = current.iter
            if type(iterated) is cst.Call and type(iterated.func) is cst.Attribute:
                return iterated.func.value  # ``netD.parameters()`` → ``netD``
            return iterated
        current = parents.get(current)
    return None
