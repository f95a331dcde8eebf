"""Record, from a live run, the events the static loop model talks about.

The tracer patches the few torch entry points that clear, backpropagate, step,
unscale, clip or schedule, and registers PyTorch's own hooks where they exist
(the global optimizer step pre-hook, ``register_post_accumulate_grad_hook``,
DDP's communication hook). Each event carries the user's file and line and the
facts that the source cannot show: whether the gradients were already non-zero
when a backward started, which optimizers a backward reached, the constant the
loss was multiplied by at the root of its autograd graph, how many all-reduces
a backward paid.

Tracing only reads: parameters, gradients and optimizer state evolve exactly
as without it, and leaving the ``with`` block restores every patched function.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import inspect
import weakref
from typing import Any, Iterable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from gradlint.events import EventKind
from gradlint.runtime._patching import Patcher
from gradlint.runtime.clipping import ClipInterceptor
from gradlint.runtime.sites import Site, user_site


def in_backward() -> bool:
    """Whether the autograd engine is running a backward on this thread (we are inside one of its hooks)."""
    return torch._C._current_graph_task_id() != -1


class StopTraining(BaseException):
    """Raised from the optimizer step hook once the step budget is spent.

    A ``BaseException`` so that a script's ``except Exception`` does not swallow it.
    """


@dataclasses.dataclass
class Event:
    """One observed event: what happened, where in the user's code, and what was seen."""

    index: int
    kind: EventKind
    site: Site
    target: str | None = None
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        """A short human form, e.g. ``ZERO(SGD#0, set_to_none=False) @ train.py:12``."""
        parts = [self.target] if self.target else []
        for key, value in self.facts.items():
            if key in _SHOWN_FACTS and value not in (None, False):
                parts.append(f"{key}={_short(value)}")
        inner = f"({', '.join(parts)})" if parts else ""
        return f"{self.kind.value}{inner} @ {self.site}"


_SHOWN_FACTS = {"set_to_none", "scaled", "factor", "via_scaler", "skipped", "synced", "fn", "released"}


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def grad_state(params: Iterable[torch.Tensor]) -> str:
    """``"none"`` (no gradient allocated), ``"zero"`` (allocated, all zero) or ``"dirty"``.

    Gradients are looked at smallest first: one non-zero value decides, so in
    the usual case (gradients present) only the smallest one is read.
    """
    grads = [g for g in (p.grad for p in params) if g is not None]
    if not grads:
        return "none"
    grads.sort(key=_numel)
    for g in grads:
        values = g._values() if g.is_sparse else g
        if values.numel() <= _READ_AS_LIST:
            # A few values read into Python cost less than dispatching a reduction
            # and reading its result back (about 3 us against 15 us for a bias).
            if any(values.flatten().tolist()):
                return "dirty"
        elif values.any():
            return "dirty"
    return "zero"


_READ_AS_LIST = 256


def _numel(tensor: torch.Tensor) -> int:
    return tensor._nnz() if tensor.is_sparse else tensor.numel()


_SCALE_NODES = {"MulBackward0", "DivBackward0"}
_PASS_THROUGH_NODES = {"CloneBackward0", "AliasBackward0"}


def loss_factor(loss: torch.Tensor, skip_first_scale: bool = False) -> float:
    """The constant the loss was multiplied by at the root of its graph (``loss / 4`` gives 0.25).

    Walks down a chain of ``Mul``/``Div`` nodes whose other operand is a constant
    scalar (a Python number or a tensor that does not require grad). With
    ``skip_first_scale`` the first such node (a GradScaler's multiplication) is
    not counted.
    """
    factor = 1.0
    node = loss.grad_fn
    skipped = not skip_first_scale
    while node is not None:
        name = type(node).__name__
        if name not in _SCALE_NODES and name not in _PASS_THROUGH_NODES:
            break  # the usual root (a loss function's node): no next_functions tuple is built
        nexts = node.next_functions
        if name in _PASS_THROUGH_NODES and nexts:
            node = nexts[0][0]
            continue
        if name not in _SCALE_NODES or len(nexts) != 2:
            break
        if nexts[1][0] is None:
            const, node_next = getattr(node, "_saved_other", None), nexts[0][0]
        elif name == "MulBackward0" and nexts[0][0] is None:
            const, node_next = getattr(node, "_saved_self", None), nexts[1][0]
        else:
            break
        if not isinstance(const, torch.Tensor) or const.numel() != 1:
            break
        value = float(const)
        if not skipped:
            skipped = True
        elif name == "MulBackward0":
            factor *= value
        else:
            factor /= value
        node = node_next
    return factor


@functools.lru_cache(maxsize=64)
def _signature(function: Any) -> inspect.Signature:
    return inspect.signature(function)


def _set_to_none(function: Any, args: tuple, kwargs: dict) -> bool:
    if not kwargs and len(args) == 1:
        return True  # zero_grad() with no arguments: the default, set_to_none=True
    try:
        bound = _signature(function).bind(*args, **kwargs)
    except TypeError:
        return True
    bound.apply_defaults()
    return bool(bound.arguments.get("set_to_none", True))


class Tracer:
    """Context manager that records :class:`Event` s while a training loop runs.

    ``max_steps``: raise :class:`StopTraining` when optimizer step number
    ``max_steps + 1`` is about to run, so exactly ``max_steps`` steps happen and
    everything between the last step and the next one is still seen.
    ``executed``: ``(path, line)`` pairs the runner reports as run (for "not reached").
    """

    def __init__(self, max_steps: int | None = None) -> None:
        self.max_steps = max_steps
        self.events: list[Event] = []
        self.steps = 0
        self.executed: set[tuple[str, int]] = set()
        self._patcher = Patcher()
        self._labels: dict[int, tuple[weakref.ref, str]] = {}  # id -> (object, label): cheaper than a weak-key dict
        self._label_counts: dict[str, int] = {}
        self._watched: dict[int, weakref.ref] = {}
        self._param_owners: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._scaled: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._scaler_used = False  # spares the backward a weak dictionary's Python-level len() while no scaler ran
        self._ddp_hooked: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._touched: set[int] = set()
        self._allreduces = 0
        self._depth = 0
        self._scaler_in_step: str | None = None
        self._released: dict[str, int] = {}
        self.release_loop = False  # the loop steps inside backward (gradient release)
        self.disabled_scalers: set[str] = set()  # GradScalers seen with enabled=False: every call passes through
        self.active = False

    # ---------------------------------------------------------------- labels
    def label(self, obj: Any) -> str:
        """A stable short name for an optimizer, scaler or scheduler: ``SGD#0``."""
        known = self._labels.get(id(obj))
        if known is not None and known[0]() is obj:
            return known[1]
        kind = type(obj).__name__
        n = self._label_counts.get(kind, 0)
        self._label_counts[kind] = n + 1
        name = f"{kind}#{n}"
        self._labels[id(obj)] = (weakref.ref(obj), name)
        return name

    def watch(self, optimizer: torch.optim.Optimizer) -> str:
        """Start following an optimizer's parameters and return its label.

        Optimizers created while tracing are watched automatically; labels are
        handed out in order of first appearance in the trace.
        """
        self._follow(optimizer)
        return self.label(optimizer)

    def _follow(self, optimizer: torch.optim.Optimizer) -> None:
        key = id(optimizer)
        ref = self._watched.get(key)
        if ref is not None and ref() is optimizer:
            return
        self._watched[key] = weakref.ref(optimizer)
        for group in optimizer.param_groups:
            for p in group["params"]:
                owners = self._param_owners.get(p)
                if owners is None:
                    owners = self._param_owners[p] = set()
                    if p.requires_grad and p.is_leaf:
                        # A gradient hook, not a post-accumulate one: torch-optimi's
                        # prepare_for_gradient_release refuses parameters that have those.
                        self._patcher.keep(p.register_hook(self._reached_hook(owners)))
                owners.add(key)

    def _live_optimizers(self) -> dict[int, torch.optim.Optimizer]:
        live = {}
        for key, ref in self._watched.items():
            opt = ref()
            if opt is not None:
                live[key] = opt
        return live

    @staticmethod
    def _params(opt: torch.optim.Optimizer) -> Iterable[torch.Tensor]:
        for group in opt.param_groups:
            yield from group["params"]

    # ---------------------------------------------------------------- record
    def _record(self, kind: EventKind, target: str | None = None, **facts: Any) -> Event:
        event = Event(len(self.events), kind, user_site(), target, facts)
        self.events.append(event)
        return event

    def _reached_hook(self, owners: set[int]) -> Any:
        """A gradient hook that marks the optimizers in ``owners`` (a live set) as reached by this backward."""

        def reached(grad: torch.Tensor) -> None:
            self._touched.update(owners)

        return reached

    # ---------------------------------------------------------------- hooks and patches
    def _on_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        name = self.watch(opt)
        if in_backward():
            # Gradient release (torch-optimi, a post-accumulate hook): a parameter
            # stepped inside backward. The backward as a whole is one loop step.
            self._released[name] = self._released.get(name, 0) + 1
            return
        self._check_budget()
        self.steps += 1
        self._record(
            EventKind.STEP,
            name,
            via_scaler=self._scaler_in_step,
            grads=grad_state(self._params(opt)),
            loop_step=self.steps,
        )

    def _check_budget(self) -> None:
        if self.max_steps is not None and self.steps >= self.max_steps:
            raise StopTraining(f"stopped after {self.steps} optimizer steps")

    def _record_released_steps(self) -> None:
        """One loop step for a backward whose parameters were stepped inside it."""
        if not self._released:
            return
        self.steps += 1
        self.release_loop = True
        for name, count in self._released.items():
            self._record(EventKind.STEP, name, grads="released", released=count, loop_step=self.steps)
        self._released = {}

    def _wrap_backward(self, original: Any) -> Any:
        tracer = self

        def backward(*args: Any, **kwargs: Any) -> Any:
            if tracer._depth or in_backward():
                return original(*args, **kwargs)
            if tracer.release_loop:
                tracer._check_budget()
            first = args[0] if args else next(iter(kwargs.values()), None)
            loss = first[0] if isinstance(first, (list, tuple)) and first else first
            scaler = tracer._scaled.get(loss) if tracer._scaler_used and isinstance(loss, torch.Tensor) else None
            live = tracer._live_optimizers()
            before = {key: grad_state(tracer._params(opt)) for key, opt in live.items()}
            factor = loss_factor(loss, skip_first_scale=scaler is not None) if isinstance(loss, torch.Tensor) else 1.0
            event = tracer._record(EventKind.BACKWARD, None, scaled=scaler, factor=factor)
            tracer._touched = set()
            tracer._allreduces = 0
            tracer._depth += 1
            tracer._released = {}
            try:
                result = original(*args, **kwargs)
            finally:
                tracer._depth -= 1
                touched = [live[k] for k in tracer._touched if k in live]
                event.facts["touched"] = sorted(tracer.label(opt) for opt in touched)
                event.facts["before"] = {tracer.label(opt): before[id(opt)] for opt in touched}
                event.facts["synced"] = tracer._allreduces
            if tracer._released:
                tracer._record_released_steps()
            return result

        return backward

    def _wrap_zero(self, original: Any, via: str) -> Any:
        tracer = self

        def zero_grad(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if not tracer._depth:
                set_to_none = _set_to_none(original, (obj, *args), kwargs)
                if via == "optimizer":
                    targets = [tracer.watch(obj)]
                else:
                    params = {id(p) for p in obj.parameters()}
                    targets = sorted(
                        tracer.label(opt)
                        for opt in tracer._live_optimizers().values()
                        if any(id(p) in params for p in tracer._params(opt))
                    )
                tracer._record(EventKind.ZERO, ",".join(targets) or None, set_to_none=set_to_none, via=via, targets=targets)
            return original(obj, *args, **kwargs)

        return zero_grad

    def _wrap_plain(self, original: Any, kind: EventKind, target_of: Any = None, **static_facts: Any) -> Any:
        """Record ``kind`` once per outermost call; nested calls (library internals) pass through."""
        tracer = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if tracer._depth:
                return original(*args, **kwargs)
            target = target_of(*args) if target_of else None
            if target is not False:
                tracer._record(kind, target, **static_facts)
            tracer._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                tracer._depth -= 1

        return wrapper

    def _wrap_scale(self, original: Any) -> Any:
        tracer = self

        def scale(scaler: Any, outputs: Any) -> Any:
            tracer._scaler_enabled(scaler)
            result = original(scaler, outputs)
            if isinstance(result, torch.Tensor) and result is not outputs:
                tracer._scaled[result] = tracer.label(scaler)
                tracer._scaler_used = True
            return result

        return scale

    def _wrap_scaler_step(self, original: Any) -> Any:
        tracer = self

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if not tracer._scaler_enabled(scaler):
                return original(scaler, optimizer, *args, **kwargs)  # a plain optimizer.step()
            name = tracer.label(scaler)
            steps_before = tracer.steps
            tracer._scaler_in_step = name
            tracer._depth += 1
            try:
                result = original(scaler, optimizer, *args, **kwargs)
            finally:
                tracer._depth -= 1
                tracer._scaler_in_step = None
            if tracer.steps == steps_before:
                # inf/NaN found: the scaler skipped the optimizer step.
                tracer._record(EventKind.STEP, tracer.watch(optimizer), via_scaler=name, skipped=True, grads="skipped", loop_step=tracer.steps)
            return result

        return step

    def _scaler_enabled(self, scaler: Any) -> bool:
        """Whether ``scaler`` does anything; a disabled one (``enabled=False``, or no CUDA) passes everything through."""
        enabled = scaler.is_enabled()
        if not enabled:
            self.disabled_scalers.add(self.label(scaler))
        return enabled

    def _scaler_target(self, scaler: Any, target: str) -> str | bool:
        """The event target for a scaler call, or ``False`` (record nothing) when the scaler is disabled."""
        return target if self._scaler_enabled(scaler) else False

    def _wrap_sched_step(self, original: Any) -> Any:
        tracer = self

        def step(sched: Any, *args: Any, **kwargs: Any) -> Any:
            if tracer._depth or getattr(sched, "_is_initial", False):
                return original(sched, *args, **kwargs)
            opt = getattr(sched, "optimizer", None)
            tracer._record(
                EventKind.SCHED_STEP,
                tracer.label(sched),
                optimizer=tracer.watch(opt) if isinstance(opt, torch.optim.Optimizer) else None,
            )
            tracer._depth += 1
            try:
                return original(sched, *args, **kwargs)
            finally:
                tracer._depth -= 1

        return step

    def _wrap_optimizer_init(self, original: Any) -> Any:
        tracer = self

        def __init__(opt: Any, *args: Any, **kwargs: Any) -> None:
            original(opt, *args, **kwargs)
            tracer._follow(opt)

        return __init__

    def _count_allreduce(self, hook: Any) -> Any:
        tracer = self

        # No annotations: DDP checks a comm hook's signature and accepts only
        # dist.GradBucket / Future[Tensor] or none at all.
        def counting_hook(state, bucket):  # type: ignore[no-untyped-def]
            tracer._allreduces += 1
            return hook(state, bucket)

        return counting_hook

    def _patch_ddp(self) -> None:
        if not torch.distributed.is_available():
            return
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel as DDP

        tracer = self
        register = DDP.register_comm_hook
        forward = DDP.forward

        def register_comm_hook(ddp: Any, state: Any, hook: Any) -> None:
            tracer._ddp_hooked[ddp] = True
            return register(ddp, state, tracer._count_allreduce(hook))

        def ddp_forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            if ddp not in tracer._ddp_hooked:
                # The stock all-reduce hook, wrapped to count: DDP documents it as
                # behaving like no hook at all.
                register_comm_hook(ddp, ddp.process_group, allreduce_hook)
            return forward(ddp, *args, **kwargs)

        self._patcher.set(DDP, "register_comm_hook", register_comm_hook)
        self._patcher.set(DDP, "forward", ddp_forward)

    # ---------------------------------------------------------------- install
    def __enter__(self) -> "Tracer":
        from torch.amp.grad_scaler import GradScaler
        from torch.optim import lr_scheduler
        from torch.optim.optimizer import (
            Optimizer,
            register_optimizer_step_pre_hook,
        )

        if self.active:
            raise RuntimeError("a Tracer cannot be entered twice")
        p = self._patcher
        # Tensor.backward calls torch.autograd.backward through the module attribute:
        # one wrapper sees both spellings (torch/_tensor.py).
        p.set(torch.autograd, "backward", self._wrap_backward(torch.autograd.backward))
        p.set(Optimizer, "zero_grad", self._wrap_zero(Optimizer.zero_grad, "optimizer"))
        p.set(torch.nn.Module, "zero_grad", self._wrap_zero(torch.nn.Module.zero_grad, "module"))
        p.set(Optimizer, "__init__", self._wrap_optimizer_init(Optimizer.__init__))
        p.keep(register_optimizer_step_pre_hook(self._on_step))

        self._clipping = ClipInterceptor(lambda name, original: self._wrap_plain(original, EventKind.CLIP, fn=name))

        p.set(GradScaler, "scale", self._wrap_scale(GradScaler.scale))
        p.set(
            GradScaler,
            "unscale_",
            self._wrap_plain(
                GradScaler.unscale_, EventKind.UNSCALE, target_of=lambda s, o, *a: self._scaler_target(s, self.watch(o))
            ),
        )
        p.set(GradScaler, "step", self._wrap_scaler_step(GradScaler.step))
        p.set(
            GradScaler,
            "update",
            self._wrap_plain(
                GradScaler.update, EventKind.SCALER_UPDATE, target_of=lambda s, *a: self._scaler_target(s, self.label(s))
            ),
        )
        for cls in _scheduler_classes(lr_scheduler.LRScheduler):
            p.set(cls, "step", self._wrap_sched_step(cls.__dict__["step"]))
        self._patch_ddp()

        for obj in gc.get_objects():  # optimizers built before tracing started
            if issubclass(type(obj), Optimizer):
                self._follow(obj)
        self.active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self._clipping.restore()
        self._patcher.restore()
        self.active = False


def _scheduler_classes(base: type) -> list[type]:
    """``base`` and every loaded subclass that defines its own ``step``."""
    found, todo = [], [base]
    while todo:
        cls = todo.pop()
        if "step" in cls.__dict__ and cls not in found:
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return found
