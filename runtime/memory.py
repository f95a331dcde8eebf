"""Memory meters: the CUDA allocator's peak on a GPU, an exact tensor-level meter everywhere else.

:class:`TensorMemoryMeter` is a ``TorchDispatchMode``: every storage an op
returns is counted once (deduplicated by storage identity, so views and
in-place results cost nothing) and subtracted when the storage dies (a weakref
callback on the ``UntypedStorage``, which torch keeps alive exactly as long as
the underlying memory). It works on real CPU tensors and under
``FakeTensorMode`` alike, and it never reads process RSS.

At the moment of the peak it splits the live bytes into parameters,
gradients, optimizer state, activations (made outside backward and the
optimizer step) and temporaries (made inside them). Categories are kept as
running totals, so the split costs nothing per op; a storage becomes
"optimizer state" when the optimizer step that made it returns, so when
several moments reach the same peak the split of the latest one is kept
(in a steady loop: a later step, whose state is already known).

Bytes are those of one device, as an allocator counts them: the host's
(CPU tensors) until the first tensor lands on an accelerator (``cuda``, or
any device but ``cpu`` and ``meta``), that device's from then on. A model built
on the CPU and moved to the GPU briefly holds both copies of a parameter; the
GPU never holds the CPU's, and a meter that added the two reported a peak
15 % over the CUDA allocator's on a small bf16 model (H100).

A CUDA storage counts what the caching allocator hands out for it: its bytes
rounded up to the allocator's 512-byte blocks (none for an empty one). On a
small bf16 model (38 KB of parameters) the bytes alone were 2.4 % under the
allocator's peak on an H200; on ViT-L the rounding is 0.1 %.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from typing import Any, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gradlint.runtime.accumulators import grad_accumulator

CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "temporaries")

PARAMS, GRADS, STATE, ACTS, TEMPS = CATEGORIES


# Ops whose real kernels return a larger storage than their meta (fake) kernels
# describe, so a fake-tensor estimate undercounts them; measured on this project's
# model kinds (tests/runtime/test_fake.py), not guessed.
UNSIZED_BY_FAKE = {
    "aten.mkldnn_rnn_layer": "oneDNN's RNN workspace (CPU LSTM/GRU training)",
    "aten._cudnn_rnn": "cuDNN's RNN reserve space (CUDA LSTM/GRU training)",
    "aten.mse_loss": "the elementwise buffer the CPU kernel keeps behind its scalar result",
}


@dataclasses.dataclass
class _Entry:
    nbytes: int
    category: str
    ref: weakref.ref
    device: str


@dataclasses.dataclass
class MemoryReport:
    """Peak bytes and their split at the moment of the peak."""

    peak: int
    split: dict[str, int]
    current: int

    def share(self, category: str) -> float:
        return self.split.get(category, 0) / self.peak if self.peak else 0.0


CUDA_BLOCK = 512  # the CUDA caching allocator's kMinBlockSize: every block is a multiple of it


def allocated_bytes(nbytes: int, device: str) -> int:
    """The bytes a storage of ``nbytes`` takes on ``device``: on CUDA the caching allocator's block, else its size."""
    if device != "cuda" or nbytes == 0:
        return nbytes
    return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK


def _storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    try:
        return [t.untyped_storage()]
    except (RuntimeError, NotImplementedError):  # sparse, nested, exotic subclasses
        return []


class TensorMemoryMeter(TorchDispatchMode):
    """Exact live-tensor bytes over time, with the peak and its split.

    Parameters and optimizer state are recognised through the modules and
    optimizers given to :meth:`track` or :meth:`watch_optimizer` (optimizers
    stepped while the meter is on are picked up by the global step hooks).
    ``timeline=True`` keeps ``(op index, seconds, live bytes)`` after every op,
    and :meth:`begin`/:meth:`end` record named phases (backward, step, clear)
    on the same clock for plots.
    """

    def __init__(self, timeline: bool = False, flag_unsized: bool = False) -> None:
        super().__init__()
        # on fake tensors: calls of the ops in UNSIZED_BY_FAKE, which the estimate undercounts
        self.unsized: dict[str, int] | None = {} if flag_unsized else None
        self.current = 0
        self.peak = 0
        self.window_peak = 0  # the peak since the last reset (MeterAllocator.reset_peak)
        self.peak_split: dict[str, int] = {}
        self.ops = 0
        self.timeline: list[tuple[int, float, int]] | None = [] if timeline else None
        self.marks: list[tuple[int, str]] = []
        self.phases: list[tuple[str, float, float]] = []  # (name, start, end) in perf_counter seconds
        self._open_phases: dict[str, float] = {}
        self._live: dict[int, _Entry] = {}
        self._totals: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.device: str | None = None  # the accelerator counted, once a tensor lands on one; None: the host
        self._optimizers: list[weakref.ref] = []
        self._params: dict[int, weakref.ref] = {}
        self._param_storages: set[int] = set()
        self._in_step = 0
        self._handles: list[Any] = []
        self._accumulators: list[Any] = []

    # ------------------------------------------------------------------ what is what
    def track(self, *objects: Any) -> None:
        """Count tensors made before the meter started: modules (parameters, buffers, gradients), optimizers, tensors."""
        flat, _ = tree_flatten(objects)
        for obj in flat:
            if isinstance(obj, torch.nn.Module):
                for p in obj.parameters():
                    self._watch_param(p)
                    self._add(p)
                    if p.grad is not None:
                        self._add(p.grad, gradient=True)
                for b in obj.buffers():
                    self._add(b)
            elif isinstance(obj, torch.optim.Optimizer):
                self.watch_optimizer(obj)
                for t in self._state_tensors(obj):
                    self._add(t)
                self._classify_state(obj)
            elif isinstance(obj, torch.Tensor):
                self._add(obj)
        self._check_peak()

    def watch_optimizer(self, opt: torch.optim.Optimizer) -> None:
        """Recognise ``opt``'s parameters, gradients and state from now on."""
        if any(r() is opt for r in self._optimizers):
            return
        self._optimizers.append(weakref.ref(opt))
        for group in opt.param_groups:
            for p in group["params"]:
                self._watch_param(p)

    def _watch_param(self, p: torch.Tensor) -> None:
        if id(p) in self._params and self._params[id(p)]() is p:
            return
        self._params[id(p)] = weakref.ref(p)
        for st in _storages(p):
            self._param_storages.add(id(st))
            self._reclassify(id(st), PARAMS)
        if p.requires_grad and p.is_leaf:
            # The incoming gradient (before release hooks could free it), and the
            # accumulated one through a hook on the gradient accumulator node: a
            # post-accumulate-grad hook on the parameter would make torch-optimi's
            # prepare_for_gradient_release refuse it.
            self._handles.append(p.register_hook(self._mark_gradient))
            accumulator = grad_accumulator(p)
            if accumulator is not None:
                ref = weakref.ref(p)
                self._handles.append(accumulator.register_hook(lambda *_: self._mark_accumulated(ref())))
                self._accumulators.append(accumulator)  # the hook lives as long as the node

    def _mark_accumulated(self, p: torch.Tensor | None) -> None:
        if p is not None and p.grad is not None:
            self._mark_gradient(p.grad)

    def _mark_gradient(self, grad: torch.Tensor) -> None:
        for st in _storages(grad):
            self._reclassify(id(st), GRADS)

    def _reclassify(self, key: int, category: str) -> None:
        entry = self._live.get(key)
        if entry is None or entry.category in (category, PARAMS):
            return
        if self._counted(entry):
            self._totals[entry.category] -= entry.nbytes
            self._totals[category] += entry.nbytes
        entry.category = category

    def _classify_state(self, opt: torch.optim.Optimizer) -> None:
        # Only the state of this optimizer's own parameters: a per-parameter
        # (gradient release) step looks at one entry, not the whole state.
        for group in opt.param_groups:
            for p in group["params"]:
                for value in opt.state.get(p, {}).values():
                    if isinstance(value, torch.Tensor):
                        for st in _storages(value):
                            self._reclassify(id(st), STATE)

    @staticmethod
    def _state_tensors(opt: torch.optim.Optimizer) -> Iterable[torch.Tensor]:
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    yield value

    # ------------------------------------------------------------------ counting
    def _phase(self) -> str:
        if self._in_step or torch._C._current_graph_task_id() != -1:
            return TEMPS
        return ACTS

    HOST_DEVICES = ("cpu", "meta")

    def _counted(self, entry: _Entry) -> bool:
        return self.device is None or entry.device == self.device

    def _count_device(self, device: str) -> None:
        """From now on count ``device`` alone: its live bytes are the current figure, and the peak starts again."""
        self.device = device
        self._totals = dict.fromkeys(CATEGORIES, 0)
        for entry in self._live.values():
            if entry.device == device:
                self._totals[entry.category] += entry.nbytes
        self.current = sum(self._totals.values())
        self.peak = self.window_peak = 0
        self.peak_split = {}

    def _add(self, t: torch.Tensor, gradient: bool = False) -> None:
        for st in _storages(t):
            key = id(st)
            entry = self._live.get(key)
            device = t.device.type
            nbytes = allocated_bytes(st.nbytes(), device)
            if entry is not None:
                if entry.nbytes != nbytes:  # resized in place
                    if self._counted(entry):
                        self.current += nbytes - entry.nbytes
                        self._totals[entry.category] += nbytes - entry.nbytes
                    entry.nbytes = nbytes
                if gradient:
                    self._reclassify(key, GRADS)
                continue
            ref = weakref.ref(st, self._make_finalizer(key))
            category = PARAMS if key in self._param_storages else GRADS if gradient else self._phase()
            entry = self._live[key] = _Entry(nbytes, category, ref, device)
            if self.device is None and device not in self.HOST_DEVICES:
                self._count_device(device)
            elif self._counted(entry):
                self._totals[category] += nbytes
                self.current += nbytes

    def _make_finalizer(self, key: int):
        def finalize(_ref: weakref.ref) -> None:
            entry = self._live.pop(key, None)
            if entry is not None and self._counted(entry):
                self.current -= entry.nbytes
                self._totals[entry.category] -= entry.nbytes

        return finalize

    def _check_peak(self) -> None:
        if self.timeline is not None:
            self.timeline.append((self.ops, time.perf_counter(), self.current))
        if self.current > self.window_peak:
            self.window_peak = self.current
        if self.current >= self.peak:
            self.peak = self.current
            self.peak_split = dict(self._totals)

    def split(self) -> dict[str, int]:
        """The live bytes right now, by category."""
        return dict(self._totals)

    def mark(self, label: str) -> None:
        """Remember an op index (a step boundary) for plots."""
        self.marks.append((self.ops, label))

    def begin(self, phase: str) -> None:
        """A phase (``backward``, ``step``, ``clear``) starts now; nested begins of the same phase are ignored."""
        if self.timeline is not None and phase not in self._open_phases:
            self._open_phases[phase] = time.perf_counter()

    def end(self, phase: str) -> None:
        """The phase begun last under this name ends now."""
        start = self._open_phases.pop(phase, None)
        if start is not None:
            self.phases.append((phase, start, time.perf_counter()))

    def report(self) -> MemoryReport:
        """Peak, its split and the current live bytes."""
        return MemoryReport(self.peak, dict(self.peak_split), self.current)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        if self.unsized is not None:
            name = str(func.overloadpacket)
            if name in UNSIZED_BY_FAKE:
                self.unsized[name] = self.unsized.get(name, 0) + 1
        flat, _ = tree_flatten(out)
        for t in flat:
            if isinstance(t, torch.Tensor):
                self._add(t)
        self._check_peak()
        return out

    # ------------------------------------------------------------------ install
    def _pre_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.watch_optimizer(opt)
        self._in_step += 1
        self.begin("step")

    def _post_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._in_step -= 1
        self._classify_state(opt)
        if not self._in_step:
            self.end("step")

    def __enter__(self) -> "TensorMemoryMeter":
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles.append(register_optimizer_step_pre_hook(self._pre_step))
        self._handles.append(register_optimizer_step_post_hook(self._post_step))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
            self._accumulators.clear()


class CudaAllocator:
    """The CUDA caching allocator's counters for one device, as :class:`PhaseMeter` reads them.

    Until the script has initialised CUDA there is nothing to read, and
    reading would create a CUDA context a CPU script never asked for: the
    counters are 0 and nothing is synchronised.
    """

    def __init__(self, device: torch.device | int | None = None) -> None:
        self.device = device

    @staticmethod
    def in_use() -> bool:
        return torch.cuda.is_initialized()

    def synchronize(self) -> None:
        if self.in_use():
            torch.cuda.synchronize(self.device)

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device) if self.in_use() else 0

    def reserved(self) -> int:
        return torch.cuda.memory_reserved(self.device) if self.in_use() else 0

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated(self.device) if self.in_use() else 0

    def reset_peak(self) -> None:
        if self.in_use():
            torch.cuda.reset_peak_memory_stats(self.device)


class MeterAllocator:
    """A :class:`TensorMemoryMeter` read as an allocator: live tensor bytes, with a peak that can be reset.

    Lets :class:`PhaseMeter` split the tensor meter's figures by phase, and
    lets its phase bookkeeping be tested without a GPU.
    """

    def __init__(self, meter: TensorMemoryMeter) -> None:
        self.meter = meter

    def synchronize(self) -> None:
        pass

    def allocated(self) -> int:
        return self.meter.current

    def reserved(self) -> int:
        return self.meter.current

    def peak(self) -> int:
        return self.meter.window_peak

    def reset_peak(self) -> None:
        self.meter.window_peak = self.meter.current


class PhaseMeter:
    """An allocator read per phase: allocated, reserved and peak for forward, backward, step, clear.

    At every phase boundary the device is synchronised, the peak since the
    previous boundary is credited to the phase that was running (``forward``
    when none of the others was: data loading, the forward pass, and whatever
    runs between backward and step) and the
    allocator's peak counter is reset, so each phase's peak is its own. The
    overall peak is the largest of them. Figures are relative to ``baseline``,
    what was allocated when the meter started (in a fresh process: nothing).
    On exit the phase still open (a run stopped inside its last step) gets
    the last segment. With :class:`CudaAllocator`, ``snapshot`` is a path
    where the allocator's history (``torch.cuda.memory._record_memory_history``)
    is dumped on exit, for https://pytorch.org/memory_viz.
    """

    PHASES = ("forward", "backward", "step", "clear")

    def __init__(self, allocator: Any, snapshot: str | None = None) -> None:
        self.allocator = allocator
        self.snapshot = snapshot
        self.baseline = 0
        self.peak = 0
        self.phases: dict[str, dict[str, int]] = {}
        self._stack: list[str] = []
        self._handles: list[Any] = []

    def _boundary(self) -> None:
        a = self.allocator
        a.synchronize()
        phase = self._stack[-1] if self._stack else "forward"
        stats = self.phases.setdefault(phase, {"allocated": 0, "reserved": 0, "peak": 0})
        peak = a.peak() - self.baseline
        stats["peak"] = max(stats["peak"], peak)
        stats["allocated"] = a.allocated() - self.baseline
        stats["reserved"] = a.reserved()
        self.peak = max(self.peak, peak)
        a.reset_peak()

    def begin(self, phase: str) -> None:
        """Close the running segment and open ``phase``."""
        self._boundary()
        self._stack.append(phase)

    def end(self, phase: str) -> None:
        """Close ``phase`` (and anything opened inside it that was left open)."""
        if phase not in self._stack:
            return
        self._boundary()
        while self._stack and self._stack.pop() != phase:
            pass

    def _pre_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.begin("step")

    def _post_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.end("step")

    def __enter__(self) -> "PhaseMeter":
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        if self.snapshot:
            torch.cuda.memory._record_memory_history(max_entries=200_000)
        self.allocator.synchronize()
        self.baseline = self.allocator.allocated()
        self.allocator.reset_peak()
        self._handles = [register_optimizer_step_pre_hook(self._pre_step), register_optimizer_step_post_hook(self._post_step)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._boundary()  # credited to the phase still open: a run stops inside its last step
        self._stack.clear()
        if self.snapshot:
            try:
                torch.cuda.memory._dump_snapshot(self.snapshot)
            finally:
                torch.cuda.memory._record_memory_history(enabled=None)

    def report(self) -> MemoryReport:
        """The overall peak (an allocator has no split into categories)."""
        return MemoryReport(self.peak, {}, self.allocator.allocated() - self.baseline)


def CudaPhaseMeter(device: torch.device | int | None = None, snapshot: str | None = None) -> PhaseMeter:
    """A :class:`PhaseMeter` on the CUDA caching allocator of ``device``."""
    return PhaseMeter(CudaAllocator(device), snapshot)
