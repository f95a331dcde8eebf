"""Whether a network an optimizer was built over is replaced by a new one before the optimizer steps (GL028)."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from gradlint import frameworks
from gradlint.findings import Severity
from gradlint.model import LoopModel
from gradlint.queries import function_holding
from gradlint.reach import owners_of_construction
from gradlint.rule import Report, Rule, call_of
from gradlint.rules.parameter_groups import _optimizer_constructions
from gradlint.rules.parameters import _layer_built
from gradlint.syntax import callee_name, dotted_name, positional_args, receiver

# Calls whose value is a network with parameters of its own: a deep copy, a network read back from a file.
_COPIES = frozenset({"deepcopy", "load", "from_pretrained"})


class OptimizerOverReplacedNetwork(Rule):
    """A network is replaced by a new one after an optimizer was built over its parameters, and that optimizer steps.

    **Why it matters.** An optimizer holds the parameter tensors it was
    given, not the name they were reached by. Rebind the name to a new
    network (``deepcopy`` of an untrained copy to start over, a network read
    back with ``torch.load`` or ``from_pretrained``) and the loss
    backpropagates through the new network's parameters, which no optimizer
    holds, while ``optimizer.step()`` updates the discarded ones, which get
    no gradients. The new network never trains. Nothing raises.

    The same when a library's base class builds the optimizer over
    ``self.parameters()`` in a method a subclass overrides (Stable-Baselines3's
    ``ActorCriticPolicy._build``, run by its ``__init__``; declared in
    ``gradlint/frameworks/``), and the override calls ``super()._build(...)``
    and then assigns a new layer with parameters, or an ``nn.Parameter``, to
    ``self`` without building the optimizer again
    (``fixtures/frameworks/gl028_layers_built_after_super_build_stable_baselines3.py``).
    sb3-contrib's maskable policies do the same; its recurrent policy builds
    the optimizer again at the end of its ``__init__``, so there only layers
    added after ``super().__init__(...)`` miss it
    (``fixtures/frameworks/gl028_layers_built_after_super_init_sb3_contrib.py``).

    **Fix.** Build the optimizer after the replacement, over the new
    network's ``parameters()`` (or load the weights in place with
    ``load_state_dict``).

    **Stays quiet when** the new value shares the parameters (``.to()``,
    ``torch.compile``, a wrapper handed the network such as
    ``DistributedDataParallel(model)``, ``model.module``), is made by a
    function whose result is unknown (``get_model(cfg)``) or built anew from
    a class (``Net(cfg)``: a construction may build anything under the name,
    a grad scaler as well as a network), the optimizer is
    built again or assigned between the replacement and its step, the
    replacement and the step sit in two branches of one ``if``, or the step
    comes before the replacement in the function
    (``fixtures/parameters/ok_gl028_network_shared_or_optimizer_rebuilt.py``).

    **Bad**::

        optimizer = torch.optim.Adam(self.posterior.net.parameters())
        if retrain_from_scratch:
            self.posterior = deepcopy(self.untrained_posterior)
        for x in loader:
            loss = -self.posterior.net.log_prob(x).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    **Good**::

        if retrain_from_scratch:
            self.posterior = deepcopy(self.untrained_posterior)
        optimizer = torch.optim.Adam(self.posterior.net.parameters())
    """

    code = "GL028"
    name = "optimizer-over-replaced-network"
    summary = "a network is replaced after the optimizer was built over its parameters: the new one never trains"
    severity = Severity.ERROR
    fix = None  # where the optimizer is built again (and what becomes of its state) is the author's call
    needs = (
        (call_of("parameters"), "deepcopy"), (call_of("parameters"), "torch.load"), (call_of("parameters"), "from_pretrained"),
        *(("super(", *built.tokens) for built in frameworks.OPTIMIZER_BUILT_BY_SUPER),
    )

    def check(self, model: LoopModel) -> Iterator[Report]:
        if model.index is None:
            return
        yield from _layers_built_after_super(model)
        for construction in _optimizer_constructions(model):
            function = function_holding(model, construction)
            optimizer = _assigned_to(model, construction)
            if function is None or optimizer is None:
                continue
            owners = owners_of_construction(model, construction)
            for assign, network in _replacements(model, function, construction, owners):
                step = _later_step(model, function, optimizer, assign)
                if step is None:
                    continue
                yield Report(
                    assign,
                    f"`{network}` is replaced by a new network here, after `{optimizer}` was built over "
                    f"its parameters at line {model.line(construction)}: the loss then runs through the new "
                    f"network, whose parameters no optimizer holds, and `{optimizer}`'s step at line "
                    f"{model.line(step)} updates the discarded ones. Build `{optimizer}` after the replacement",
                )
                break


def _layers_built_after_super(model: LoopModel) -> Iterator[Report]:
    """In a subclass of a library's base whose method builds the optimizer over ``self.parameters()``, an override
    of that method that calls ``super().method(...)`` and then assigns a new layer or parameter to ``self``
    without building the optimizer again (Stable-Baselines3's ``_build``)."""
    for cls in (n for n in model.module.body if type(n) is cst.ClassDef):  # classes of the module's top level
        built = _built_by_base(model, cls)
        if built is None:
            continue
        for method in (s for s in cls.body.body if type(s) is cst.FunctionDef and s.name.value in built.methods):
            statements = list(method.body.body) if type(method.body) is cst.IndentedBlock else []
            start = next((i for i, st in enumerate(statements) if _calls_super(st, method.name.value)), None)
            if start is None:
                continue
            later = statements[start + 1:]
            if any(_assigns(model, st, built.optimizer) for st in later):
                continue  # the override builds the optimizer again, over what it added
            layer = next((found for st in later for found in [_new_layer(model, st)] if found is not None), None)
            if layer is None:
                continue
            assign, target = layer
            yield Report(
                assign,
                f"`{target}` is built here, after `super().{method.name.value}(...)` built `{built.optimizer}` over "
                f"`self.parameters()`: its parameters are in no optimizer, get gradients and never train. Build the "
                f"optimizer again at the end of `{method.name.value}` (`{built.rebuild}`)",
            )


def _built_by_base(model: LoopModel, cls: cst.ClassDef):
    """The declaration of a library base class of ``cls`` (directly) whose methods build the optimizer, or None."""
    for base in cls.bases:
        qualified = model.index.qualified_names(base.value)
        for built in frameworks.OPTIMIZER_BUILT_BY_SUPER:
            if qualified & built.bases:
                return built
    return None


def _calls_super(statement: cst.CSTNode, method: str) -> bool:
    """``super().method(...)`` or ``super(Cls, self).method(...)`` as a statement."""
    if type(statement) is not cst.SimpleStatementLine:
        return False
    for small in statement.body:
        call = small.value if type(small) is cst.Expr else None
        if (
            type(call) is cst.Call and type(call.func) is cst.Attribute and call.func.attr.value == method
            and type(call.func.value) is cst.Call and callee_name(call.func.value) == "super"
        ):
            return True
    return False


def _assigns(model: LoopModel, statement: cst.CSTNode, name: str) -> bool:
    return any(
        type(node) is cst.Assign and any(dotted_name(t.target) == name for t in node.targets)
        for node in model.file.walk(statement)
    )


def _new_layer(model: LoopModel, statement: cst.CSTNode) -> tuple[cst.Assign, str] | None:
    """``self.action_net = nn.Linear(...)``, ``self.log_std = nn.Parameter(...)``: a top-level assignment to an
    attribute of ``self`` of a layer that holds parameters, or of a parameter."""
    if type(statement) is not cst.SimpleStatementLine:
        return None
    for small in statement.body:
        if type(small) is not cst.Assign or len(small.targets) != 1 or type(small.value) is not cst.Call:
            continue
        target = dotted_name(small.targets[0].target)
        if target is None or not target.startswith("self.") or target.count(".") != 1:
            continue
        qualified = model.index.qualified_names(small.value.func)
        if "torch.nn.Parameter" in qualified or "torch.nn.parameter.Parameter" in qualified or _layer_built(model, small.value) is not None:
            return small, target  # a layer with parameters (not ``nn.Dropout``), or a parameter
    return None


def _assigned_to(model: LoopModel, construction: cst.Call) -> str | None:
    """The name an optimizer construction is assigned to (``optimizer = Adam(...)``), or None."""
    parent = (model.parents or {}).get(construction)
    if type(parent) is cst.Assign and len(parent.targets) == 1:
        return dotted_name(parent.targets[0].target)
    return None


def _replacements(
    model: LoopModel, function: cst.FunctionDef, construction: cst.Call, owners: frozenset[str]
) -> Iterator[tuple[cst.Assign, str]]:
    """The assignments after the construction, in its function, that rebind a network the optimizer holds (or an
    object holding it: ``self.posterior`` of ``self.posterior.net``) to a new network."""
    start: int | None = None  # positions are resolved only for the few assignments that qualify
    for node in model.file.walk(function.body):
        if type(node) is not cst.Assign or len(node.targets) != 1:
            continue
        target = dotted_name(node.targets[0].target)
        if target is None or target == "self":
            continue
        held = target.removeprefix("self.")  # the owners are named without ``self.``
        if not any(owner == held or owner.startswith(held + ".") for owner in owners) or not _new_network(node.value, target):
            continue
        start = model.line(construction) if start is None else start
        if model.line(node) > start:
            yield node, target


def _new_network(value: cst.BaseExpression, target: str) -> bool:
    """``deepcopy(x)``, ``torch.load(path)``, ``Net.from_pretrained(...)``: a copy or a loaded network. A class built
    anew (``Net(cfg)``) is not read as one: a construction may build anything under the name (a grad scaler, a
    wrapper), and the rule's prefilter tokens are the copies'."""
    if type(value) is not cst.Call:
        return False
    name = callee_name(value) or ""
    return name in _COPIES and (name != "load" or _loads_a_file(value))


def _loads_a_file(call: cst.Call) -> bool:
    """``torch.load(path)``: a module's ``load`` (``torch``), not ``json.load`` or ``self.load(...)``."""
    owner = dotted_name(receiver(call)) if type(call.func) is cst.Attribute else None
    return owner == "torch" and bool(positional_args(call))


def _later_step(model: LoopModel, function: cst.FunctionDef, optimizer: str, replacement: cst.Assign) -> cst.Call | None:
    """The first step of ``optimizer`` after the replacement in ``function`` (``optimizer.step()`` or
    ``scaler.step(optimizer)``), when nothing assigns ``optimizer`` between them and no ``if`` puts the two in
    different branches."""
    after = model.line(replacement)
    rebound: list[int] = []
    steps: list[cst.Call] = []
    for node in model.file.walk(function.body):
        if type(node) is cst.Assign and any(dotted_name(t.target) == optimizer for t in node.targets):
            rebound.append(model.line(node))
        elif type(node) is cst.Call and callee_name(node) == "step" and model.line(node) > after and _steps(node, optimizer):
            steps.append(node)
    for step in sorted(steps, key=model.line):
        if any(after < line <= model.line(step) for line in rebound):
            return None
        if not _in_two_branches(model, replacement, step):
            return step
    return None


def _steps(call: cst.Call, optimizer: str) -> bool:
    if type(call.func) is not cst.Attribute:
        return False
    if dotted_name(call.func.value) == optimizer:
        return True
    args = positional_args(call)
    return bool(args) and dotted_name(args[0].value) == optimizer  # ``scaler.step(optimizer)``


def _in_two_branches(model: LoopModel, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """Whether ``a`` and ``b`` sit in different branches of one ``if`` (the body and the ``else`` never both run)."""
    parents = model.parents or {}
    chain: list[cst.CSTNode] = []
    node = parents.get(a)
    while node is not None:
        chain.append(node)
        node = parents.get(node)
    ancestors = {id(n): i for i, n in enumerate(chain)}
    child, node = b, parents.get(b)
    while node is not None and id(node) not in ancestors:
        child, node = node, parents.get(node)
    if type(node) is not cst.If:
        return False
    a_child = chain[ancestors[id(node)] - 1] if ancestors[id(node)] > 0 else a
    return a_child is not child and node.test not in (a_child, child)
