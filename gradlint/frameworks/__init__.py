"""The registry of framework modules: what each framework's calls do, asked in the loop model's terms.

One module per framework declares a :class:`~gradlint.frameworks.framework.Framework`
(see :mod:`gradlint.frameworks.framework` for the terms). Nothing outside
this package names a framework to decide anything: the event builder, the
module and project indexes, the release walk and the rules ask the tables
and functions below, and take a framework's words for messages from its
declarations.

:data:`FRAMEWORKS` lists the modules in the order in which their
declarations are tried when two could match the same code (a backward
whose receiver is known by its kind, a wrapper class of a name two
libraries use): adding a framework is one module and one line here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from gradlint.frameworks import (
    accelerate,
    apex,
    colossalai,
    deepspeed,
    fp16_optimizers,
    gradlint_runtime,
    hf_trainer,
    higher,
    lightning,
    opacus,
    optimi,
    ray_train,
    stable_baselines3,
    torch_ddp,
    torch_geometric,
    torch_xla,
    torchtune,
)
from gradlint.frameworks.framework import (
    AccumulateContext,
    Backward,
    Framework,
    LossHook,
    SchedulersLeftToModule,
    NoSyncContext,
    OptimizersReturned,
    ReleaseCall,
    ReleaseStyle,
    ReturnedLoss,
    ShardedGrads,
    SyncFlag,
    SyncSwitch,
    Wrap,
)
from gradlint.kinds import ObjKind
from gradlint.syntax import callee_name, terminal, walk

if TYPE_CHECKING:
    from gradlint.model import Event, Frame, LoopModel
    from gradlint.module_index import ModuleIndex

FRAMEWORKS: tuple[Framework, ...] = (
    torch_ddp.FRAMEWORK,
    accelerate.FRAMEWORK,
    lightning.FRAMEWORK,
    deepspeed.FRAMEWORK,
    apex.FRAMEWORK,
    ray_train.FRAMEWORK,
    fp16_optimizers.FRAMEWORK,
    hf_trainer.FRAMEWORK,
    optimi.FRAMEWORK,
    torchtune.FRAMEWORK,
    opacus.FRAMEWORK,
    torch_xla.FRAMEWORK,
    colossalai.FRAMEWORK,
    torch_geometric.FRAMEWORK,
    stable_baselines3.FRAMEWORK,
    higher.FRAMEWORK,
    gradlint_runtime.FRAMEWORK,
)


def _merged(field: str) -> dict:
    merged: dict = {}
    for framework in FRAMEWORKS:
        for key, value in getattr(framework, field).items():
            merged.setdefault(key, value)
    return merged


def _joined(field: str) -> tuple:
    return tuple(item for framework in FRAMEWORKS for item in getattr(framework, field))


# -- objects: what constructors and calls return (gradlint.objects, gradlint.module_index)

BUILDS: dict[str, ObjKind] = _merged("builds")
OPTIMIZER_MODULES: tuple[str, ...] = _joined("optimizer_modules")
SCHEDULE_FACTORY_MODULES: tuple[str, ...] = _joined("schedule_factory_modules")
NAMED: dict[str, ObjKind] = _merged("named")
RETURNS_GIVEN: frozenset[str] = frozenset(_joined("returns_given"))
RETURNS_GIVEN_ALONE: frozenset[str] = frozenset(_joined("returns_given_alone"))
RETURNS_BY_POSITION: dict[str, dict[int, ObjKind]] = _merged("returns_by_position")

_LAYER_FAMILIES = _joined("layers_with_parameters")
# Base classes whose methods build the optimizer over ``self.parameters()`` (GL028)
OPTIMIZER_BUILT_BY_SUPER: tuple = _joined("optimizer_built_by_super")


def layer_with_parameters(qualified: str) -> bool:
    """Whether a class, by its qualified name, is a library's layer that holds learnable parameters."""
    module, _, name = qualified.rpartition(".")
    return any(
        (module == f.module or module.startswith(f.module + ".")) and name.endswith(f.suffix) and name not in f.without
        for f in _LAYER_FAMILIES
    )


# -- sharded gradients: wrappers whose ranks each hold a shard of every gradient

SHARDED_GRADS: tuple[ShardedGrads, ...] = _joined("sharded_grads")

# -- backwards

_BACKWARDS: tuple[Backward, ...] = _joined("backwards")
BACKWARD_METHODS: frozenset[str] = frozenset(b.method for b in _BACKWARDS)
_BACKWARDS_OF: dict[str, tuple[Backward, ...]] = {m: tuple(b for b in _BACKWARDS if b.method == m) for m in BACKWARD_METHODS}
_BY_KEY: dict[str, Backward] = {b.by: b for b in reversed(_BACKWARDS) if b.by is not None}
# Every key an event's ``framework`` may hold for a framework (its backwards' and its clips'), and whose it is.
_FRAMEWORK_OF_KEY: dict[str, Framework] = {
    key: framework
    for framework in reversed(FRAMEWORKS)
    for key in (*(b.by for b in framework.backwards if b.by is not None), *framework.clip_owner_kinds.values())
}


def backward_of(method: str | None, owner: str, owner_kind: ObjKind) -> Backward | None:
    """The framework backward a call ``<owner>.<method>(...)`` is: ``owner`` is the receiver's last name.

    A declaration for any receiver first, then the receiver's name across
    every framework, then, framework by framework, its kind or its spelling.
    """
    candidates = _BACKWARDS_OF.get(method, ()) if method is not None else ()
    for backward in candidates:
        if backward.any_owner:
            return backward
    for backward in candidates:
        if owner in backward.owners:
            return backward
    for backward in candidates:
        if owner_kind in backward.owner_kinds or (backward.owner_pattern is not None and backward.owner_pattern.search(owner)):
            return backward
    return None


def divides_outputs(owner: str, owner_kind: ObjKind) -> bool:
    """Whether a framework object called as ``owner(...)`` returns tensors whose plain ``.backward()`` it divides by its
    accumulation count (DeepSpeed's engine hooks its outputs): ``owner`` is the callee's last name."""
    return any(
        backward.divides_outputs and (
            owner in backward.owners or owner_kind in backward.owner_kinds
            or (backward.owner_pattern is not None and backward.owner_pattern.search(owner))
        )
        for backward in _BACKWARDS
    )


def divides_by_count(event: Event) -> bool:
    """Whether the event's framework divided the loss by its accumulation count before backpropagating it."""
    backward = _BY_KEY.get(event.framework) if event.framework is not None else None
    return backward is not None and backward.divides_by_count


def all_reduces_as_plain(event: Event) -> bool:
    """Whether a backward all-reduces as a plain one would: no framework, or one that leaves the all-reduce to the
    wrapped model (anything else, a framework's own or a replayed graph's, decides when it all-reduces)."""
    if event.framework is None or event.framework == "handed":
        return True  # "handed": a helper of the run whose own backward is a plain one (``loss_scaler(loss, opt)``)
    backward = _BY_KEY.get(event.framework)
    return backward is not None and not backward.decides_sync


def dividing_backward(event: Event) -> Backward | None:
    """The declaration of the event's backward when it divides by a count whose spelling GL007 knows."""
    backward = _BY_KEY.get(event.framework) if event.framework is not None else None
    return backward if backward is not None and backward.count is not None else None


DIVIDED_COUNT_TOKENS: tuple[str, ...] = tuple(dict.fromkeys(t for b in _BACKWARDS if b.count is not None for t in b.count.tokens))
RETURNED_LOSSES: tuple[ReturnedLoss, ...] = _joined("returned_losses")
LOSS_HOOKS: tuple[LossHook, ...] = _joined("loss_hooks")
SCHEDULERS_LEFT: tuple[SchedulersLeftToModule, ...] = _joined("schedulers_left")
OPTIMIZERS_RETURNED: tuple[OptimizersReturned, ...] = _joined("optimizers_returned")
OWNS_BACKWARDS_OF: tuple[str, ...] = _joined("owns_backwards_of")

# -- keeping a backward from all-reducing

NO_SYNC: dict[str, NoSyncContext] = {c.method: c for c in reversed(_joined("no_sync"))}
# Methods of the wrapped model itself (``model.no_sync()``): picked into a variable and entered later, chosen by a test.
MODEL_NO_SYNC: frozenset[str] = frozenset(m for m, c in NO_SYNC.items() if c.model_argument is None)
SYNC_SWITCHES: dict[str, SyncSwitch] = {s.method: s for s in reversed(_joined("sync_switches"))}
SYNC_FLAGS: dict[str, SyncFlag] = {f.attribute: f for f in reversed(_joined("sync_flags"))}
ACCUMULATE: dict[str, AccumulateContext] = {c.method: c for c in reversed(_joined("accumulate"))}
# What a file must spell for a framework's clip to unscale on every micro-batch inside its accumulation block.
UNSCALING_CLIP_TOKENS: tuple[tuple[str, ...], ...] = tuple(
    (c.method, *c.unscaling_clip.tokens) for c in _joined("accumulate") if c.unscaling_clip is not None
)
# What a ``with`` item's call makes the block: its context in the loop model's words.
CONTEXTS: dict[str, str] = {**dict.fromkeys(NO_SYNC, "no_sync"), **dict.fromkeys(ACCUMULATE, "accumulate")}
SYNC_STEP_FLAGS: frozenset[str] = frozenset(c.sync_flag for c in ACCUMULATE.values())
COMM_HOOKS: dict[str, tuple[int, str]] = _merged("comm_hooks")


def accumulate_call(frame: Frame) -> tuple[AccumulateContext, cst.Call] | None:
    """The framework's accumulation context a ``with`` frame enters, and its call (``accelerator.accumulate(model)``)."""
    node = frame.node
    if type(node) is not cst.With:
        return None
    for item in node.items:
        for sub in walk(item.item):
            if type(sub) is cst.Call:
                context = ACCUMULATE.get(callee_name(sub) or "")
                if context is not None:
                    return context, sub
    return None


def accumulate_owner(frame: Frame) -> tuple[AccumulateContext, str | None] | None:
    """For the block of ``with self.accelerator.accumulate(model):``, the framework's accumulation context and the
    last name of the object whose context it is (``accelerator``); None for any other frame."""
    if frame.kind.value != "with" or frame.context != "accumulate" or type(frame.node) is not cst.With:
        return None
    for item in frame.node.items:
        call = item.item
        if type(call) is cst.Call and type(call.func) is cst.Attribute and call.func.attr.value in ACCUMULATE:
            return ACCUMULATE[call.func.attr.value], terminal(call.func.value)
    return None


# -- wraps

WRAPS: dict[str, Wrap] = {w.key: w for w in reversed(_joined("wraps"))}


def count_above_one_only_under_own_engine(model: LoopModel, count: cst.BaseExpression | None) -> bool:
    """Whether an accumulation count can exceed 1 only where a framework's engine steps at its own boundary (accelerate's
    count read from a DeepSpeed config, else 1): there the loop's own guard never decides a step."""
    return any(w.quiet_for_count is not None and w.quiet_for_count(model, count) for w in WRAPS.values())
WRAP_CLASSES: dict[str, Wrap] = {w.class_name: w for w in reversed(_joined("wraps")) if w.class_name is not None}
SHARD_FUNCTIONS: dict[str, Wrap] = {w.function: w for w in reversed(_joined("wraps")) if w.function is not None}
PREPARE_METHODS: dict[str, Wrap] = {m: w for w in reversed(_joined("wraps")) for m in w.prepare_methods}
PREPARER_NAMES: frozenset[str] = frozenset(n for w in WRAPS.values() for n in w.owner_names)
HOOKED_WRAPS: tuple[Wrap, ...] = tuple(w for w in _joined("wraps") if w.hooks_at_wrap)
_CONSTRUCTED: dict[str, Wrap] = {c: w for w in reversed(_joined("wraps")) for c in w.constructors}


def wrap_of_constructor(qualified: str) -> Wrap | None:
    """The wrap a constructor's qualified name builds (``torch.nn.parallel.DistributedDataParallel``), if any."""
    return _CONSTRUCTED.get(qualified)


def wrap_in_words(model: LoopModel, name: str, wrap: Wrap) -> Wrap:
    """The wrap whose words a message about ``name`` takes: another library's class of the same name when the module
    builds ``name`` with it (the project index reads no imports and takes a class for the first of its name)."""
    if wrap.class_name is None or model.index is None:
        return wrap
    others = [w for w in _joined("wraps") if w.class_name == wrap.class_name and w is not wrap and w.constructor_prefix]
    if not others:
        return wrap
    built = [value for value in model.index.assigned_anywhere(name) if type(value) is cst.Call]
    for other in others:
        if any(any(q.startswith(other.constructor_prefix) for q in model.index.qualified_names(call.func)) for call in built):
            return other
    return wrap


# -- the rest the event builder and the model builder ask

CLIP_METHODS: frozenset[str] = frozenset(_joined("clip_methods"))
CLIP_OWNER_KINDS: dict[ObjKind, str] = _merged("clip_owner_kinds")
AVERAGING_STEPS: frozenset[str] = frozenset(_joined("averaging_steps"))
# Constructors of optimizers whose ``step()`` clears the gradients itself (GL001 needs no clear beside it)
CLEARING_STEPS: frozenset[str] = frozenset(_joined("clearing_steps"))
STEP_FUNCTIONS: dict[str, str] = _merged("step_functions")
EPOCH_END_FLAGS: frozenset[str] = frozenset(_joined("epoch_end_flags"))
PASS_INDEX: dict[str, int] = _merged("pass_index")
LOSS_SCALERS: frozenset[str] = frozenset(_joined("loss_scalers"))
OPTIMIZERS_OF_HOOK: dict[str, str] = _merged("optimizers_of_hook")
GRAD_TOGGLES: frozenset[str] = frozenset(_joined("grad_toggles"))
KEEPS_GRADIENTS: frozenset[str] = frozenset(_joined("keeps_gradients"))
HOOKS_BEFORE_STEP: frozenset[str] = frozenset(_joined("hooks_before_step"))


def per_batch_functions(index: ModuleIndex) -> dict[cst.FunctionDef, str]:
    """The functions some framework calls once per batch, leaving them the gradient work, and why (for messages)."""
    found: dict[cst.FunctionDef, str] = {}
    for framework in FRAMEWORKS:
        if framework.per_batch is not None:
            for function, why in framework.per_batch(index).items():
                found.setdefault(function, why)
    return found


def counts_at_one(index: ModuleIndex) -> dict[cst.FunctionDef, frozenset[str]]:
    """The settings (dotted names) some framework holds at 1 while each function runs; functions with none are left out.

    Computed once per file.
    """

    def compute() -> dict[cst.FunctionDef, frozenset[str]]:
        found: dict[cst.FunctionDef, frozenset[str]] = {}
        for framework in FRAMEWORKS:
            if framework.counts_at_one is not None:
                for function, names in framework.counts_at_one(index).items():
                    found[function] = found.get(function, frozenset()) | names
        return found

    return index.file.once(counts_at_one, compute)


# -- gradient release

RELEASE_CALLS: dict[str, ReleaseCall] = {name: call for call in reversed(_joined("release_calls")) for name in call.names}
RELEASE_KEYWORDS: dict[str, str] = {f.release_keyword[0]: f.release_keyword[1] for f in reversed(FRAMEWORKS) if f.release_keyword}
RELEASE_STYLES: dict[str, ReleaseStyle] = {s.style: s for s in reversed(_joined("release_styles"))}
RELEASE_TOKENS: tuple[str, ...] = tuple(dict.fromkeys(_joined("release_tokens")))


def _first(field: str) -> str | None:
    return next((getattr(f, field) for f in FRAMEWORKS if getattr(f, field) is not None), None)


RELEASE_ACCUMULATION_FIX: str | None = _first("release_accumulation_fix")
RELEASE_ACCUMULATES_INTO: str | None = _first("release_accumulates_into")
RELEASE_CLIPPING_FIX: str | None = _first("release_clipping_fix")
