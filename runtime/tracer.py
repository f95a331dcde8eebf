"""Record, from a live run, the events the static loop model talks about.

The tracer patches the few torch entry points that clear, backpropagate, step,
unscale, clip or schedule, and registers PyTorch's own hooks where they exist
(the global optimizer step pre-hook, DDP's communication hook, and at each
backward one hook on its root node that asks the autograd engine which
parameters' gradient nodes the graph will run). Each event carries the user's file and line and the
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
import itertools
import operator
import sys
import weakref
from typing import Any, Iterable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from gradlint.events import EventKind
from gradlint.runtime._patching import Patcher
from gradlint.runtime.accumulators import grad_accumulator
from gradlint.runtime.clipping import ClipInterceptor
from gradlint.runtime.ddp_hook import WaitableAllreduce
from gradlint.runtime.sites import Site, user_site


def in_backward() -> bool:
    """Whether the autograd engine is running a backward on this thread (we are inside one of its hooks)."""
    return torch._C._current_graph_task_id() != -1


class StopTraining(BaseException):
    """Raised from the optimizer step hook once the step budget is spent.

    A ``BaseException`` so that a script's ``except Exception`` does not swallow it.
    """


@dataclasses.dataclass(slots=True)
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

    Gradients are read in the order given and one non-zero value decides: the
    tracer passes each optimizer's parameters smallest first, so in the usual
    case (gradients present) only the smallest one is read.
    """
    state = "none"
    for p in params:
        grad = p.grad
        if grad is None:
            continue
        if _has_nonzero(grad):
            return "dirty"
        state = "zero"
    return state


def _has_nonzero(grad: torch.Tensor) -> bool:
    values = grad._values() if grad.is_sparse else grad
    if values.numel() <= _READ_AS_LIST:
        # A few values read into Python cost less than dispatching a reduction
        # and reading its result back (about 3 us against 15 us for a bias).
        return any((values if values.dim() == 1 else values.flatten()).tolist())
    return bool(values.any())


_READ_AS_LIST = 256


_SCALE_NODES = {"MulBackward0", "DivBackward0"}
_PASS_THROUGH_NODES = {"CloneBackward0", "AliasBackward0"}


def loss_factor(loss: torch.Tensor, skip_first_scale: bool = False) -> float:
    """The constant the loss was multiplied by at the root of its graph (``loss / 4`` gives 0.25).

    Walks down a chain of ``Mul``/``Div`` nodes whose other operand is a constant
    scalar (a Python number or a tensor that does not require grad). With
    ``skip_first_scale`` the first such node (a GradScaler's multiplication) is
    not counted.
    """
    return _factor_below(loss.grad_fn, skip_first_scale)


def _factor_below(node: Any, skip_first_scale: bool) -> float:
    """:func:`loss_factor` from the loss's node."""
    factor = 1.0
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


def _roots(args: tuple, kwargs: dict) -> tuple:
    """The roots given to ``torch.autograd.backward(tensors, ...)``: tensors or ``GradientEdge`` s."""
    tensors = args[0] if args else kwargs.get("tensors")
    if isinstance(tensors, (list, tuple)):
        return tuple(tensors)
    return () if tensors is None else (tensors,)


def _root_nodes(roots: tuple) -> list[Any]:
    """The autograd node each of ``roots`` starts a backward at (a leaf at its ``AccumulateGrad``; ``None`` for none)."""
    nodes = []
    for root in roots:
        if isinstance(root, torch.Tensor):
            node = root.grad_fn
            if node is None:
                node = grad_accumulator(root)
        else:
            node = getattr(root, "node", None)  # a GradientEdge
        nodes.append(node)
    return nodes


@functools.lru_cache(maxsize=64)
def _signature(function: Any) -> inspect.Signature:
    return inspect.signature(function)


def _set_to_none(function: Any, args: tuple, kwargs: dict) -> bool:
    """The ``set_to_none`` a ``zero_grad`` call given arguments (``self`` first) runs with."""
    try:
        bound = _signature(function).bind(*args, **kwargs)
    except TypeError:
        return True
    bound.apply_defaults()
    return bool(bound.arguments.get("set_to_none", True))


_group_params = operator.itemgetter("params")


def _all_params(optimizer: torch.optim.Optimizer) -> Iterable[torch.Tensor]:
    """Every parameter of every group, iterated without a Python frame per group."""
    return itertools.chain.from_iterable(map(_group_params, optimizer.param_groups))


class _Followed:
    """An optimizer the tracer follows: its label and its parameters, re-read only when they change.

    ``smallest_first`` orders the parameters for :func:`grad_state`;
    ``accumulators`` holds the ``AccumulateGrad`` node of each parameter that
    requires a gradient, which tells whether a backward reaches the optimizer.
    The parameters are re-read when the identity of any parameter differs from
    the last read (``add_param_group``, a group's list edited in place).
    """

    __slots__ = ("accumulators", "label", "layout", "smallest_first")

    def __init__(self) -> None:
        self.label: str | None = None  # handed out at the optimizer's first appearance in the trace
        self.layout: tuple[int, ...] | None = None
        self.smallest_first: list[torch.Tensor] = []
        self.accumulators: list[Any] = []

    def params(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        """The optimizer's parameters now, smallest first."""
        layout = tuple(map(id, _all_params(optimizer)))
        if layout != self.layout:
            params = list(_all_params(optimizer))
            self.smallest_first = sorted(params, key=torch.Tensor.numel)
            self.accumulators = [node for node in map(grad_accumulator, params) if node is not None]
            self.layout = layout  # ids stay valid: smallest_first keeps the parameters alive
        return self.smallest_first

    def reached(self, optimizer: torch.optim.Optimizer, leaf_roots: set[int]) -> bool:
        """Whether the running backward accumulates into any of the optimizer's parameters.

        Called inside the backward. ``leaf_roots``: ids of the nodes of
        parameters the backward starts from, which the engine does not list
        among the nodes it will run when there is a single root. A parameter's
        node can change after it was read (``p.data`` given another dtype or
        device, a parameter unfrozen): when no known node is in the graph, each
        parameter's live node is asked for.
        """
        if self._any_runs(self.accumulators, leaf_roots):
            return True
        self.accumulators = [node for node in map(grad_accumulator, self.params(optimizer)) if node is not None]
        return self._any_runs(self.accumulators, leaf_roots)

    @staticmethod
    def _any_runs(nodes: list[Any], leaf_roots: set[int]) -> bool:
        if any(map(torch._C._will_engine_execute_node, nodes)):
            return True
        return bool(leaf_roots) and any(id(node) in leaf_roots for node in nodes)


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
        self._followed: dict[int, tuple[weakref.ref, _Followed]] = {}
        self._scaled: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._scaler_used = False  # spares the backward a weak dictionary's Python-level len() while no scaler ran
        self._ddp_hooked: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._ddp_allreduce = WaitableAllreduce()  # the hook of DDP models that set none
        self._in_graph: list[tuple[torch.optim.Optimizer, _Followed]] = []  # the optimizers the running backward asks about
        self._touched: list[_Followed] = []  # those it reaches, noted as its graph starts
        self._graphs_seen: set[int] = set()  # graph task ids already asked (a backward can start inner ones)
        self._leaf_roots: set[int] = set()  # ids of the AccumulateGrad nodes the running backward starts from
        # A tensor that takes part in nothing, carrying the hook dictionary that
        # root nodes are given (see _hook_roots).
        self._graph_start_hooks = {0: self._graph_started}
        self._graph_start_holder = torch.empty(0)
        self._graph_start_holder._backward_hooks = self._graph_start_hooks
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
        return self._labelled(optimizer, self._follow(optimizer))

    def _labelled(self, optimizer: torch.optim.Optimizer, followed: _Followed) -> str:
        if followed.label is None:
            followed.label = self.label(optimizer)
        return followed.label

    def _follow(self, optimizer: torch.optim.Optimizer) -> _Followed:
        key = id(optimizer)
        known = self._followed.get(key)
        if known is not None and known[0]() is optimizer:
            return known[1]
        followed = _Followed()

        def forget(_: Any) -> None:
            # The record holds the parameters: drop it with the optimizer.
            if self._followed.get(key, (None, None))[1] is followed:
                del self._followed[key]

        self._followed[key] = (weakref.ref(optimizer, forget), followed)
        return followed

    def _live_optimizers(self) -> list[tuple[torch.optim.Optimizer, _Followed]]:
        live = []
        for ref, followed in self._followed.values():
            opt = ref()
            if opt is not None:
                live.append((opt, followed))
        return live

    # ---------------------------------------------------------------- record
    def _record(self, kind: EventKind, target: str | None, caller: Any, **facts: Any) -> Event:
        """Append an event; ``caller`` is the frame the search for the user's line starts from."""
        event = Event(len(self.events), kind, user_site(caller), target, facts)
        self.events.append(event)
        return event

    def _hook_roots(self, nodes: list[Any]) -> list[Any]:
        """Make the root ``nodes`` of a backward call :meth:`_graph_started`; return the handles to remove.

        ``register_prehook`` builds a ``RemovableHandle`` and a hook dictionary
        in Python, for a node that is new at every step (about 10 us per
        backward on the bench MLP). A non-leaf root takes instead the tracer's
        own hook dictionary, the way ``Tensor.register_hook`` attaches a
        tensor's: one C++ call, no handle. That hook stays on the node, which
        lives as long as the graph; it only reads, and the dictionary is
        emptied when the tracer exits. An ``AccumulateGrad`` node reads its
        tensor hooks from its parameter, so a leaf root takes a removable pre-hook.
        """
        handles = []
        for node in nodes:
            if node is None:
                continue
            if type(node).__name__ != "AccumulateGrad" and hasattr(node, "_register_hook_dict"):
                node._register_hook_dict(self._graph_start_holder)
            else:
                self._leaf_roots.add(id(node))
                handles.append(node.register_prehook(self._graph_started))
        return handles

    def _graph_started(self, grad_outputs: Any) -> None:
        """Pre-hook on the backward's root nodes: note which optimizers its graph reaches."""
        graph = torch._C._current_graph_task_id()
        if graph in self._graphs_seen:
            return  # another root of the same graph, or a hook left on a retained graph
        self._graphs_seen.add(graph)
        for opt, followed in self._in_graph:
            if followed not in self._touched and followed.reached(opt, self._leaf_roots):
                self._touched.append(followed)

    def _inner_backward(self, original: Any, args: tuple, kwargs: dict) -> Any:
        handles = self._hook_roots(_root_nodes(_roots(args, kwargs)))
        try:
            return original(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()

    # ---------------------------------------------------------------- hooks and patches
    def _on_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        stepped = 1
        released_by = getattr(opt, "_gradlint_release_of", None)
        if released_by is not None:  # a bucket of gradlint's GradientRelease: its optimizer's parameters
            stepped, opt = sum(len(g["params"]) for g in opt.param_groups), released_by
        followed = self._follow(opt)
        name = self._labelled(opt, followed)
        if in_backward():
            # Gradient release (torch-optimi, gradlint's, a post-accumulate hook): parameters
            # stepped inside backward. The backward as a whole is one loop step.
            self._released[name] = self._released.get(name, 0) + stepped
            return
        self._check_budget()
        self.steps += 1
        self._record(
            EventKind.STEP,
            name,
            sys._getframe(1),
            via_scaler=self._scaler_in_step,
            grads=grad_state(followed.params(opt)),
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
            self._record(EventKind.STEP, name, sys._getframe(1), grads="released", released=count, loop_step=self.steps)
        self._released = {}

    def _wrap_backward(self, original: Any) -> Any:
        tracer = self

        def backward(*args: Any, **kwargs: Any) -> Any:
            if tracer._depth or in_backward():
                if tracer._in_graph and in_backward():
                    # A backward run from inside the traced one (reentrant checkpointing
                    # recomputes a block and backpropagates through it): part of the same
                    # loop backward, and it may reach parameters the outer graph does not.
                    return tracer._inner_backward(original, args, kwargs)
                return original(*args, **kwargs)
            if tracer.release_loop:
                tracer._check_budget()
            roots = _roots(args, kwargs)
            nodes = _root_nodes(roots)
            loss = roots[0] if roots else None
            scaler = tracer._scaled.get(loss) if tracer._scaler_used and isinstance(loss, torch.Tensor) else None
            live = tracer._live_optimizers()
            before = []
            for opt, followed in live:
                before.append(grad_state(followed.params(opt)))
            # the loss's node, looked up once for the factor and for the hook
            factor = _factor_below(nodes[0], scaler is not None) if isinstance(loss, torch.Tensor) else 1.0
            event = tracer._record(EventKind.BACKWARD, None, sys._getframe(1), scaled=scaler, factor=factor)
            # A hook on the root node asks, once the graph runs, which optimizers it
            # reaches (instead of a gradient hook on every parameter).
            tracer._in_graph, tracer._touched, tracer._leaf_roots, tracer._graphs_seen = live, [], set(), set()
            handles = tracer._hook_roots(nodes)
            tracer._allreduces = 0
            tracer._depth += 1
            tracer._released = {}
            try:
                result = original(*args, **kwargs)
            finally:
                tracer._depth -= 1
                for handle in handles:
                    handle.remove()
                reached = tracer._touched
                tracer._in_graph, tracer._touched = [], []
                states = {}
                for (opt, followed), state in zip(live, before):
                    if followed in reached:
                        states[tracer._labelled(opt, followed)] = state
                event.facts["touched"] = sorted(states)
                event.facts["before"] = states
                event.facts["synced"] = tracer._allreduces
            if tracer._released:
                tracer._record_released_steps()
            return result

        return backward

    def _wrap_zero(self, original: Any, via: str) -> Any:
        tracer = self

        def zero_grad(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if not tracer._depth:
                set_to_none = _set_to_none(original, (obj, *args), kwargs) if args or kwargs else True
                if via == "optimizer":
                    targets = [tracer.watch(obj)]
                else:
                    params = {id(p) for p in obj.parameters()}
                    targets = sorted(
                        tracer._labelled(opt, followed)
                        for opt, followed in tracer._live_optimizers()
                        if any(id(p) in params for p in followed.params(opt))
                    )
                tracer._record(
                    EventKind.ZERO, ",".join(targets) or None, sys._getframe(1), set_to_none=set_to_none, via=via, targets=targets
                )
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
                tracer._record(kind, target, sys._getframe(1), **static_facts)
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
                tracer._record(
                    EventKind.STEP,
                    tracer.watch(optimizer),
                    sys._getframe(1),
                    via_scaler=name,
                    skipped=True,
                    grads="skipped",
                    loop_step=tracer.steps,
                )
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
                sys._getframe(1),
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
        from torch.nn.parallel import DistributedDataParallel as DDP

        tracer = self
        register = DDP.register_comm_hook
        forward = DDP.forward

        def register_comm_hook(ddp: Any, state: Any, hook: Any) -> None:
            tracer._ddp_hooked[ddp] = True
            return register(ddp, state, tracer._count_allreduce(hook))

        def ddp_forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            if ddp not in tracer._ddp_hooked:
                # torch's stock all-reduce hook (DDP documents it as behaving
                # like no hook at all), in a copy whose callbacks __exit__ waits for.
                register_comm_hook(ddp, ddp.process_group, tracer._ddp_allreduce)
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
        # before the interpreter can finalize: see runtime/ddp_hook.py
        self._ddp_allreduce.wait_released()
        self._graph_start_hooks.clear()  # hooks left on retained graphs do nothing from now on
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
