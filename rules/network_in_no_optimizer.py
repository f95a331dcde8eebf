"""Whether every network a backpropagated loss runs through is held by an optimizer (GL027)."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from gradlint.events import EventKind
from gradlint.findings import Severity
from gradlint.model import LoopModel
from gradlint.queries import function_holding, steps_with_loops
from gradlint.reach import calls_computing_loss, owners_of_construction
from gradlint.rule import BACKWARD, Report, Rule, call_of
from gradlint.rules.parameter_groups import _optimizer_constructions
from gradlint.rules.parameters import FREEZES, _layer_built
from gradlint.syntax import callee_name, comprehension_clauses, dotted_name, receiver

# What may be done to a network besides calling it that neither trains it elsewhere nor says it is not meant to train.
_PLAIN_USES = frozenset({"to", "cuda", "cpu", "train", "half", "float", "double", "bfloat16", "forward", "zero_grad", "state_dict"})
# Calls that only gather parameters into one collection: what they are handed is what the optimizer holds.
_GATHERING = frozenset({"filter", "list", "tuple", "set", "chain", "sorted"})
# Moves that hand back the network they are called on (``Head(...).to(device)``).
_RETURNS_ITSELF = frozenset({"to", "cuda", "cpu", "half", "float", "double", "bfloat16", "train"})


class NetworkInNoOptimizer(Rule):
    """The loss runs through a network built beside the model, and no optimizer holds its parameters.

    **Why it matters.** A classification head, a projector, or a loss module
    with learnable weights (class proxies, an adaptive softmax, uncertainty
    weights) is often built next to the model rather than inside it:
    ``head = ClfHead(...)`` beside ``model = Transformer(...)``. Build the
    optimizer over ``model.parameters()`` alone and the head gets gradients
    on every backward that no optimizer applies: it keeps its random initial
    weights while the model is trained against it, and without a clear its
    gradients pile up for the whole run. Nothing raises.

    **Fix.** Hand the optimizer the network's parameters too:
    ``Adam(list(model.parameters()) + list(head.parameters()))``, or a
    parameter group of its own.

    **Stays quiet when** any optimizer of the module is given anything but
    networks' ``parameters()`` it can read (a list filled elsewhere, a
    helper's result: it may hold the network), an optimizer the loop steps
    is not built in the module, or the network is used in any way other than
    being called and moved (handed to a call, stored, its ``parameters()``
    read, put in ``eval()`` mode, loaded from a checkpoint); when its
    ``requires_grad`` may be switched off or it is called under
    ``torch.no_grad()`` or detached; in a test function (``def test_...``:
    a fixed layer feeding the part under test); when it is part of a network an
    optimizer holds (``model.head``), or the class builds its optimizers over
    ``self.parameters()`` and the network is an attribute of ``self``
    (``fixtures/parameters/ok_gl027_head_in_optimizer.py``).

    **Bad**::

        model = Transformer(cfg)
        head = ClfHead(cfg.hidden, n_classes)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        for x, y in loader:
            loss = F.cross_entropy(head(model(x)), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    **Good**::

        optimizer = torch.optim.Adam(
            list(model.parameters()) + list(head.parameters()), lr=1e-4
        )
    """

    code = "GL027"
    name = "network-in-no-optimizer"
    summary = "the loss runs through a network built beside the model that no optimizer holds: it never trains"
    severity = Severity.ERROR
    fix = None  # which optimizer or group should hold the network is the author's call
    needs = ((BACKWARD, call_of("parameters")),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        if model.index is None:
            return
        constructions = _optimizer_constructions(model)
        if not constructions or not all(holds_only_named_networks(model, c) for c in constructions):
            return
        held = {id(c): owners_of_construction(model, c) for c in constructions}
        owners: set[str] = set().union(*held.values())
        reported: set[str] = set()
        for root in model.roots:
            steps = list(steps_with_loops(root))
            for backward in root.events_of(EventKind.BACKWARD):
                if not backward.loops or backward.framework is not None or backward.loss is None or backward.upstream:
                    continue
                if _in_a_test(model, backward.node):
                    continue  # a test feeds the part under test through fixed layers on purpose
                stepped = {
                    id(found): found for step, loop in steps if backward.inside(loop)
                    for found in [construction_of(model, step, constructions)]
                }
                built = list(stepped.values())
                if len(built) != 1 or built[0] is None:
                    continue  # no step, a step of an optimizer built elsewhere, or several to choose from
                for call in calls_computing_loss(model, backward.loss):
                    found = _untrained_network(model, call, owners)
                    if found is None or found[0] in reported:
                        continue
                    network, layer, construction = found
                    reported.add(network)
                    optimizer = built[0]
                    yield Report(
                        optimizer,
                        f"the loss backpropagated at line {model.line(backward.node)} runs through `{network}` "
                        f"(`{layer}`, built at line {model.line(construction)}, called at line {model.line(call)}), "
                        f"but no optimizer of the module holds it: `{model.code(optimizer.func)}(...)` here is built "
                        f"over {_owners_text(held[id(optimizer)])} only. `{network}` gets "
                        f"gradients and never trains; add `{network}.parameters()` to the optimizer",
                        event=backward,
                    )


def _in_a_test(model: LoopModel, node: cst.CSTNode) -> bool:
    """Whether ``node`` is written in a test function (``def test_...``)."""
    function = function_holding(model, node)
    return function is not None and function.name.value.startswith("test")


def _owners_text(owners: frozenset[str]) -> str:
    named = [f"`{o}`" for o in sorted(owners)]
    return " and ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named) or "other parameters"


def construction_of(model: LoopModel, step, constructions: list[cst.Call]) -> cst.Call | None:
    """The one optimizer construction a step's optimizer is bound to (a local name in the function that steps it),
    or None."""
    if step.target is None:
        return None
    if "." in step.target:
        values = model.index.assigned_anywhere(step.target)
    else:
        values = model.index.assignments.get(function_holding(model, step.node), {}).get(step.target, [])
    built = {id(c) for c in constructions}
    if len(values) == 1 and type(values[0]) is cst.Call and id(values[0]) in built:
        return values[0]
    return None


def holds_only_named_networks(model: LoopModel, construction: cst.Call) -> bool:
    """Whether an optimizer is given nothing but networks' ``parameters()``, gathered in ways that can be read to
    the end (lists, sums, filters, comprehensions, parameter groups, a name bound to those in the same function)."""
    given = next((a.value for a in construction.args if a.keyword is None or a.keyword.value == "params"), None)
    if given is None:
        return False
    function = function_holding(model, construction)
    return _readable(model, given, function, 0)


def _readable(model: LoopModel, node: cst.BaseExpression, function: cst.FunctionDef | None, depth: int) -> bool:
    if depth > 4:
        return False
    kind = type(node)
    if kind is cst.Call:
        method = callee_name(node)
        if method in ("parameters", "named_parameters") and type(node.func) is cst.Attribute:
            return dotted_name(receiver(node)) is not None
        if method in _GATHERING:
            handed = [a.value for a in node.args if a.keyword is None]
            if method == "filter" and handed:
                handed = handed[1:]
            return bool(handed) and all(_readable(model, h, function, depth + 1) for h in handed)
        return False
    if kind in (cst.List, cst.Tuple):
        return bool(node.elements) and all(
            type(e) is cst.Element and _readable(model, e.value, function, depth + 1) for e in node.elements
        )
    if kind in (cst.ListComp, cst.GeneratorExp):
        return all(_readable(model, f.iter, function, depth + 1) for f in comprehension_clauses(node.for_in))
    if kind is cst.Dict:
        values = [
            e.value for e in node.elements
            if type(e) is cst.DictElement and type(e.key) is cst.SimpleString and e.key.evaluated_value == "params"
        ]
        return len(values) == 1 and _readable(model, values[0], function, depth + 1)
    if kind is cst.BinaryOperation and type(node.operator) is cst.Add:
        return _readable(model, node.left, function, depth + 1) and _readable(model, node.right, function, depth + 1)
    if kind is cst.Name:
        if model.index.appended.get(function, {}).get(node.value):
            return False
        values = model.index.assignments.get(function, {}).get(node.value, [])
        return bool(values) and all(
            isinstance(v, cst.BaseExpression) and _readable(model, v, function, depth + 1) for v in values
        )
    return False


def _untrained_network(
    model: LoopModel, call: cst.Call, owners: set[str]
) -> tuple[str, str, cst.Call] | None:
    """``(network, layer, construction)`` when ``call`` runs a network the module builds with learnable parameters,
    holds in no optimizer, and uses in no other way that could train it or say it is not meant to train."""
    spelled = dotted_name(call.func)
    if spelled is None or spelled.split(".")[0] in ("self", "cls") and "self" in owners:
        return None
    path = spelled.removeprefix("self.")
    if any(related(path, owner) for owner in owners):
        return None
    function = function_holding(model, call)
    values = model.index.assignments.get(function, {}).get(spelled) if "." not in spelled else None
    if values is None and function is not None and "." not in spelled:
        return None  # a parameter of the function: built by its caller
    values = values if values is not None else model.index.assigned_anywhere(spelled)
    if len(values) != 1 or type(values[0]) is not cst.Call:
        return None
    construction = unmoved(values[0])
    layer = _layer_built(model, construction, function_holding(model, construction))
    if layer is None or freezes_itself(model, construction):
        return None
    if not _mentions_only(model, spelled, _PLAIN_USES):
        return None
    return spelled, layer, construction


def related(path: str, owner: str) -> bool:
    """Whether a network is an optimizer's network, a part of it, or holds it (by path, or by last name)."""
    return (
        path == owner or path.startswith(owner + ".") or owner.startswith(path + ".")
        or path.rsplit(".", 1)[-1] == owner.rsplit(".", 1)[-1]
    )


def unmoved(value: cst.Call) -> cst.Call:
    """``Head(...)`` for ``Head(...).to(device)``."""
    while type(value.func) is cst.Attribute and value.func.attr.value in _RETURNS_ITSELF and type(value.func.value) is cst.Call:
        value = value.func.value
    return value


def freezes_itself(model: LoopModel, construction: cst.Call) -> bool:
    """Whether the class built switches its own gradients off or loads weights (a frozen feature extractor)."""
    if type(construction.func) is not cst.Name:
        return False
    methods = model.index.class_methods.get(construction.func.value, {})
    return any(FREEZES.search(model.code(method)) or "load_state_dict" in model.code(method) for method in methods.values())


def only_called_moved_and_gathered(model: LoopModel, spelled: str) -> bool:
    """Whether every other mention of the network calls it, moves it or reads its parameters (``head(x)``,
    ``head.to(device)``, ``Adam(head.parameters())``): it is handed to nothing that could hold it."""
    return _mentions_only(model, spelled, _PLAIN_USES | {"parameters", "named_parameters"})


def _mentions_only(model: LoopModel, spelled: str, uses: frozenset[str]) -> bool:
    """Whether every other mention of the network calls it or uses one of its attributes in ``uses`` (with
    :data:`_PLAIN_USES`: ``head(x)``, ``head.to(device)``)."""
    parents = model.parents or {}
    for node in model.file.every_node(model.module):
        if type(node) not in (cst.Name, cst.Attribute) or dotted_name(node) != spelled:
            continue
        parent = parents.get(node)
        if type(parent) is cst.Attribute and parent.attr is node:
            continue  # the name inside ``self.head``: judged as the attribute
        if type(parent) is cst.AssignTarget:
            continue
        if type(parent) is cst.Call and parent.func is node:
            continue
        if type(parent) is cst.Attribute and parent.value is node and parent.attr.value in uses:
            continue
        return False
    return True
