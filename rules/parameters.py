"""Rules about which parameters an optimizer holds (GL009)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import libcst as cst

from gradlint.events import EventKind
from gradlint.findings import Severity
from gradlint.model import LoopModel
from gradlint.objects import ObjKind
from gradlint.queries import same_object
from gradlint.rule import STEP, Report, Rule, Spelled, call_of
from gradlint.syntax import TRIVIA, bool_literal, callee_name, children, dotted_name, keyword_arg, positional_args, receiver, walk

# GL009's prefilter: a freezing statement, ``x.requires_grad = False`` (an attribute, not the
# ``requires_grad=False`` keyword of a constructor) or ``x.requires_grad_(False)``.
FREEZES = Spelled(
    "requires_grad",
    r"\.[\s\\]*requires_grad[\s\\]*=[\s\\]*False|requires_grad_[\s\\]*\([\s\\]*(?:requires_grad[\s\\]*=[\s\\]*)?False"
)

# Calls on a frozen model that leave its parameters as they are.
_HARMLESS_METHODS: frozenset[str] = frozenset({"to", "cuda", "cpu", "train", "eval", "half", "float", "bfloat16"})


class OptimizerOverFrozenParams(Rule):
    """An optimizer is built only over parameters that were frozen just before.

    **Why it matters.** A parameter with ``requires_grad = False`` never gets
    a gradient, and ``optimizer.step()`` skips every parameter whose
    ``.grad`` is None. An optimizer built over ``backbone.parameters()``
    right after ``backbone.requires_grad_(False)`` therefore updates
    nothing: the loss curve may still move (dropout, batch norm statistics),
    but the weights never change, and nothing fails.

    **Fix.** Build the optimizer over the parameters that train (the new
    head, the adapters), or unfreeze what should train before building it.

    **Bad**::

        model = torchvision.models.resnet18(weights="DEFAULT")
        model.requires_grad_(False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
        for x, y in loader:
            loss_fn(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()

    **Good**::

        model = torchvision.models.resnet18(weights="DEFAULT")
        model.requires_grad_(False)
        model.fc = torch.nn.Linear(model.fc.in_features, 10)
        optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.001)
        for x, y in loader:
            loss_fn(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()

    **Stays quiet when** the module unfreezes anything anywhere
    (``requires_grad = True``, ``requires_grad_()``, a flag that is not a
    literal False: a helper such as ``set_requires_grad(nets, flag)``) or
    calls anything named like unfreezing (``unfreeze``, ``thaw``,
    ``make_trainable``); after the optimizer, the same function hands the
    model to code this module does not define or calls a method of it that
    may change it (gradual unfreezing elsewhere); the
    freezing and the optimizer are not in the same block, or the freezing is
    under a condition; between the two the model (or a part of it) is
    assigned anew or handed to other code (``model.fc = nn.Linear(...)``,
    ``get_peft_model(model, config)``); the optimizer is given anything but
    one ``model.parameters()`` (parameter groups, a filtered list); the
    optimizer is never stepped in the module.
    """

    code = "GL009"
    name = "optimizer-over-frozen-params"
    summary = "an optimizer is built only over parameters frozen with requires_grad = False: it updates nothing"
    severity = Severity.ERROR
    fix = None  # which parameters should train is the author's choice
    needs = ((FREEZES, call_of("parameters"), STEP),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        if _unfreezes_anything(model.module):
            return
        stepped = [e.target for root in model.roots for e in root.events_of(EventKind.STEP) if e.target]
        local: set[str] | None = None  # the functions and classes the module defines, read when first needed
        for block in _blocks(model.module):
            frozen: dict[str, cst.CSTNode] = {}
            for position, statement in enumerate(block):
                name = _frozen_by(statement)
                if name is not None:
                    frozen[name] = statement
                    continue
                built = _optimizer_built(model, statement)
                if built is not None:
                    optimizer, call, source = built
                    freeze = _frozen_holder(frozen, source)
                    if freeze is None or not any(same_object(optimizer, s) for s in stepped):
                        continue
                    if local is None:
                        local = {n.name.value for n in _statements(model.module) if type(n) in (cst.FunctionDef, cst.ClassDef)}
                    if not _handed_away(source.split(".", 1)[0], block[position + 1 :], local):
                        yield Report(
                            call,
                            f"`{optimizer}` is built over `{source}.parameters()`, frozen at line "
                            f"{model.line(freeze)} (`requires_grad = False`): none of them gets a gradient, so "
                            f"every step updates nothing",
                        )
                    continue
                if frozen:
                    _forget_touched(frozen, statement)


# Callees that may switch gradients back on (gradual unfreezing helpers, Lightning's finetuning callbacks).
_UNFREEZING = re.compile(r"unfreeze|thaw|trainable|set_requires_grad|requires_grad$", re.IGNORECASE)
# Methods of a model that leave ``requires_grad`` alone.
_KEEPS_FROZEN = _HARMLESS_METHODS | {"parameters", "named_parameters", "state_dict", "zero_grad", "forward", "modules", "named_modules"}


def _handed_away(model_name: str, later: Sequence[cst.CSTNode], local: set[str]) -> bool:
    """Whether code after the optimizer hands the model to code this module does not show, or calls an unknown method of it."""
    for statement in later:
        for node in walk(statement, into_lambdas=True):
            if type(node) is not cst.Call:
                continue
            if type(node.func) is cst.Attribute and dotted_name(node.func.value) is not None:
                if dotted_name(node.func.value).split(".", 1)[0] == model_name and node.func.attr.value not in _KEEPS_FROZEN:
                    return True
            passes_model = any((dotted_name(arg.value) or "").split(".", 1)[0] == model_name for arg in node.args)
            if passes_model and callee_name(node) not in local:
                return True
    return False


def _statements(module: cst.Module) -> Iterator[cst.CSTNode]:
    """Every statement-level node of the module, nested ones included (expressions are not entered)."""
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        yield node
        if type(node) not in TRIVIA and not isinstance(node, cst.BaseExpression):
            stack.extend(children(node))


def _blocks(module: cst.Module) -> Iterator[Sequence[cst.CSTNode]]:
    """Every block of statements in the module: its body, and each function, loop, branch and ``with`` body."""
    yield module.body
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        if type(node) is cst.IndentedBlock:
            yield node.body
        if type(node) not in TRIVIA and not isinstance(node, cst.BaseExpression):
            stack.extend(children(node))


def _unfreezes_anything(module: cst.Module) -> bool:
    """Whether any code of the module may set ``requires_grad`` to something other than False."""
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        if type(node) is cst.Assign and any(_is_requires_grad(t.target) for t in node.targets):
            if bool_literal(node.value) is not False:
                return True
        elif type(node) is cst.AugAssign and _is_requires_grad(node.target):
            return True
        elif type(node) is cst.Call and callee_name(node) == "requires_grad_" and not _freezes(node):
            return True
        elif type(node) is cst.Call and _UNFREEZING.search(callee_name(node) or ""):
            return True
        if type(node) not in TRIVIA:
            stack.extend(children(node))
    return False


def _is_requires_grad(target: cst.BaseExpression) -> bool:
    return type(target) is cst.Attribute and target.attr.value == "requires_grad"


def _freezes(call: cst.Call) -> bool:
    """``x.requires_grad_(False)`` / ``x.requires_grad_(requires_grad=False)``."""
    args = positional_args(call)
    arg = args[0] if len(args) == 1 and len(call.args) == 1 else keyword_arg(call, "requires_grad")
    return arg is not None and bool_literal(arg.value) is False


def _frozen_by(statement: cst.CSTNode) -> str | None:
    """The model a statement freezes whole: ``model.requires_grad_(False)``, or a loop over ``model.parameters()`` that only freezes."""
    if type(statement) is cst.SimpleStatementLine and len(statement.body) == 1:
        small = statement.body[0]
        if type(small) is cst.Expr and type(small.value) is cst.Call:
            call = small.value
            if callee_name(call) == "requires_grad_" and _freezes(call) and receiver(call) is not None:
                return dotted_name(receiver(call))
        return None
    if type(statement) is not cst.For or statement.orelse is not None:
        return None
    owner = _parameters_owner(statement.iter)
    if owner is None:
        return None
    bound = statement.target
    if type(bound) is cst.Tuple and statement.iter.func.attr.value == "named_parameters" and len(bound.elements) == 2:
        bound = bound.elements[1].value
    variable = dotted_name(bound)
    if type(statement.body) is cst.IndentedBlock:  # one statement per line
        lines = statement.body.body
        if not all(type(line) is cst.SimpleStatementLine for line in lines):
            return None
        smalls = [small for line in lines for small in line.body]
    else:  # ``for p in model.parameters(): p.requires_grad = False``
        smalls = list(statement.body.body)
    if not variable or not smalls:
        return None
    return owner if all(_freezes_variable(small, variable) for small in smalls) else None


def _freezes_variable(small: cst.BaseSmallStatement, variable: str) -> bool:
    """``p.requires_grad = False`` or ``p.requires_grad_(False)`` for the loop's variable ``p``."""
    if type(small) is cst.Assign and len(small.targets) == 1:
        target = small.targets[0].target
        return _is_requires_grad(target) and dotted_name(target.value) == variable and bool_literal(small.value) is False
    if type(small) is cst.Expr and type(small.value) is cst.Call:
        call = small.value
        return callee_name(call) == "requires_grad_" and _freezes(call) and dotted_name(receiver(call)) == variable
    return False


def _parameters_owner(node: cst.BaseExpression) -> str | None:
    """``model`` for ``model.parameters()`` / ``model.named_parameters()`` with no arguments."""
    if type(node) is cst.Call and not node.args and callee_name(node) in ("parameters", "named_parameters"):
        owner = receiver(node)
        return dotted_name(owner) if owner is not None else None
    return None


def _optimizer_built(model: LoopModel, statement: cst.CSTNode) -> tuple[str, cst.Call, str] | None:
    """``(optimizer, constructor call, model)`` for ``opt = Optim(model.parameters(), ...)``."""
    if not (type(statement) is cst.SimpleStatementLine and len(statement.body) == 1):
        return None
    small = statement.body[0]
    if not (type(small) is cst.Assign and len(small.targets) == 1 and type(small.value) is cst.Call):
        return None
    name = dotted_name(small.targets[0].target)
    if name is None or model.info(name).kind is not ObjKind.OPTIMIZER:
        return None
    call = small.value
    args = positional_args(call)
    params = keyword_arg(call, "params") or (args[0] if args else None)
    if params is None or type(params.value) is not cst.Call or callee_name(params.value) != "parameters":
        return None
    source = _parameters_owner(params.value)
    return (name, call, source) if source is not None else None


def _frozen_holder(frozen: dict[str, cst.CSTNode], source: str) -> cst.CSTNode | None:
    """The freezing of ``source`` or of a model that contains it (``model`` holds ``model.backbone``)."""
    parts = source.split(".")
    for end in range(len(parts), 0, -1):
        found = frozen.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None


def _forget_touched(frozen: dict[str, cst.CSTNode], statement: cst.CSTNode) -> None:
    """Forget the frozen models a statement may change: any it mentions, unless it only moves or switches one."""
    if _only_moves(statement):
        return
    mentioned = {node.value for node in walk(statement) if type(node) is cst.Name}
    for name in list(frozen):
        if name.split(".", 1)[0] in mentioned:
            del frozen[name]


def _only_moves(statement: cst.CSTNode) -> bool:
    """``model.to(device)``, ``model.train()``, ``model = model.cuda()``: a line that keeps the model's parameters."""
    if not (type(statement) is cst.SimpleStatementLine and len(statement.body) == 1):
        return False
    small = statement.body[0]
    if type(small) is cst.Expr:
        value = small.value
    elif type(small) is cst.Assign and len(small.targets) == 1:
        value = small.value
        if type(value) is not cst.Call or dotted_name(small.targets[0].target) != dotted_name(receiver(value)):
            return False
    else:
        return False
    return type(value) is cst.Call and type(value.func) is cst.Attribute and callee_name(value) in _HARMLESS_METHODS
