"""Rules about which parameters an optimizer holds and updates (GL009, GL012, GL018–GL020)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import libcst as cst

from gradlint import device_constructions, frameworks
from gradlint.events import EventKind
from gradlint.findings import Severity
from gradlint.frameworks.settings import framework_settings
from gradlint.model import HANDOFF, FrameKind, LoopModel
from gradlint.module_index import Unpacked
from gradlint.objects import ObjKind, kind_from_name, kind_of_constructor
from gradlint.queries import frames_inside, function_holding, lies_in, same_object, steps_with_loops
from gradlint.reach import owners_of_construction, parameter_owners, reaching_call
from gradlint.rule import BACKWARD, STEP, Report, Rule, Spelled, call_of
from gradlint.syntax import TRIVIA, bool_literal, comprehension_clauses, callee_name, children, dotted_name, keyword_arg, positional_args, receiver, walk

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


class OptimizerSteppedOnOneSettingBranch(Rule):
    """An optimizer is stepped in one branch of a setting only, while the other branch does the same update without it.

    **Why it matters.** Training loops often spell one update two ways under a
    setting that holds for the whole run: ``if args.amp: scaler.step(opt) ...
    else: opt.step()``, ``if args.clip: ... else: ...``. An optimizer stepped
    in one of those branches only is never stepped when the setting takes the
    other value: its parameters still get gradients from every backward, but
    they are never updated (nor, usually, cleared), and nothing fails. The run
    trains part of the model in one configuration and all of it in the other.

    **Fix.** Step (and clear) the optimizer in both branches, or once after
    the ``if``.

    **Stays quiet when**

    - the test can change from batch to batch (it reads a name the loop
      assigns or binds, a counter, a call, a ``%``: alternating optimizers by
      step, as ``fixtures/realworld/gl002_clear_and_step_in_exclusive_branches__modded-nanogpt.py``
      does), or it is an accumulation guard;
    - the other branch is no spelling of the same update: it steps no optimizer
      that this branch steps too, and does not clip or unscale gradients for a
      step that never comes (``if args.train_head_only: head_opt.step() else:
      full_opt.step()`` chooses what trains; ``fixtures/parameters/ok_optimizers_chosen_by_setting.py``);
    - the optimizer is stepped, or handed to other code, anywhere on the other
      branch's path (inside it, or after the ``if``), or an optimizer of
      unknown parameters, or one built over the same model (or a part of it),
      is stepped there;
    - no backward runs on the other branch's path, the optimizer's parameters
      are not visibly built from a model the loop calls, or the module freezes
      parameters (``requires_grad_(False)``: the other branch may train without them).

    **Bad**::

        for x, y in loader:
            loss = loss_fn(model(x), y) + aux_loss_fn(aux_head(x))
            if args.amp:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
                aux_optimizer.step()
            optimizer.zero_grad()
            aux_optimizer.zero_grad()

    **Good**::

        for x, y in loader:
            loss = loss_fn(model(x), y) + aux_loss_fn(aux_head(x))
            if args.amp:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.step(aux_optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
                aux_optimizer.step()
            optimizer.zero_grad()
            aux_optimizer.zero_grad()
    """

    code = "GL012"
    name = "optimizer-stepped-on-one-setting-branch"
    summary = "an optimizer steps in one branch of a setting only: with the other value its parameters never update"
    severity = Severity.ERROR
    fix = None  # where the missing step belongs (and through which scaler) is the author's call
    needs = ((STEP, call_of("parameters")),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        if model.text is not None and FREEZES.literal in model.text and _freezes_anything(model.module):
            return
        reported: set[int] = set()
        for root in model.roots:
            for step, loop in steps_with_loops(root):
                if step.framework is not None or step.target is None or id(step.node) in reported:
                    continue
                sources = _sources(model, step.target)
                if not sources or not _forwarded(model, loop, sources):
                    continue
                for branch in reversed(frames_inside(step, loop)):
                    found = _missing_on_other_branch(model, root, loop, step, branch, sources)
                    if found is None:
                        continue
                    reported.add(id(step.node))
                    yield Report(step.node, _one_branch_message(model, step, branch, found))
                    break


def _freezes_anything(module: cst.Module) -> bool:
    return any(_frozen_by(statement) is not None for statement in _statements(module))


def _missing_on_other_branch(model: LoopModel, root, loop, step, branch, sources: set[str]) -> tuple[str, cst.CSTNode] | None:
    """When ``branch`` is one side of a setting's ``if`` and the other side's path does the same update without
    stepping ``step``'s optimizer while a backward feeds it: (what the other side does instead, the backward)."""
    if branch.kind is not FrameKind.BRANCH or type(branch.node) is not cst.If or branch.branch not in ("if", "else"):
        return None
    if branch.accumulation or branch.fixed or not _is_setting(model, branch.node.test, step, loop):
        return None
    other = "else" if branch.branch == "if" else "if"
    events = root.events_in(loop)
    on_other = [e for e in events if _in_side(e, branch.node, other)]
    after = [e for e in events if not _in_side(e, branch.node, "if") and not _in_side(e, branch.node, "else")]
    path = [e for e in on_other + after if not exclusive_from_side(e, branch.node, other)]
    for event in path:
        if event.kind in (EventKind.STEP, HANDOFF) and (event.target is None or same_object(event.target, step.target)):
            return None  # stepped there too, or perhaps (an unknown optimizer, a call handed it)
        if event.kind is EventKind.STEP and any(_related(s, o) for s in sources for o in _sources(model, event.target)):
            return None  # an optimizer over the same model updates these parameters there
        if event.kind is EventKind.STEP and not _sources(model, event.target):
            return None  # an optimizer whose parameters are unknown may update them
    same_update = [
        e for e in on_other if e.kind is EventKind.STEP and e.target is not None
        and any(s.kind is EventKind.STEP and same_object(s.target, e.target) and _in_side(s, branch.node, branch.branch) for s in events)
    ]
    prepares = [e for e in on_other if e.kind in (EventKind.CLIP, EventKind.UNSCALE)]
    stepped_on_path = [e for e in path if e.kind is EventKind.STEP]
    if same_update:
        instead = f"steps `{same_update[0].target}` as this one does, but not `{step.target}`"
    elif prepares and not stepped_on_path:
        instead = f"prepares the gradients for a step (line {model.line(prepares[0].node)}) and steps nothing"
    else:
        return None
    backward = next(
        (b for b in root.events_of(EventKind.BACKWARD, loop)
         if root.order(b) < root.order(step) and not _in_side(b, branch.node, branch.branch)
         and not exclusive_from_side(b, branch.node, other)),
        None,
    )
    if backward is None:
        return None
    return instead, backward.node


def _in_side(event, node: cst.If, side: str) -> bool:
    return any(f.kind is FrameKind.BRANCH and f.node is node and f.branch == side for f in event.frames)


def exclusive_from_side(event, node: cst.If, side: str) -> bool:
    """Whether ``event`` sits in a branch that cannot run together with ``side`` of ``node`` (another ``if`` inside
    or around it taking its other way is fine; only ``node``'s own other side is excluded)."""
    return _in_side(event, node, "else" if side == "if" else "if")


def _is_setting(model: LoopModel, test: cst.BaseExpression, step, loop) -> bool:
    """Whether an ``if`` test holds the same value on every batch of the loop: it reads names only (attributes of
    arguments, configurations), none bound or assigned inside the loops around the step, no counter, no call other
    than ``getattr``/``hasattr``/``bool``, no ``%``; a function read as one iteration (its caller's loop) may not test
    its own parameters."""
    names = []
    for node in walk(test):
        kind = type(node)
        if kind is cst.Call and callee_name(node) not in ("getattr", "hasattr", "bool"):
            return False
        if kind is cst.BinaryOperation and type(node.operator) is cst.Modulo:
            return False
        if kind in (cst.Name, cst.Attribute):
            name = dotted_name(node)
            if name is not None:
                names.append(name)
    names = [n for n in names if n not in ("None", "True", "False", "getattr", "hasattr", "bool")]
    if not names:
        return False
    changing: set[str] = set()
    for frame in step.loops:
        changing |= _assigned_in(model, frame.node)
        if type(frame.node) is cst.FunctionDef:
            params = frame.node.params
            changing |= {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)} - {"self", "cls"}
    for name in names:
        parts = name.split(".")
        if any(".".join(parts[: i + 1]) in changing for i in range(len(parts))):
            return False
        if re.search(r"step|iter|epoch|batch|count|idx|rank|^i$|^j$", parts[-1], re.IGNORECASE):
            return False  # a counter, or which process runs it
    return True


def _assigned_in(model: LoopModel, node: cst.CSTNode) -> set[str]:
    """The dotted names a loop (or a function) assigns or binds anywhere inside it."""
    def read() -> set[str]:
        found: set[str] = set()
        for sub in model.file.walk(node):
            kind = type(sub)
            targets = []
            if kind is cst.Assign:
                targets = [t.target for t in sub.targets]
            elif kind in (cst.AugAssign, cst.AnnAssign):
                targets = [sub.target]
            elif kind in (cst.For, cst.CompFor):
                targets = [sub.target]
            elif kind is cst.AsName:
                targets = [sub.name]
            elif kind is cst.NamedExpr:
                targets = [sub.target]
            for target in targets:
                for part in walk(target):
                    if type(part) in (cst.Name, cst.Attribute) and dotted_name(part):
                        found.add(dotted_name(part))
        return found

    return model.file.once((_assigned_in, id(node)), read)


def _sources(model: LoopModel, optimizer: str | None) -> set[str]:
    """The models (dotted, ``self.`` dropped) whose ``.parameters()`` the module builds ``optimizer`` over; empty when
    unknown or when any construction of it is not read."""
    if optimizer is None or model.index is None:
        return set()
    values = list(model.index.assigned_anywhere(optimizer))
    if not values or any(type(v) is not cst.Call for v in values):
        return set()
    found = set()
    for value in values:
        owners = [
            dotted_name(receiver(n)) for arg in value.args for n in walk(arg)
            if type(n) is cst.Call and callee_name(n) in ("parameters", "named_parameters")
        ]
        if not owners or None in owners:
            return set()
        found |= {o.removeprefix("self.") for o in owners}
    return found


def _related(a: str, b: str) -> bool:
    """Whether two models are one, or one holds the other (``model`` and ``model.head``)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _forwarded(model: LoopModel, loop, sources: set[str]) -> bool:
    """Whether the loop calls one of the models (or a model holding it): a forward that gives their parameters gradients."""
    called = {
        (dotted_name(n.func) or "").removeprefix("self.") for n in model.file.walk(loop.node) if type(n) is cst.Call
    }
    return any(_related(c, s) for c in called if c for s in sources)


def _one_branch_message(model: LoopModel, step, branch, found: tuple[str, cst.CSTNode]) -> str:
    instead, backward = found
    test = model.code(branch.node.test)
    when = f"`{test}` is {'true' if branch.branch == 'if' else 'false'}"
    other = f"`{test}` is {'false' if branch.branch == 'if' else 'true'}"
    return (
        f"`{step.target}` is stepped only when {when} (line {model.line(branch.node)}); when {other}, the other branch "
        f"{instead}: `{step.target}`'s parameters still get gradients from the backward at line {model.line(backward)} "
        f"but are never updated in that configuration; step `{step.target}` in both branches (or once after the `if`)"
    )


# Layers of ``torch.nn`` that hold parameters (with their defaults): kept where ``Module.parameters()`` does not look,
# they are never handed to an optimizer built from it.
_PARAMETER_LAYERS = frozenset({
    "Linear", "Bilinear", "LazyLinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
    "ConvTranspose3d", "LazyConv1d", "LazyConv2d", "LazyConv3d", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
    "SyncBatchNorm", "LayerNorm", "GroupNorm", "RMSNorm", "Embedding", "EmbeddingBag", "RNN", "LSTM", "GRU", "RNNCell",
    "LSTMCell", "GRUCell", "MultiheadAttention", "PReLU", "Transformer", "TransformerEncoderLayer",
    "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder", "Parameter",
})
_REGISTERING = frozenset({"ModuleList", "ModuleDict", "Sequential", "ParameterList", "ParameterDict"})
_REGISTERING_METHODS = frozenset({"add_module", "register_module", "register_parameter"})
_MOVES = frozenset({"to", "cuda", "half", "float", "double", "bfloat16", "type"})
# Factories of ``torch`` whose result has the default floating dtype when given no ``dtype``.
_FLOAT_FACTORIES = frozenset({"zeros", "ones", "randn", "rand", "empty"})
_TENSOR_FACTORIES = frozenset({
    "zeros", "ones", "randn", "rand", "empty", "full", "tensor", "zeros_like", "ones_like", "randn_like", "rand_like",
    "empty_like", "full_like", "arange", "linspace", "eye", "Tensor", "FloatTensor",
})
_UNREGISTERED = Spelled(
    "self",
    r"self\.\w+\s*=\s*[\[{][^\n]*\bnn\.[A-Z]|self\.\w+\.append\(\s*(?:torch\.)?nn\.[A-Z]"
    r"|Parameter\([^\n]*\)\s*\.\s*(?:to|cuda|half|float|double|bfloat16|type)\s*\("
    r"|self\.\w+\s*=\s*torch\.\w+\([^\n]*requires_grad\s*=\s*True"
    r"|^[ \t]+\w+\s*=\s*(?:torch\.)?(?:nn\.)?Parameter\(",
)
# A layer built by a class or a function of the module, put in a plain container: read only where the module defines
# a class on a ``...Module`` base (the rule judges those classes), or the pattern alone lets in most library code.
_BUILT_BY_CALL = Spelled(
    "self",
    r"self\.\w+\.append\(\s*(?:self\.)?\w+\(|self\.\w+\.append\(\s*\w+\s*\)|self\.\w+\s*=\s*\[\s*(?:self\.)?\w+\("
    r"|self\.\w+\s*=\s*\{[^\n]*:\s*(?:self\.)?\w+\(|self\.\w+\[[^\n]*\]\s*=\s*(?:self\.)?[\w.]+\(",
)
_MODULE_CLASS = Spelled("Module", r"class\s+\w+\s*\([^)]*Module\b")
# A layer built where it runs: ``nn.Conv2d(...)(x)`` (on one line, or closed on its own line), or appended to a local
# list (``convs.append(nn.Conv2d(...))``)
_BUILT_WHERE_RUN = Spelled(
    "nn.", r"nn\.[A-Z]\w*\([^\n]*\)\(|\n\s*\)\(\w|(?<![\w.])\w+\.append\(\s*(?:torch\.)?nn\.[A-Z]"
)


class UnregisteredParameters(Rule):
    """A module keeps trainable layers or tensors where ``Module.parameters()`` does not see them.

    **Why it matters.** ``nn.Module`` registers a layer or a parameter only
    when it is assigned to an attribute as an ``nn.Module`` or an
    ``nn.Parameter``. Layers kept in a plain ``list`` or ``dict``
    (``self.convs = []`` then ``self.convs.append(nn.Conv2d(...))``), a
    tensor made with ``requires_grad=True`` instead of an ``nn.Parameter``,
    and ``nn.Parameter(...).to(device)`` (on another device ``.to`` returns
    a plain tensor copy, and the parameter itself is dropped) are not in
    ``model.parameters()``. The optimizer built from it never updates them,
    nothing clears their gradients, ``model.to(device)`` does not move them
    and ``state_dict()`` does not save them. The forward still uses them, so
    training runs with those weights frozen at their initial values. A
    layer is known to be built, not only held, when the container is handed
    ``nn.Conv2d(...)`` (also in ``nn.Sequential``), an instance of a class of
    the module deriving from a ``Module`` that builds a layer with parameters
    (``[Highway(size) for _ in range(depth)]``), a library's layer known to
    hold parameters (PyTorch Geometric's ``GCNConv``, from
    ``gradlint/frameworks/``), or the value of a function of
    the module whose every return builds one, or of a module-level factory
    annotated to return a module (``-> nn.Module``: ``get_layer(hparams)``);
    the layer may be handed over through a local name handed nowhere else
    (``conv = nn.Conv1d(...)``; ``self.convs.append(conv)``; not also to
    ``setattr(self, ...)`` or a list ``nn.ModuleList`` registers) or stored by key
    (``self.w = {}``; ``self.w[f"layer{i}"] = nn.Linear(...)``).

    An ``nn.Parameter`` built inside ``forward`` (``rel_w =
    nn.Parameter(torch.randn(c, w)).to(x)``) is a new tensor on every call:
    no module holds it, no optimizer steps it, and each forward starts from
    its initial (often random) values. So is a layer built where it runs, in
    ``forward`` or in a method a ``forward`` of the class calls on ``self``
    (``x = nn.Conv2d(c, k, 1)(x)`` in ``decode``, a local list of layers
    filled and run there): reported once per method
    (``fixtures/realworld/gl018_layers_built_in_decode__setr-pytorch.py``).

    **Fix.** ``nn.ModuleList`` / ``nn.ModuleDict`` for layers,
    ``nn.Parameter(...)`` for tensors, built on the device:
    ``nn.Parameter(torch.empty(n, 1, device=device))``.

    **Stays quiet when** the class hands the container to ``nn.ModuleList``,
    ``nn.ModuleDict``, ``nn.Sequential`` or a parameter list, calls
    ``add_module``, ``register_module`` or ``register_parameter``, or defines
    its own ``parameters``; the class gathers the layers' parameters by hand
    (``[p for head in self.heads for p in head.parameters()]``:
    ``fixtures/realworld/ok_gl018_layers_registered_or_gathered.py``); a layer
    built where it runs has no weights (``affine=False``,
    ``elementwise_affine=False``); the list holds layers without parameters
    (``nn.ReLU``, ``nn.Dropout``, a class of the module that builds none) or
    layers already registered under another attribute; a factory is handed
    something of ``self`` or a value an enclosing ``isinstance(x, nn.Module)``
    knows to be a module (it may hand back a module someone else registers),
    or a factory known only by its annotation is a method (it may hand back
    a submodule the class registers); the
    tensor is wrapped in ``nn.Parameter`` or named in an optimizer's
    construction in the module, or the attribute is never read in the module
    (a leftover) or only handed to calls, activation checkpointing among
    them (a dummy input that makes the checkpointed output ask for
    gradients: ``fixtures/realworld/ok_gl018_checkpoint_dummy_input__GLIP.py``),
    or added and subtracted again wherever it is read (``x + b.to(x) -
    b.to(x)``: ``fixtures/realworld/ok_gl018_dummy_tensor_added_and_subtracted__autogluon.py``); ``.float()`` is called on a parameter of a float32 tensor
    (``torch.ones(n)`` given no ``dtype``: it hands back the parameter
    itself); a moved parameter the module's optimizer is built over by its
    attribute (``Adam([{"params": self.deform}])``: the optimizer holds what the
    name holds, and a copy would be refused loudly:
    ``fixtures/realworld/ok_gl018_moved_parameter_handed_to_optimizer__LGM.py``); a
    parameter built on the CPU and moved to a device the ``__init__`` is handed
    (``nn.Parameter(torch.tensor([10.])).to(loss_device)``) where every
    construction of the class in the run hands that argument the CPU
    (``torch.device("cpu")``, or a name bound only to it): ``.to`` hands back
    the parameter itself
    (``fixtures/crossfile/parameter_moved_to_loss_device__Real-Time-Voice-Cloning_correct``;
    checked alone, without the files that build it, the file is reported),
    or the tensor wrapped may already lie on the device ``.to`` names:
    moved there before wrapping (``nn.Parameter(torch.randn(n).to(device)).to(device)``),
    or computed from a tensor the method is handed, whose device only the
    callers know (``nn.Parameter(torch.mm(m, ...)).to(device)`` with ``m`` from
    ``torch.svd(aptinit)``:
    ``fixtures/realworld/ok_gl018_parameter_already_on_its_device__Graph-WaveNet.py``)
    (``fixtures/parameters/ok_gl018_registered_layers.py``,
    ``fixtures/realworld/ok_gl018_float_of_float32_parameter__Time-Series-Library.py``,
    ``fixtures/realworld/ok_gl018_layers_built_by_factory_in_module_list__texar-pytorch.py``,
    ``fixtures/realworld/ok_gl018_moved_parameter_never_read__SSLRec.py``).

    **Bad**::

        class Net(nn.Module):
            def __init__(self, channels, depth):
                super().__init__()
                self.convs = []
                for _ in range(depth):
                    self.convs.append(nn.Conv2d(channels, channels, 3, padding=1))

    **Good**::

        class Net(nn.Module):
            def __init__(self, channels, depth):
                super().__init__()
                self.convs = nn.ModuleList()
                for _ in range(depth):
                    self.convs.append(nn.Conv2d(channels, channels, 3, padding=1))
    """

    code = "GL018"
    name = "unregistered-parameters"
    summary = "layers in a plain list, or tensors that are no `nn.Parameter`: `parameters()` never holds them"
    severity = Severity.ERROR
    fix = None  # ModuleList or Parameter: the author's container, the author's call
    needs = ((_UNREGISTERED,), (_BUILT_BY_CALL, _MODULE_CLASS), (_BUILT_WHERE_RUN, _MODULE_CLASS))

    def check(self, model: LoopModel) -> Iterator[Report]:
        index = model.index
        if index is None:
            return
        for class_name, methods in index.class_methods.items():
            if not index.derives_from(class_name, lambda base: base.endswith("Module")):  # nn.Module, its framework subclasses
                continue
            if any(name in methods for name in ("parameters", "named_parameters")):
                continue
            bodies = [m for m in methods.values()]
            if "forward" in methods:
                yield from _parameters_made_in_forward(model, methods["forward"])
            yield from _layers_made_per_call(model, class_name, methods)
            if _registers_by_hand(model, bodies):
                continue
            yield from _unregistered_in(model, bodies)


def _parameters_made_in_forward(model: LoopModel, forward: cst.FunctionDef) -> Iterator[Report]:
    """``w = nn.Parameter(torch.randn(n, m)).to(x)`` in ``forward``: a new tensor on every call, held by no module."""
    for node in model.file.walk(forward.body):
        if type(node) is not cst.Assign or len(node.targets) != 1 or type(node.targets[0].target) is not cst.Name:
            continue
        built = node.value
        while type(built) is cst.Call and type(built.func) is cst.Attribute and built.func.attr.value in _MOVES:
            built = built.func.value
        if type(built) is not cst.Call or _torch_nn_name(model, built.func) != "Parameter":
            continue
        name = node.targets[0].target.value
        yield Report(
            built,
            f"`{name}` is an `nn.Parameter` built inside `forward`: every call makes a new one from its initial "
            f"values, no module registers it and no optimizer holds it, so it never trains (each forward sees fresh "
            f"{'random ' if _random_initial(model, built) else ''}values); build it once in `__init__` as "
            f"`self.{name} = nn.Parameter(...)`",
        )



def _layers_made_per_call(model: LoopModel, class_name: str, methods: dict[str, cst.FunctionDef]) -> Iterator[Report]:
    """Layers with parameters built inside ``forward``, or inside a method of the class that a ``forward`` of it or of
    its bases in the module calls on ``self`` (``x = self.decode(x)``), and run there: ``nn.Conv2d(...)(x)``, a local
    bound to one and called, or a local list filled with them. Each call makes new layers from fresh random weights
    that no module registers and no optimizer holds."""
    index = model.index
    forwards = [index.class_methods.get(c, {}).get("forward") for c in _class_and_bases(index, class_name)]
    called = {"forward"}
    for forward in filter(None, forwards):
        for node in model.file.walk(forward.body):
            if type(node) is cst.Call and type(node.func) is cst.Attribute and dotted_name(node.func.value) == "self":
                called.add(node.func.attr.value)
    for name in sorted(called & set(methods)):
        method = methods[name]
        locals_called = {
            n.func.value for n in model.file.walk(method.body) if type(n) is cst.Call and type(n.func) is cst.Name
        }
        iterated = {
            dotted_name(a.value) for n in model.file.walk(method.body) if type(n) is cst.For
            for a in ([cst.Arg(n.iter)] + (list(n.iter.args) if type(n.iter) is cst.Call and callee_name(n.iter) in ("zip", "enumerate") else []))
        }
        found: list[tuple[cst.Call, str, str]] = []
        for node in model.file.walk(method.body):
            built, how = None, None
            if type(node) is cst.Call and type(node.func) is cst.Call:
                built, how = node.func, "called at once"
            elif type(node) is cst.Assign and len(node.targets) == 1 and type(node.targets[0].target) is cst.Name:
                target = node.targets[0].target.value
                if target in locals_called and len(index.assignments.get(method, {}).get(target, [])) == 1:
                    built, how = node.value, f"bound to `{target}` and called"
            elif type(node) is cst.Call and callee_name(node) == "append" and type(node.func) is cst.Attribute:
                holder = dotted_name(node.func.value)
                if holder is not None and "." not in holder and holder in iterated and node.args:
                    built, how = node.args[0].value, f"kept in the local list `{holder}` and run"
            if built is None or type(built) is not cst.Call:
                continue
            layer = _layer_built(model, built, method)
            if layer is not None and layer != "nn.Parameter" and not _built_without_weights(built):
                found.append((built, layer, how))
        if found:
            built, layer, how = found[0]
            where = "`forward`" if name == "forward" else f"`{name}`, which `forward` runs on every call"
            more = f" (and {len(found) - 1} more layers there, lines {', '.join(str(model.line(b)) for b, _, _ in found[1:])})" if len(found) > 1 else ""
            yield Report(
                built,
                f"`{layer}` is built inside {where} ({how}){more}: each call makes a new layer with fresh random "
                f"weights that no module registers and no optimizer holds, so it never trains; build it once in "
                f"`__init__` (`self.layer = {layer}(...)`) and call that",
            )


def _handed_to_an_optimizer(model: LoopModel, target: str) -> bool:
    """Whether an optimizer of the module is built over the attribute itself (``Adam([{"params": self.deform}])``):
    it holds what the name holds, registered or not (a copy that ``.to`` made is a non-leaf tensor, which the
    optimizer refuses loudly), so nothing goes untrained in silence."""
    from gradlint.rules.parameter_groups import _optimizer_constructions

    return any(
        type(node) is cst.Attribute and dotted_name(node) == target
        for call in _optimizer_constructions(model) for node in model.file.walk(call)
    )


def _built_without_weights(built: cst.Call) -> bool:
    """``nn.LayerNorm(d, elementwise_affine=False)``, ``nn.BatchNorm2d(c, affine=False)``: a layer without parameters."""
    return any(
        (given := keyword_arg(built, name)) is not None and bool_literal(given.value) is False
        for name in ("affine", "elementwise_affine")
    )


def _class_and_bases(index, class_name: str) -> list[str]:
    """The class, then its bases defined in the module, nearest first."""
    found, pending = [], [class_name]
    while pending:
        current = pending.pop(0)
        if current in found:
            continue
        found.append(current)
        pending.extend(b for b in index.class_bases.get(current, []) if b in index.class_methods)
    return found


def _random_initial(model: LoopModel, built: cst.Call) -> bool:
    return any(
        type(n) is cst.Call and (callee_name(n) or "").startswith(("rand", "normal", "uniform")) for n in model.file.walk(built)
    )


def _registers_by_hand(model: LoopModel, methods: list[cst.FunctionDef]) -> bool:
    """``self.add_module(...)``, ``register_parameter``, or a container built by ``nn.ModuleList(...)`` from an attribute."""
    for method in methods:
        for node in model.file.walk(method.body):
            if type(node) is cst.Call and callee_name(node) in _REGISTERING_METHODS and dotted_name(receiver(node)) == "self":
                return True
    return False


def _unregistered_in(model: LoopModel, methods: list[cst.FunctionDef]) -> Iterator[Report]:
    containers: dict[str, cst.CSTNode] = {}  # ``self.x`` assigned an empty list or dict -> that assignment
    registered_later: set[str] = set()
    fresh: dict[str, tuple[cst.CSTNode, str]] = {}  # ``self.x`` -> (the call that fills it, the layer)
    for method in methods:
        for node in model.file.walk(method.body):
            kind = type(node)
            if kind is cst.Assign and len(node.targets) == 1 and type(node.targets[0].target) is cst.Subscript:
                # ``self.w[f"layer{i}"] = nn.Linear(...)``: an element of a container the class made
                owner = dotted_name(node.targets[0].target.value)
                layer = _layer_built(model, _bound_value(model, node.value, method), method) if owner else None
                if layer is not None and owner.startswith("self.") and owner.count(".") == 1:
                    fresh.setdefault(owner, (node, layer))
                continue
            if kind is cst.Assign and len(node.targets) == 1:
                target = dotted_name(node.targets[0].target)
                if target is None or not target.startswith("self.") or target.count(".") != 1:
                    continue
                value = node.value
                if _registering_call(model, value):
                    registered_later.add(target)
                    continue
                if type(value) in (cst.List, cst.Dict) and not value.elements:
                    containers.setdefault(target, node)
                    continue
                layer = _plain_container_of_layers(model, value, method)
                if layer is not None:
                    fresh.setdefault(target, (value, layer))
                    continue
                moved = _moved_parameter(model, value)
                if (
                    moved is not None and _read_anywhere(model, target) and not _handed_to_an_optimizer(model, target)
                    and not _moved_to_the_cpu_by_every_construction(model, value, method)
                    and not _maybe_already_there(model, value, method)
                ):
                    yield Report(
                        value,
                        f"`{target}` is assigned `nn.Parameter(...).{moved}(...)`: `.{moved}` returns a plain tensor copy "
                        f"whenever it changes the device or dtype, which the module does not register: then "
                        f"`model.parameters()` does not hold it, and no optimizer built from it updates `{target}`; build "
                        f"the parameter on the device and in the dtype it needs (`nn.Parameter(torch.empty(..., "
                        f"device=device))`)",
                    )
                    continue
                if (
                    method.name.value == "__init__" and _tensor_asking_for_gradients(model, value)
                    and not _named_elsewhere(model, target, methods) and _read_anywhere(model, target)
                    and not _only_handed_to_checkpoint(model, target) and not _cancels_where_read(model, target)
                ):  # built once with the module, as a weight is (not a forward's intermediate kept on ``self``)
                    yield Report(
                        value,
                        f"`{target}` is a tensor made with `requires_grad=True`, not an `nn.Parameter`: the module does "
                        f"not register it, so `model.parameters()` never holds it and no optimizer built from it updates "
                        f"it (its gradient also piles up, never cleared); wrap it: `nn.Parameter(...)`",
                    )
            elif kind is cst.Call and callee_name(node) in ("append", "extend", "insert"):
                owner = dotted_name(receiver(node))
                if owner is None or owner.count(".") != 1 or not owner.startswith("self."):
                    continue
                layer = next((l for a in node.args if (l := _layer_built(model, _bound_value(model, a.value, method), method)) is not None), None)
                if layer is not None:
                    fresh.setdefault(owner, (node, layer))
            elif kind is cst.Call and _registering_call(model, node):
                for arg in node.args:
                    for inner in model.file.walk(arg.value):
                        name = dotted_name(inner)
                        if name is not None and name.startswith("self."):
                            registered_later.add(name)
    for target, (node, layer) in fresh.items():
        if target in registered_later or layer == "nn.Parameter":
            continue  # a plain list of parameters is as often a list of placeholders (deepchem's GAN inputs)
        filled = type(node) is cst.Call or type(node) is cst.Assign and type(node.targets[0].target) is cst.Subscript
        if filled and target not in containers:
            continue  # appended to (or stored in) something not known to be a plain list or dict
        if _reassigned_elsewhere(model, methods, target, node) or not _elements_called(model, methods, target):
            continue  # not a store of layers the forward runs: replaced later, or never called
        if _elements_called(model, methods, target, calls=("parameters", "named_parameters")):
            continue  # ``[p for head in self.heads for p in head.parameters()]``: their parameters are gathered by hand
        if _frozen_by_hand(model, methods, target):
            continue  # ``self.block[0].requires_grad_(False)``: hidden from parameters() on purpose (a fixed filter)
        where = f" where `{target}` is made (line {model.line(containers[target])})" if filled else ""
        yield Report(
            node,
            f"`{target}` is a plain Python container holding `{layer}` layers: the module does not register "
            f"them, so `model.parameters()` never holds their weights and no optimizer built from it updates them "
            f"(nor does `model.to(...)` move them or `state_dict()` save them); use `nn.ModuleList` / `nn.ModuleDict`"
            f"{where}",
        )


def _only_handed_to_checkpoint(model: LoopModel, target: str) -> bool:
    """Whether every read of the attribute ``self.x`` names hands it to a call, one of them activation checkpointing
    (``checkpoint.checkpoint(self.block, x, self.dummy_tensor)``, and ``self.block(x, self.dummy_tensor)`` on the
    path without it): a tensor asking for gradients only so that the checkpointed call's output does, never a weight
    any code computes with."""
    handed, checkpointed = model.file.once((_only_handed_to_checkpoint,), lambda: _attributes_handed(model)).get(
        target.rsplit(".", 1)[-1], (False, False)
    )
    return handed and checkpointed


def _cancels_where_read(model: LoopModel, target: str) -> bool:
    """Whether every read of the attribute ``self.x`` names is added and subtracted again in one sum (``x +
    self.dummy_bias.to(x) - self.dummy_bias.to(x)``): a tensor asking for gradients only so that the output does
    (activation checkpointing's dummy input), whose gradient through the sum is zero. Not a weight."""
    parents = model.parents or {}
    name = target.rsplit(".", 1)[-1]
    signs: dict[int, int] = {}  # each sum holding a read -> the reads' signs added up
    for node in model.file.every_node(model.module):
        if type(node) is not cst.Attribute or node.attr.value != name:
            continue
        term = node
        parent = parents.get(term)
        if type(parent) is cst.AssignTarget:
            continue
        if type(parent) is cst.Attribute and parent.value is term and type(parents.get(parent)) is cst.Call:
            term = parents[parent]  # ``self.dummy_bias.to(x)``: the same tensor, moved
        sign, top = 1, term
        while type(parents.get(top)) is cst.BinaryOperation and type(parents[top].operator) in (cst.Add, cst.Subtract):
            chain = parents[top]
            if top is chain.right and type(chain.operator) is cst.Subtract:
                sign = -sign
            top = chain
        if top is term:
            return False  # read outside a sum
        signs[id(top)] = signs.get(id(top), 0) + sign
    return bool(signs) and all(total == 0 for total in signs.values())


def _attributes_handed(model: LoopModel) -> dict[str, tuple[bool, bool]]:
    """For each attribute name the module reads: whether every read is an argument of a call, and whether one is an
    argument of activation checkpointing. Read once per module."""
    parents = model.parents or {}
    found: dict[str, tuple[bool, bool]] = {}
    for node in model.file.every_node(model.module):
        if type(node) is not cst.Attribute:
            continue
        parent = parents.get(node)
        if type(parent) is cst.AssignTarget:
            continue
        call = parents.get(parent) if type(parent) is cst.Arg else None
        handed, checkpointed = found.get(node.attr.value, (True, False))
        found[node.attr.value] = (
            handed and type(call) is cst.Call,
            checkpointed or type(call) is cst.Call and callee_name(call) in ("checkpoint", "checkpoint_sequential"),
        )
    return found


def _read_anywhere(model: LoopModel, target: str) -> bool:
    """Whether the module reads the attribute ``self.x`` names anywhere but where it is assigned (by any object's
    spelling: ``self.x``, ``model.x``). One never read is a leftover: what it is registered as changes nothing."""

    def count() -> dict[str, int]:
        reads: dict[str, int] = {}
        for node in model.file.every_node(model.module):
            if type(node) is cst.Attribute:
                reads[node.attr.value] = reads.get(node.attr.value, 0) + 1
            elif type(node) in (cst.Assign, cst.AnnAssign, cst.AugAssign):
                targets = [t.target for t in node.targets] if type(node) is cst.Assign else [node.target]
                for written in targets:
                    if type(written) is cst.Attribute and type(node) is not cst.AugAssign:
                        reads[written.attr.value] = reads.get(written.attr.value, 0) - 1
        return reads

    return model.file.once((_read_anywhere,), count).get(target.rsplit(".", 1)[-1], 0) > 0


def _frozen_by_hand(model: LoopModel, methods: list[cst.FunctionDef], target: str) -> bool:
    """Whether the class switches gradients off for something inside the container (``self.block[0].requires_grad_(
    False)``, ``...weight.requires_grad = False``)."""
    for method in methods:
        for node in model.file.walk(method.body):
            if type(node) is cst.Call and callee_name(node) == "requires_grad_":
                if node.args and bool_literal(node.args[0].value) is not False:
                    continue
                if model.code(receiver(node)).startswith(target):
                    return True
            elif type(node) is cst.Assign and bool_literal(node.value) is False:
                if any(type(t.target) is cst.Attribute and t.target.attr.value == "requires_grad" and model.code(t.target).startswith(target) for t in node.targets):
                    return True
    return False


def _reassigned_elsewhere(model: LoopModel, methods: list[cst.FunctionDef], target: str, filled: cst.CSTNode) -> bool:
    """Whether a method other than the one that fills ``target`` assigns it anew (``self.inputs = [x]`` in forward)."""
    home = function_holding(model, filled)
    return any(
        type(node) is cst.Assign and any(dotted_name(t.target) == target for t in node.targets)
        for method in methods if method is not home
        for node in model.file.walk(method.body)
    )


def _bound_value(model: LoopModel, value: cst.BaseExpression, method: cst.FunctionDef) -> cst.BaseExpression:
    """What a local name handed to ``append`` holds when the method binds it once (``conv = nn.Conv1d(...)``;
    ``self.convs.append(conv)``) and hands it nowhere else (not to a second list that ``nn.ModuleList`` registers,
    not to ``setattr(self, ...)``, not to an attribute of ``self``); the value itself otherwise."""
    if type(value) is not cst.Name:
        return value
    values = model.index.assignments.get(method, {}).get(value.value, [])
    if len(values) != 1 or not isinstance(values[0], cst.BaseExpression):
        return value
    parents = model.parents or {}
    handed = 0
    for node in model.file.walk(method.body):
        if type(node) is not cst.Name or node.value != value.value:
            continue
        parent = parents.get(node)
        if type(parent) in (cst.Arg, cst.Element, cst.Assign, cst.DictElement) and getattr(parent, "value", None) is node:
            handed += 1
    return values[0] if handed == 1 else value


def _elements_called(
    model: LoopModel, methods: list[cst.FunctionDef], target: str, calls: tuple[str, ...] | None = None
) -> bool:
    """Whether the class runs the container's layers: ``self.convs[i](x)``, or a name a ``for`` or comprehension takes
    from it (``for block in self.blocks: block(x)``, ``for k, m in self.heads.items(): m(x)``), called. With ``calls``,
    whether it calls one of those methods of them instead (``head.parameters()``)."""
    for method in methods:
        bound: set[str] = set()
        for node in model.file.walk(method.body):
            clauses = [node] if type(node) is cst.For else (comprehension_clauses(node.for_in) if type(node) in (cst.ListComp, cst.GeneratorExp, cst.DictComp, cst.SetComp) else [])
            for clause in clauses:
                iterated = clause.iter
                if type(iterated) is cst.Call and type(iterated.func) is cst.Attribute and iterated.func.attr.value in ("values", "items"):
                    iterated = iterated.func.value
                if type(iterated) is cst.Call and callee_name(iterated) == "enumerate" and iterated.args:
                    iterated = iterated.args[0].value
                if dotted_name(iterated) == target:
                    bound.update(n.value for n in walk(clause.target) if type(n) is cst.Name)
        for node in model.file.walk(method.body):
            if type(node) is not cst.Call:
                continue
            func = node.func
            if calls is not None:
                if type(func) is not cst.Attribute or func.attr.value not in calls:
                    continue
                func = func.value
            if type(func) is cst.Call and calls is None and len(func.args) == 1:
                func = func.args[0].value  # ``to_device(self.layers[k])(x)``: moved, then called
            if type(func) is cst.Subscript and dotted_name(func.value) == target:
                return True
            if type(func) is cst.Name and func.value in bound:
                return True
    return False


def _torch_nn_name(model: LoopModel, func: cst.BaseExpression) -> str | None:
    """``Conv2d`` for ``nn.Conv2d`` / ``torch.nn.Conv2d`` (through the module's imports)."""
    for qualified in model.index.qualified_names(func):
        if qualified.startswith(("torch.nn.", "torch.nn.parameter.")):
            last = qualified.rsplit(".", 1)[-1]
            if last[:1].isupper():
                return last
    return None


def _registering_call(model: LoopModel, value: cst.CSTNode) -> bool:
    return type(value) is cst.Call and _torch_nn_name(model, value.func) in _REGISTERING


def _layer_built(
    model: LoopModel, value: cst.BaseExpression, function: cst.FunctionDef | None = None, seen: frozenset = frozenset()
) -> str | None:
    """The layer with parameters a call builds, in the words of the message: ``nn.Conv2d`` for ``nn.Conv2d(...)``
    (also inside ``nn.Sequential(...)``); ``Block`` for a class of this module deriving from a ``Module`` that builds
    one; ``make_block(...)`` for a function of this module whose every return builds one, or a function of the module
    (not a method) annotated to return a module and handed nothing that is already a module (a factory reading a
    specification: ``get_layer(hparams)``). ``function`` holds the call; ``seen`` stops a recursion."""
    if type(value) is not cst.Call:
        return None
    layer = _torch_nn_name(model, value.func)
    if layer in _PARAMETER_LAYERS:
        return f"nn.{layer}"
    if layer == "Sequential":
        return next((l for a in value.args if (l := _layer_built(model, a.value, function, seen)) is not None), None)
    if layer is not None or model.index is None:
        return None
    for qualified in model.index.qualified_names(value.func):
        if frameworks.layer_with_parameters(qualified):
            return qualified.rsplit(".", 1)[-1]
    index = model.index
    if type(value.func) is cst.Name and value.func.value in index.class_methods:
        name = value.func.value
        return name if name not in seen and _module_class_with_parameters(model, name, seen | {name}) else None
    helper = index.resolve_function(value, function)
    if helper is None or helper in seen:
        return None
    seen = seen | {helper}
    returned = index.returned(helper)
    if returned and all(_returns_layer(model, helper, r, seen) for r in returned):
        return f"{callee_name(value)}(...)"
    if (
        index.class_of.get(helper) is None and index.parent_function.get(helper) is None
        and helper.returns is not None and _names_module_class(model, helper.returns.annotation, seen)
        and not _handed_a_module(model, value)
    ):
        return f"{callee_name(value)}(...)"
    return None


def _returns_layer(model: LoopModel, helper: cst.FunctionDef, value: cst.BaseExpression, seen: frozenset) -> bool:
    """Whether a returned value is a layer the helper builds: a call that builds one, or a name every assignment in
    the helper gives one (``block = nn.Sequential(...)``; ``return block``)."""
    if type(value) is cst.Name:
        values = model.index.assignments.get(helper, {}).get(value.value, [])
        return bool(values) and all(isinstance(v, cst.BaseExpression) and _layer_built(model, v, helper, seen) for v in values)
    return _layer_built(model, value, helper, seen) is not None


def _module_class_with_parameters(model: LoopModel, class_name: str, seen: frozenset) -> bool:
    """Whether a class of this module derives from a ``Module`` and builds a layer with parameters (or an
    ``nn.Parameter``) in one of its methods, or those of its bases in the module."""
    index = model.index
    if not index.derives_from(class_name, lambda base: base.endswith("Module")):
        return False
    pending, visited = [class_name], set()
    while pending:
        current = pending.pop()
        if current in visited:
            continue
        visited.add(current)
        pending.extend(index.class_bases.get(current, []))
        for method in index.class_methods.get(current, {}).values():
            for node in model.file.walk(method.body):
                if type(node) is cst.Call and _layer_built(model, node, method, seen) is not None:
                    return True
    return False


def _names_module_class(model: LoopModel, annotation: cst.BaseExpression, seen: frozenset) -> bool:
    """Whether a return annotation names ``nn.Module`` itself, or a class of this module built as a layer with
    parameters (not ``Optional[...]``, a container, or a string)."""
    if any(q in ("torch.nn.Module", "torch.nn.modules.module.Module") for q in model.index.qualified_names(annotation)):
        return True
    return (
        type(annotation) is cst.Name and annotation.value in model.index.class_methods
        and annotation.value not in seen and _module_class_with_parameters(model, annotation.value, seen | {annotation.value})
    )


def _handed_a_module(model: LoopModel, call: cst.Call) -> bool:
    """Whether a call is handed something of ``self`` or a name an enclosing ``if isinstance(name, nn.Module):``
    (its body, not its ``else``) knows to be a module: a factory may hand such a module back as it is, and a module
    the caller holds may be registered there."""
    modules: set[str] = set()
    child: cst.CSTNode = call
    parent = model.file.parent_map().get(child)
    while parent is not None and type(parent) not in (cst.FunctionDef, cst.Module):
        if type(parent) is cst.If and child is parent.body and type(parent.test) is cst.Call:
            test = parent.test
            if callee_name(test) == "isinstance" and len(test.args) == 2 and type(test.args[0].value) is cst.Name:
                if any(
                    q in ("torch.nn.Module", "torch.nn.modules.module.Module")
                    for n in walk(test.args[1].value) if type(n) in (cst.Name, cst.Attribute)
                    for q in model.index.qualified_names(n)
                ):
                    modules.add(test.args[0].value.value)
        child, parent = parent, model.file.parent_map().get(parent)
    for arg in call.args:
        for node in walk(arg.value):
            if type(node) is cst.Name and (node.value in ("self", "cls") or node.value in modules):
                return True
    return False


def _plain_container_of_layers(model: LoopModel, value: cst.BaseExpression, function: cst.FunctionDef | None) -> str | None:
    """``[nn.Linear(...), ...]``, ``[nn.Linear(...) for _ in range(n)]``, ``{k: nn.Linear(...) ...}``: the layer."""
    kind = type(value)
    if kind is cst.List:
        return next((l for e in value.elements if type(e) is cst.Element and (l := _layer_built(model, e.value, function))), None)
    if kind is cst.ListComp:
        return _layer_built(model, value.elt, function)
    if kind is cst.Dict:
        return next((l for e in value.elements if type(e) is cst.DictElement and (l := _layer_built(model, e.value, function))), None)
    if kind is cst.DictComp:
        return _layer_built(model, value.value, function)
    return None


def _moved_parameter(model: LoopModel, value: cst.BaseExpression) -> str | None:
    """``nn.Parameter(x).to(device)``: the method that may copy it."""
    if type(value) is not cst.Call or type(value.func) is not cst.Attribute or value.func.attr.value not in _MOVES:
        return None
    inner = value.func.value
    if type(inner) is cst.Call and _torch_nn_name(model, inner.func) == "Parameter":
        frozen = keyword_arg(inner, "requires_grad") or (inner.args[1] if len(inner.args) > 1 and inner.args[1].keyword is None else None)
        if frozen is not None and bool_literal(frozen.value) is False:
            return None  # a running statistic kept as a parameter that never trains: nothing for an optimizer to miss
        if value.func.attr.value == "float" and _float32_factory(model, inner):
            return None  # ``.float()`` of a float32 tensor hands back the parameter itself
        return value.func.attr.value
    return None


# Factories that build on the CPU unless handed a device (``torch.tensor([10.])``, ``torch.zeros(n)``): all but the
# ``_like`` ones, which build where the tensor they copy lies.
_CPU_FACTORIES = frozenset(name for name in _TENSOR_FACTORIES if not name.endswith("_like"))


def _moved_to_the_cpu_by_every_construction(model: LoopModel, moved: cst.Call, method: cst.FunctionDef) -> bool:
    """``nn.Parameter(torch.tensor([10.])).to(loss_device)`` in ``__init__(self, device, loss_device)``, where every
    construction of the class in the run hands ``loss_device`` the CPU (``torch.device("cpu")``): the tensor is built
    there, so ``.to`` hands back the parameter itself (:mod:`gradlint.device_constructions`). A parameter with a default
    counts only when the default is the CPU too."""
    if moved.func.attr.value != "to" or len(moved.args) != 1 or method.name.value != "__init__":
        return False
    inner = moved.func.value.args[0].value if moved.func.value.args else None
    if type(inner) is not cst.Call or callee_name(inner) not in _CPU_FACTORIES or keyword_arg(inner, "device") is not None:
        return False  # built elsewhere than on the CPU, or from a tensor that may lie anywhere: the move may copy
    device = moved.args[0].value
    if moved.args[0].keyword is not None or type(device) is not cst.Name:
        return False
    positional = [p for p in method.params.params][1:]  # after ``self``
    at = next((i for i, p in enumerate(positional) if p.name.value == device.value), None)
    if at is None:
        return False
    default = positional[at].default
    if default is not None and not (type(default) is cst.SimpleString and default.evaluated_value == "cpu"):
        return False
    class_name = model.index.class_of.get(method)
    return bool(class_name) and device_constructions.cpu_only(model.device_args, class_name, (str(at), device.value))


def _maybe_already_there(model: LoopModel, moved: cst.Call, method: cst.FunctionDef) -> bool:
    """Whether the tensor wrapped in ``nn.Parameter(x).to(d)`` may already lie where ``.to`` sends it, so that ``.to``
    hands back the parameter itself: ``x`` was moved there first (``nn.Parameter(torch.randn(n).to(device)).to(device)``)
    or is computed from a tensor the method is handed (``m, p, n = torch.svd(aptinit)``; ``nn.Parameter(torch.mm(m,
    ...)).to(device)``), whose device only its callers know."""
    if moved.func.attr.value != "to" or not moved.func.value.args:
        return False
    data = moved.func.value.args[0].value
    target = model.code(moved.args[0].value) if len(moved.args) == 1 else None
    if target is not None and any(
        type(n) is cst.Call and type(n.func) is cst.Attribute and n.func.attr.value == "to" and len(n.args) == 1
        and model.code(n.args[0].value) == target
        for n in walk(data)
    ):
        return True
    handed = {p.name.value for p in method.params.params[1:]} - {target}
    return bool(handed) and _reaches(model, data, method, handed, depth=3)


def _reaches(model: LoopModel, value: cst.BaseExpression, method: cst.FunctionDef, names: set[str], depth: int) -> bool:
    """Whether ``value`` reads one of ``names``, directly or through the method's assignments of the names it reads
    (``depth`` assignments deep), outside the arguments of factories that build on the CPU whatever they are handed
    (``torch.Tensor(dense_dims, 1)``: a size)."""
    read = _names_outside_cpu_factories(value)
    if read & names:
        return True
    if depth == 0:
        return False
    table = model.index.assignments.get(method, {})
    for name in read:
        for assigned in table.get(name, ()):
            source = assigned.value if type(assigned) is Unpacked else assigned
            if _reaches(model, source, method, names, depth - 1):
                return True
    return False


def _names_outside_cpu_factories(value: cst.BaseExpression) -> set[str]:
    """The names ``value`` reads, leaving out what a CPU factory given no device is handed."""
    found: set[str] = set()
    stack: list[cst.CSTNode] = [value]
    while stack:
        node = stack.pop()
        if type(node) is cst.Name:
            found.add(node.value)
        elif type(node) is cst.Call and callee_name(node) in _CPU_FACTORIES and keyword_arg(node, "device") is None:
            continue
        stack.extend(children(node))
    return found


def _float32_factory(model: LoopModel, parameter: cst.Call) -> bool:
    """Whether ``nn.Parameter(torch.ones(n, device=d))`` wraps a float tensor of the default dtype, float32: a factory of
    ``torch`` given no ``dtype``, in a module that never changes the default dtype."""
    data = parameter.args[0].value if parameter.args else None
    if type(data) is not cst.Call or callee_name(data) not in _FLOAT_FACTORIES or keyword_arg(data, "dtype") is not None:
        return False
    if not any(q.startswith("torch.") for q in model.index.qualified_names(data.func)):
        return False
    return "set_default_dtype" not in model.file.code and "set_default_tensor_type" not in model.file.code


def _tensor_asking_for_gradients(model: LoopModel, value: cst.BaseExpression) -> bool:
    """``torch.zeros(n, requires_grad=True)`` (a factory of ``torch`` handed ``requires_grad=True``)."""
    if type(value) is not cst.Call or callee_name(value) not in _TENSOR_FACTORIES:
        return False
    if not any(q.startswith("torch.") for q in model.index.qualified_names(value.func)):
        return False
    given = keyword_arg(value, "requires_grad")
    return given is not None and bool_literal(given.value) is True


def _named_elsewhere(model: LoopModel, target: str, methods: list[cst.FunctionDef]) -> bool:
    """Whether the tensor is handed on by name: wrapped in a parameter, or given to any call outside the class's own
    arithmetic (an optimizer built over it, a parameter list): then it may be trained on purpose."""
    return target.split(".", 1)[1] in model.file.once((_named_elsewhere,), lambda: _attributes_handed_on(model))


def _attributes_handed_on(model: LoopModel) -> frozenset[str]:
    """The attribute names spelled in the arguments of calls of ``torch.nn`` or of optimizer constructors, read once
    per module (each tensor asked about used to walk the whole module again)."""
    found: set[str] = set()
    for node in model.file.every_node(model.module):
        if type(node) is not cst.Call or callee_name(node) in _MOVES or not node.args:
            continue
        names = {
            inner.attr.value for arg in node.args for inner in model.file.walk(arg.value) if type(inner) is cst.Attribute
        }
        if names - found and (_torch_nn_name(model, node.func) is not None or _builds_optimizer(model, node)):
            found |= names
    return frozenset(found)


def _builds_optimizer(model: LoopModel, call: cst.Call) -> bool:
    """Whether a call builds an optimizer (by its constructor's qualified name, or a name that says so)."""
    if kind_from_name(callee_name(call) or "") is ObjKind.OPTIMIZER:
        return True
    return any(kind_of_constructor(q) is ObjKind.OPTIMIZER for q in model.index.qualified_names(call.func))


# What may be done to an optimizer that never steps it: clear it, read or set its groups, save or load it.
_HARMLESS_OPTIMIZER_USES = frozenset({"zero_grad", "param_groups", "state_dict", "load_state_dict", "state", "defaults"})


class OptimizerNeverStepped(Rule):
    """An optimizer is built over a network that the loop trains, and nothing in the module ever steps it.

    **Why it matters.** The loop backpropagates through the network on every
    batch, so its parameters get gradients, but without ``optimizer.step()``
    they never change: the run trains nothing (or, beside a second optimizer
    that does step, trains only part of the model), and without a clear the
    gradients pile up for the whole run. Nothing fails; the loss just does
    not go down, or goes down less than it should.

    **Fix.** Step the optimizer after the backward (and clear it), as the
    loop meant to.

    **Stays quiet when** the optimizer is handed to anything (a call, a
    return, a container, another name: a framework or a helper may step it)
    but a learning-rate scheduler (``ReduceLROnPlateau(optimizer)``) or a
    function of the module that only reads or sets its groups
    (``adjust_learning_rate(lr, optimizer_d, epoch)``), stepped anywhere in
    its scope (the module, or for a local variable its function: two
    functions may each build their own ``optimizer_d``), or only built; when
    another optimizer holds the same network (it may be the one that trains
    it), or the optimizer is set on an object from outside
    (``trainer.actor_optimizer = Adam(...)``) and a class of the module
    steps or hands on ``self.actor_optimizer``
    (``fixtures/realworld/gl019_optimizer_reset_on_trainer_object__CORL.py``), or the optimizer is built anew in a loop that also holds the
    backward (a fresh network and optimizer per round whose gradients are
    only read: ``fixtures/realworld/ok_gl019_optimizer_rebuilt_per_round__ROLL.py``); when no loop backpropagates a loss that visibly runs through the
    network it was built over
    (``fixtures/parameters/ok_gl019_optimizer_stepped_elsewhere.py``).

    Also flagged: a framework's hook that hands back the optimizers it is to
    step (Lightning's ``configure_optimizers``) building one and returning
    nothing: the framework steps none (Lightning runs the fit with a
    ``_MockOptimizer`` after one warning), unless the module reads the
    attribute it keeps the optimizer in (it may step it by hand)
    (``fixtures/realworld/gl019_configure_optimizers_returns_nothing__audio-diffusion.py``).

    **Bad**::

        class Trainer:
            def __init__(self, model, loader):
                self.model, self.loader = model, loader
                self._optimizer = torch.optim.Adam(model.parameters())

            def _train(self):
                for x, y in self.loader:
                    loss = F.cross_entropy(self.model(x), y)
                    loss.backward()

    **Good**::

            def _train(self):
                for x, y in self.loader:
                    loss = F.cross_entropy(self.model(x), y)
                    self._optimizer.zero_grad()
                    loss.backward()
                    self._optimizer.step()
    """

    code = "GL019"
    name = "optimizer-never-stepped"
    summary = "an optimizer is built over a network the loop backpropagates through, and nothing ever steps it"
    severity = Severity.ERROR
    fix = None  # where the step belongs is the loop's to say
    needs = ((BACKWARD, call_of("parameters")), *((declared.hook,) for declared in frameworks.OPTIMIZERS_RETURNED))

    def check(self, model: LoopModel) -> Iterator[Report]:
        index = model.index
        if index is None:
            return
        yield from _hooks_returning_no_optimizer(model)
        built_once = list(_optimizers_built_once(model))
        by_scope: dict[int, list[cst.Call]] = {}
        for _, built, scope in built_once:
            by_scope.setdefault(id(scope), []).append(built)
        for name, built, scope in built_once:
            owners = owners_of_construction(model, built) if scope is not None else parameter_owners(model, name)
            if not owners or not _only_built_and_cleared(model, name, scope):
                continue
            if _object_steps_its_own(model, name):
                continue  # ``trainer.actor_optimizer = Adam(...)`` where a class's method steps ``self.actor_optimizer``
            others = [c for c in by_scope.get(id(scope), []) + by_scope.get(id(None), []) if c is not built]
            if any(owners & owners_of_construction(model, other) for other in others):
                continue  # another optimizer holds the same network: it may be the one that trains it
            found = _trained_through(model, owners, scope)
            if found is None or _rebuilt_around(model, built, found[0].node):
                continue
            backward, reach = found
            yield Report(
                backward.node,
                f"this backward runs through `{reach.owner}` (it calls `{model.code(reach.call.func)}`), whose "
                f"parameters `{name}` holds (built at line {model.line(built)}), but nothing in the module steps "
                f"`{name}` or hands it on: `{reach.owner}` never trains, and its gradients "
                f"{'are cleared unused' if _cleared(model, name, scope) else 'pile up'}; step `{name}` after this backward",
                event=backward,
            )


def _hooks_returning_no_optimizer(model: LoopModel) -> Iterator[Report]:
    """A framework hook that hands back the optimizers to step (Lightning's ``configure_optimizers``) that builds one
    and returns nothing (``self.optimizer = optim.Adam(...)`` as its last line): the framework steps none."""
    settings = framework_settings(model)
    for declared in frameworks.OPTIMIZERS_RETURNED:
        for owner in settings.classes_of(declared.classes):
            hook = model.index.class_methods.get(owner.name.value, {}).get(declared.hook)
            if hook is None:
                continue
            own = list(model.file.walk(hook.body))
            if any(type(n) in (cst.Yield, cst.Raise) or (type(n) is cst.Return and n.value is not None) for n in own):
                continue  # it hands something back (or refuses to build)
            built = next((n for n in own if type(n) is cst.Call and _builds_optimizer(model, n)), None)
            if built is None:
                continue
            kept = _kept_in(model, built)
            if kept is not None and "." in kept and _read_beside(model, kept, built):
                continue  # ``self.optimizer`` read elsewhere: the module may step it by hand
            yield Report(
                built,
                f"`{declared.hook}` builds this optimizer but returns nothing: {declared.none_returned}, so nothing "
                f"steps it and the parameters it holds never train; return it"
                + (f" (`return {kept}`)" if kept is not None else ""),
            )


def _kept_in(model: LoopModel, built: cst.Call) -> str | None:
    """The name an assignment binds the construction to (``self.optimizer = optim.Adam(...)``), if any."""
    parent = (model.parents or {}).get(built)
    if type(parent) is cst.Assign and len(parent.targets) == 1:
        return dotted_name(parent.targets[0].target)
    return None


def _read_beside(model: LoopModel, name: str, built: cst.Call) -> bool:
    """Whether the module reads ``name`` anywhere but where ``built`` is assigned to it."""
    target = (model.parents or {}).get(built).targets[0].target
    return any(
        type(n) is cst.Attribute and n is not target and dotted_name(n) == name
        for n in model.file.every_node(model.module)
    )


def _optimizers_built_once(model: LoopModel) -> Iterator[tuple[str, cst.Call, cst.FunctionDef | None]]:
    """``(name, construction, scope)`` for each optimizer built by one assignment: a local variable once in its
    function (two functions of the module may each build their own ``optimizer_d``), with that function as its scope;
    an attribute or a module-level name once in the whole module, with no scope."""
    index = model.index
    for function, table in index.assignments.items():
        for name in sorted(table):
            if not _an_optimizer(model, name):
                continue
            local = function is not None and "." not in name
            values = table[name] if local else index.assigned_anywhere(name)
            if len(values) == 1 and type(values[0]) is cst.Call:
                yield name, values[0], function if local else None


def _an_optimizer(model: LoopModel, name: str) -> bool:
    """Known as an optimizer by how it is built, or by its name (``self._optimizer`` as ``optimizer``)."""
    known = model.index.objects.get(name)
    if known is not None and known.kind is not ObjKind.UNKNOWN:
        return known.kind is ObjKind.OPTIMIZER
    last = name.rsplit(".", 1)[-1].lstrip("_")
    return bool(last) and kind_from_name(last) is ObjKind.OPTIMIZER


def _object_steps_its_own(model: LoopModel, name: str) -> bool:
    """Whether ``name`` is an attribute set on an object from outside (``trainer.critic_optimizer = Adam(...)``) that a
    method of some class of the module uses as its own (``self.critic_optimizer.step()``): the object may be an
    instance of that class (CORL's SPOT resets its optimizers so before online tuning)."""
    owner, _, attribute = name.rpartition(".")
    return bool(owner) and owner != "self" and not _only_built_and_cleared(model, f"self.{attribute}", None)


def _only_built_and_cleared(model: LoopModel, name: str, scope: cst.CSTNode | None, depth: int = 0) -> bool:
    """Whether every use of ``name`` in ``scope`` (the module when None) is its assignment or a harmless use
    (``zero_grad()``, its groups, saving it): never stepped, never handed to anything but a function of the module
    that only uses it harmlessly (``adjust_learning_rate(lr, optimizer_d, epoch)`` setting its groups' rate)."""
    parents = model.parents or {}
    for node in model.file.every_node(scope if scope is not None else model.module):
        if type(node) not in (cst.Name, cst.Attribute) or dotted_name(node) != name:
            continue
        parent = parents.get(node)
        if type(parent) in (cst.AssignTarget, cst.Param):
            continue
        if type(parent) is cst.Attribute and parent.value is node and parent.attr.value in _HARMLESS_OPTIMIZER_USES:
            continue
        if type(parent) is cst.Attribute and parent.value is node:
            return False  # ``opt.step()``, or anything else done with it
        if type(node) is cst.Name and type(parent) is cst.Attribute and parent.attr is node:
            continue  # the attribute name of ``self.opt`` (the whole is judged as an Attribute)
        if type(parent) is cst.Arg and (_handed_to_scheduler(model, parent)
                                        or depth == 0 and _handed_to_harmless_function(model, parent)):
            continue
        return False  # handed, returned, stored, compared: someone else may step it
    return True


def _cleared(model: LoopModel, name: str, scope: cst.CSTNode | None) -> bool:
    return any(
        type(node) is cst.Call and callee_name(node) == "zero_grad" and type(node.func) is cst.Attribute
        and dotted_name(node.func.value) == name
        for node in model.file.every_node(scope if scope is not None else model.module)
    )


def _handed_to_scheduler(model: LoopModel, arg: cst.Arg) -> bool:
    """Whether the argument builds a learning-rate scheduler of torch (or a known package): it sets the groups' rate,
    never steps the optimizer (``ReduceLROnPlateau(optimizer)``)."""
    call = (model.parents or {}).get(arg)
    return type(call) is cst.Call and any(
        kind_of_constructor(q) is ObjKind.SCHEDULER for q in model.index.qualified_names(call.func)
    )


def _handed_to_harmless_function(model: LoopModel, arg: cst.Arg) -> bool:
    """Whether the argument goes to a function of the module whose matching parameter is used only harmlessly."""
    call = (model.parents or {}).get(arg)
    if type(call) is not cst.Call:
        return False
    target = model.index.resolve_function(call, function_holding(model, call))
    if target is None or target.params.star_arg is not cst.MaybeSentinel.DEFAULT or target.params.star_kwarg is not None:
        return False
    params = list(target.params.params)
    if arg.keyword is not None:
        param = next((p for p in [*params, *target.params.kwonly_params] if p.name.value == arg.keyword.value), None)
    else:
        position = [a for a in call.args if a.keyword is None].index(arg)
        if params and params[0].name.value in ("self", "cls") and type(call.func) is cst.Attribute:
            position += 1
        param = params[position] if position < len(params) else None
    return param is not None and _only_built_and_cleared(model, param.name.value, target, depth=1)


def _rebuilt_around(model: LoopModel, built: cst.CSTNode, backward: cst.CSTNode) -> bool:
    """Whether the optimizer is built anew in a loop that also holds the backward: a fresh network and optimizer per
    round, whose gradients are read rather than applied (a test measuring gradient norms), not a training loop."""
    parents = model.parents or {}
    node = parents.get(built)
    while node is not None:
        if type(node) in (cst.For, cst.While) and lies_in(model, backward, node):
            return True
        node = parents.get(node)
    return False


def _trained_through(model: LoopModel, owners: frozenset[str], scope: cst.FunctionDef | None = None):
    """The first backward inside a loop whose loss visibly runs through one of ``owners`` (inside ``scope``, when
    given)."""
    for root in model.roots:
        for backward in root.events_of(EventKind.BACKWARD):
            if not backward.loops or backward.framework is not None:
                continue
            if scope is not None and not lies_in(model, backward.node, scope):
                continue
            reach = reaching_call(model, backward, owners)
            if reach is not None:
                return backward, reach
    return None


class ParameterInNoOptimizer(Rule):
    """A class keeps an ``nn.Parameter`` that none of the optimizers it builds holds.

    **Why it matters.** An agent or trainer that builds its optimizers over
    its networks (``Adam(self.actor.parameters())``) and keeps a learnable
    tensor beside them (``self.log_std = nn.Parameter(...)``, a temperature,
    a loss weight) gives that tensor gradients on every backward, but no
    optimizer steps it: it stays at its initial value, and with no clear its
    gradient grows for the whole run. Clipping it with the actor's
    parameters does not train it either.

    **Fix.** Hand it to an optimizer: ``Adam(list(self.actor.parameters()) +
    [self.log_std])``, or a parameter group of its own.

    **Stays quiet when** the class builds no optimizer (whoever builds one
    over the module's ``parameters()`` holds it), an optimizer it builds is
    given ``self.parameters()``, or the parameter is named in any optimizer's
    construction or ``add_param_group`` in the module (also through a list
    made first); or the parameter is built with ``requires_grad=False``, or
    never read (``fixtures/parameters/ok_gl020_parameter_in_optimizer.py``),
    or built under an ``if`` on an attribute of ``self`` that nothing in the
    module assigns (``if self.use_pbe_weight:``): a subclass of another
    module turns it on, and may build its own optimizer over it
    (``fixtures/realworld/ok_gl020_parameter_on_a_subclass_setting__UniFashion.py``).

    **Bad**::

        class PPO:
            def __init__(self, actor, critic, action_dim):
                self.actor, self.critic = actor, critic
                self.log_std = nn.Parameter(torch.zeros(action_dim))
                self.actor_optimizer = torch.optim.Adam(actor.parameters(), lr=3e-4)
                self.critic_optimizer = torch.optim.Adam(critic.parameters(), lr=1e-3)

    **Good**::

                self.actor_optimizer = torch.optim.Adam(
                    list(actor.parameters()) + [self.log_std], lr=3e-4
                )
    """

    code = "GL020"
    name = "parameter-in-no-optimizer"
    summary = "a class keeps an `nn.Parameter` that none of the optimizers it builds holds: it never trains"
    severity = Severity.ERROR
    fix = None  # which optimizer should hold it is the author's call
    needs = (("Parameter", call_of("parameters")),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        index = model.index
        if index is None:
            return
        for class_name, methods in index.class_methods.items():
            bodies = list(methods.values())
            kept = _parameters_kept(model, bodies)
            if not kept:
                continue
            optimizers = _optimizers_built(model, bodies)
            if not optimizers or any(_given_own_parameters(model, call) for call in optimizers):
                continue
            named = _named_in_optimizers(model)
            for target, node in kept:
                attribute = target.split(".", 1)[1]
                if attribute in named or not _read_elsewhere(model, bodies, target, node):
                    continue
                if _built_on_a_subclass_setting(model, node, methods):
                    continue
                owners = sorted({o for call in optimizers for o in owners_of_construction(model, call)})
                held = ", ".join(f"`{o}`" for o in owners) if owners else "other parameters"
                built = ("lines " if len(optimizers) > 1 else "line ") + ", ".join(str(model.line(call)) for call in optimizers)
                yield Report(
                    node,
                    f"`{target}` is an `nn.Parameter`, but every optimizer `{class_name}` builds ({built}) holds {held}: nothing "
                    f"steps it, so it never leaves its initial value (and its gradient piles up); hand it to one "
                    f"(`list(....parameters()) + [{target}]`) or give it a parameter group",
                )


def _built_on_a_subclass_setting(model: LoopModel, built: cst.CSTNode, methods: dict[str, cst.FunctionDef]) -> bool:
    """Whether the parameter is built under an ``if`` that reads an attribute of ``self`` which nothing in the module
    assigns and the class does not define (``if self.use_pbe_weight:``, set only by a subclass of another module): the
    subclass that turns it on may build its own optimizer, over this parameter too."""
    parents = model.parents or {}
    child, current = built, parents.get(built)
    while current is not None and type(current) is not cst.FunctionDef:
        if type(current) is cst.If and child is not current.test:
            for node in walk(current.test):
                name = dotted_name(node) if type(node) is cst.Attribute else None
                if name is None or not name.startswith("self.") or name.count(".") != 1:
                    continue
                if name.split(".", 1)[1] not in methods and not model.index.assigned_anywhere(name):
                    return True
        child, current = current, parents.get(current)
    return False


def _parameters_kept(model: LoopModel, methods: list[cst.FunctionDef]) -> list[tuple[str, cst.CSTNode]]:
    """``self.x = nn.Parameter(...)`` (trainable) in the class's methods."""
    found = []
    for method in methods:
        for node in model.file.walk(method.body):
            if type(node) is not cst.Assign or len(node.targets) != 1 or type(node.value) is not cst.Call:
                continue
            target = dotted_name(node.targets[0].target)
            if target is None or not target.startswith("self.") or target.count(".") != 1:
                continue
            if _torch_nn_name(model, node.value.func) != "Parameter":
                continue
            frozen = keyword_arg(node.value, "requires_grad") or (
                node.value.args[1] if len(node.value.args) > 1 and node.value.args[1].keyword is None else None
            )
            if frozen is not None and bool_literal(frozen.value) is False:
                continue
            found.append((target, node.value))
    return found


def _optimizers_built(model: LoopModel, methods: list[cst.FunctionDef]) -> list[cst.Call]:
    calls = []
    for method in methods:
        for node in model.file.walk(method.body):
            if type(node) is cst.Assign and type(node.value) is cst.Call and _builds_optimizer(model, node.value):
                calls.append(node.value)
    return calls


def _given_own_parameters(model: LoopModel, call: cst.Call) -> bool:
    """``Adam(self.parameters())``: the object's own parameters, this one among them (or something not told apart)."""
    owners = owners_of_construction(model, call)
    return not owners or "self" in owners


def _named_in_optimizers(model: LoopModel) -> set[str]:
    """The attribute names mentioned in any optimizer construction or ``add_param_group`` of the module, also through
    a name the argument is built in first (``params = [...] + [self.log_std]; Adam(params)``). One set per module: the
    names followed are shared by all constructions (a union), so each name's values are read once, not once per
    construction (which made a module of many copies of ``model = ...`` cost the square of its size)."""

    def read() -> set[str]:
        named: set[str] = set()
        seen: set[str] = set()
        pending: list[cst.CSTNode] = [
            a.value
            for node in model.file.every_node(model.module)
            if type(node) is cst.Call and (_builds_optimizer(model, node) or callee_name(node) == "add_param_group")
            for a in node.args
        ]
        followed: set[int] = set()
        while pending:
            for inner in model.file.walk(pending.pop()):
                if type(inner) is cst.Attribute:
                    named.add(inner.attr.value)
                if type(inner) is cst.Call:  # ``Adam(self.min_parameters())``: what the method of the module returns
                    helper = model.index.resolve_function(inner, function_holding(model, inner))
                    if helper is not None and id(helper) not in followed:
                        followed.add(id(helper))
                        pending.extend(model.index.returned(helper))
                name = dotted_name(inner) if type(inner) in (cst.Name, cst.Attribute) else None
                if name is not None and name not in seen:
                    seen.add(name)
                    pending.extend(v for v in model.index.assigned_anywhere(name) if isinstance(v, cst.BaseExpression))
        return named

    return model.file.once((_named_in_optimizers,), read)


def _read_elsewhere(model: LoopModel, methods: list[cst.FunctionDef], target: str, built: cst.CSTNode) -> bool:
    home = function_holding(model, built)
    return any(
        type(node) is cst.Attribute and dotted_name(node) == target
        for method in methods if method is not home
        for node in model.file.walk(method.body)
    )
