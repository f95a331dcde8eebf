"""One run of one mode of ``gradlint measure``: the user's script, changed as the mode says, run in this process.

The modes: ``as written``; ``set_to_none=True`` (every ``zero_grad`` frees
the gradients); ``gradient release`` (every optimizer the script builds is
stepped inside backward by :class:`~gradlint.runtime.release.GradientRelease`,
or the script's GL204 rewrite runs as written); ``fused optimizer`` (Adam,
AdamW, SGD and Adagrad built with ``fused=True`` where their parameters allow
it). The RNGs are seeded identically before every run.

:func:`run_in_child` is what a child process of :mod:`~gradlint.runtime.isolation`
runs: it runs one mode, metered or timed, and sends back plain values (no
tensors): the figures, the parameters written to a file, and what the parent
needs to decide on the next runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import random
import time
from typing import Any, Callable

import torch

from gradlint.runtime import launch
from gradlint.runtime._patching import Patcher
from gradlint.runtime.kernels import FUSED_OPTIMIZERS, fused_candidate, fused_supports, kernel_of, params_of
from gradlint.runtime.launch import run_script
from gradlint.runtime.memory import MemoryReport, TensorMemoryMeter
from gradlint.runtime.release import GradientRelease
from gradlint.runtime.tracer import StopTraining, in_backward

AS_WRITTEN = "as written"
SET_TO_NONE = "set_to_none=True"
RELEASE = "gradient release"
FUSED = "fused optimizer"
MODES = (AS_WRITTEN, SET_TO_NONE, RELEASE, FUSED)
SEED = 0


class MeasureError(Exception):
    """A mode could not be measured (the script failed or never stepped).

    ``cause``: the name of the exception that made it fail, if any
    (``ReleaseUnsupported`` when gradient release refused the loop), and
    ``reason`` its message.
    """

    def __init__(
        self, message: str, cause: str | None = None, detail: str = "", traceback: str = "", reason: str = ""
    ) -> None:
        super().__init__(message)
        self.cause = cause
        self.detail = detail or message
        self.traceback = traceback
        self.reason = reason

    def __reduce__(self) -> tuple:  # crosses from the child process with every field
        return (MeasureError, (str(self), self.cause, self.detail, self.traceback, self.reason))


@dataclasses.dataclass
class RunSpec:
    """One run to make in a child process."""

    path: str
    mode: str
    args: tuple[str, ...]
    steps: int
    metered: bool  # under the memory meters; else timed
    fake: bool = False
    snapshot: str | None = None  # CUDA: where to dump the allocator's history
    params_file: str | None = None  # where to write the parameters at the end
    groups_closed: int = 0  # process groups closed by earlier runs (under torchrun)
    source: str | None = None  # text to run instead of the file's (the GL204 rewrite)
    release_fused: bool = True  # gradient release through the fused kernels where they exist


@dataclasses.dataclass
class RunResult:
    """What one run sends back."""

    count: int
    times: list[float]
    how: str  # how the script ended (launch.Outcome.how)
    release_as_written: bool = False
    memory: MemoryReport | None = None
    timeline: list[tuple[int, float, int]] = dataclasses.field(default_factory=list)
    marks: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    phases: list[tuple[str, float, float]] = dataclasses.field(default_factory=list)
    unsized_ops: dict[str, int] = dataclasses.field(default_factory=dict)
    survived: int | None = None  # tensor bytes made during the run and still alive once its objects are gone
    allocator: dict[str, Any] = dataclasses.field(default_factory=dict)  # CUDA: peak, phases, baseline, survived...
    param_devices: list[str] = dataclasses.field(default_factory=list)
    deterministic: bool = False
    kernels: list[str] = dataclasses.field(default_factory=list)  # per optimizer: "AdamW: for-loop"
    fused_candidates: list[str] = dataclasses.field(default_factory=list)  # optimizers that could use fused=True
    release_kernels: list[str] = dataclasses.field(default_factory=list)
    device_story: str = ""  # fake: how CUDA devices were treated


def seed() -> None:
    """The same RNG state before every run: torch (CPU and CUDA), Python, numpy's global generator."""
    torch.manual_seed(SEED)
    random.seed(SEED)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(SEED)


class ModeRun:
    """The patches that turn the user's script into one mode of the measurement."""

    def __init__(
        self, mode: str, steps: int, meter: TensorMemoryMeter | None,
        on_step: Callable[[int], None] = lambda n: None, release_fused: bool = True,
    ) -> None:
        self.mode, self.steps, self.meter, self.on_step = mode, steps, meter, on_step
        self.release_fused = release_fused
        self.optimizers: list[torch.optim.Optimizer] = []
        self.releases: list[GradientRelease] = []
        self.release_kernels: list[str] = []  # "AdamW: fused", per release, read when the run ends
        self.times: list[float] = []
        self.count = 0
        self.sinks: list[Any] = [meter] if meter is not None else []  # meters told about phases
        self.release_loop = False  # the script steps inside backward (gradient release as written)
        self._stepped_in_backward = False
        self._making_release = False  # the GradientRelease being built is this run's, not the script's
        self.device_story = ""  # fake tensors: how CUDA devices were treated
        self.patcher = Patcher()

    def _user_step(self) -> None:
        self.count += 1
        self.times.append(time.perf_counter())
        if self.meter is not None:
            self.meter.mark(f"step {self.count}")
        self.on_step(self.count)
        if self.count >= self.steps:
            raise StopTraining(f"stopped after {self.count} optimizer steps")

    def _post_step_hook(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not any(opt is o for o in self.optimizers):
            return
        if in_backward():
            # stepped from a hook inside backward (gradient release as written):
            # the backward is the loop step, counted when it returns
            self.release_loop = True
            self._stepped_in_backward = True
        else:
            self._user_step()

    def _wrap_backward(self, original: Callable) -> Callable:
        run = self

        def backward(*args: Any, **kwargs: Any) -> Any:
            if in_backward():
                return original(*args, **kwargs)
            run._stepped_in_backward = False
            for sink in run.sinks:
                sink.begin("backward")
            try:
                result = original(*args, **kwargs)
            finally:
                for sink in run.sinks:
                    sink.end("backward")
            if run._stepped_in_backward:
                run._stepped_in_backward = False
                run._user_step()
            return result

        return backward

    def _wrap_init(self, original: Callable) -> Callable:
        run = self

        def __init__(opt: Any, *args: Any, **kwargs: Any) -> None:
            original(opt, *args, **kwargs)
            run.optimizers.append(opt)
            if run.meter is not None:
                run.meter.watch_optimizer(opt)
            if run.mode == RELEASE and not opt.defaults.get("gradient_release"):  # torch-optimi releases itself
                run._making_release = True
                try:
                    release = GradientRelease(opt, fused=run.release_fused)
                finally:
                    run._making_release = False
                release.step_callbacks.append(run._user_step)
                run.releases.append(release)

        return __init__

    def _release_init(self, original: Callable) -> Callable:
        """``GradientRelease.__init__`` for a release the script makes itself (the GL204 rewrite does): the script's
        own replaces the one this run made at the optimizer's construction, and its steps are counted."""
        run = self

        def __init__(release: GradientRelease, optimizer: Any, *args: Any, **kwargs: Any) -> None:
            if run._making_release:
                original(release, optimizer, *args, **kwargs)
                return
            for made in [r for r in run.releases if r.optimizer is optimizer]:
                made.remove()
                run.releases.remove(made)
            original(release, optimizer, *args, **kwargs)
            release.step_callbacks.append(run._user_step)
            run.releases.append(release)
            run.release_loop = True

        return __init__

    @staticmethod
    def _fused_init(original: Callable) -> Callable:
        """A fused optimizer's constructor that asks for ``fused=True`` wherever the parameters allow it."""

        def __init__(opt: Any, params: Any, *args: Any, **kwargs: Any) -> None:
            params = [dict(item, params=_listed(item["params"])) if isinstance(item, dict) else item for item in params]
            flat = [p for item in params for p in (item["params"] if isinstance(item, dict) else [item])]
            if not kwargs.get("fused") and not kwargs.get("differentiable") and fused_supports(type(opt), flat):
                kwargs["fused"], kwargs["foreach"] = True, False
            original(opt, params, *args, **kwargs)

        return __init__

    def _wrap_zero_grad(self, original: Callable) -> Callable:
        """Mark the clear on the memory timeline; in the set_to_none mode, force ``set_to_none=True``."""
        run = self

        def zero_grad(obj: Any, set_to_none: bool = True) -> None:
            for sink in run.sinks:
                sink.begin("clear")
            try:
                return original(obj, set_to_none=True if run.mode == SET_TO_NONE else set_to_none)
            finally:
                for sink in run.sinks:
                    sink.end("clear")

        return zero_grad

    def __enter__(self) -> "ModeRun":
        from torch.optim.optimizer import Optimizer, register_optimizer_step_post_hook

        p = self.patcher
        p.set(Optimizer, "__init__", self._wrap_init(Optimizer.__init__))
        p.wrap(GradientRelease, "__init__", self._release_init)
        if self.mode == FUSED:
            for cls in FUSED_OPTIMIZERS:
                p.wrap(cls, "__init__", self._fused_init)
        p.keep(register_optimizer_step_post_hook(self._post_step_hook))
        p.set(torch.Tensor, "backward", self._wrap_backward(torch.Tensor.backward))
        p.set(torch.autograd, "backward", self._wrap_backward(torch.autograd.backward))
        p.set(Optimizer, "zero_grad", self._wrap_zero_grad(Optimizer.zero_grad))
        p.set(torch.nn.Module, "zero_grad", self._wrap_zero_grad(torch.nn.Module.zero_grad))
        return self

    def __exit__(self, *exc: Any) -> None:
        # Let go of the releases: this run's patched functions can outlive it (torch._dynamo keeps a table of
        # torch.Tensor's methods, read while they were patched), and must not keep the script's model alive.
        self.release_kernels = [f"{type(r.optimizer).__name__}: {', '.join(sorted(set(r.kernel)))}" for r in self.releases]
        for release in self.releases:
            release.remove()
            if self._user_step in release.step_callbacks:
                release.step_callbacks.remove(self._user_step)
        self.releases = []
        self.patcher.restore()


def _listed(params: Any) -> list[torch.Tensor]:
    """A param group's ``params``: one tensor or an iterable of them, read once."""
    return [params] if isinstance(params, torch.Tensor) else list(params)


def _run(spec: RunSpec, meter: TensorMemoryMeter | None, post: Callable[[Any], None]) -> tuple[ModeRun, Any, Any]:
    """Run the script once in this process; raise :class:`MeasureError` when it fails or never steps."""
    from gradlint.runtime.fake import fake_tensors

    gc.collect()
    seed()
    outer = fake_tensors() if spec.fake else contextlib.nullcontext()
    cuda = None
    if not spec.fake and meter is not None and torch.cuda.is_available():
        from gradlint.runtime.memory import CudaPhaseMeter

        cuda = CudaPhaseMeter(snapshot=spec.snapshot)
    with outer as mode:
        run = ModeRun(spec.mode, spec.steps, meter, lambda n: post(("step", n)), spec.release_fused)
        if cuda is not None:
            run.sinks.append(cuda)
        with run, (cuda or contextlib.nullcontext()), (meter or contextlib.nullcontext()):
            outcome = run_script(spec.path, spec.args, source=spec.source)
        run.device_story = getattr(mode, "device_story", "")
    if not outcome.ok:
        from gradlint.runtime.run import user_traceback

        trace = user_traceback(outcome.exc, spec.path) if outcome.exc else ""
        cause = type(outcome.exc).__name__ if outcome.exc is not None else None
        raise MeasureError(f"{spec.mode}: the script {outcome.how}: {outcome.detail}", cause, outcome.detail, trace,
                           str(outcome.exc) if outcome.exc is not None else "")
    if run.count == 0:
        raise MeasureError(f"{spec.mode}: no optimizer step ran: the script has no training loop gradlint can follow")
    return run, outcome, cuda


def run_in_child(spec: RunSpec, post: Callable[[Any], None]) -> RunResult:
    """One run of ``spec`` in this (fresh) process, summed up in plain values.

    Once the script has stopped, its objects are let go and what is still
    alive is reported as surviving the run: tensors the metered run made
    (a helper module's cache, a global hook), and on CUDA what the allocator
    still holds beyond its baseline, cuBLAS's workspaces counted apart.
    """
    launch.set_groups_closed(spec.groups_closed)
    meter = TensorMemoryMeter(timeline=True, flag_unsized=spec.fake) if spec.metered else None
    try:
        run, outcome, cuda = _run(spec, meter, post)
    finally:  # the next run names its process group after this count, whether this one failed or not
        post(("groups closed", launch.groups_closed()))
    result = RunResult(run.count, run.times, outcome.how, run.release_loop)
    optimizers, run.optimizers = run.optimizers, []
    params = [p for opt in optimizers for p in params_of(opt)]
    result.param_devices = sorted({str(p.device.type) for p in params})
    result.deterministic = torch.are_deterministic_algorithms_enabled()
    result.kernels = [f"{_name(o)}: {kernel_of(o)}" for o in optimizers]
    result.fused_candidates = [type(o).__name__ for o in optimizers if fused_candidate(o)]
    result.release_kernels = run.release_kernels
    result.device_story = run.device_story
    if spec.params_file and not spec.fake:
        torch.save([p.detach().to("cpu", copy=True) for p in params], spec.params_file)
    if meter is None:
        return result
    result.memory = meter.report()
    result.timeline, result.marks, result.phases = meter.timeline or [], meter.marks, meter.phases
    result.unsized_ops = dict(meter.unsized or {})
    del optimizers, params, run, outcome
    gc.collect()
    result.survived = meter.current
    if cuda is not None and torch.cuda.is_initialized():  # a CPU script on a GPU machine has no CUDA figures
        result.allocator = {"peak": cuda.peak, "phases": cuda.phases, "baseline": cuda.baseline}
        result.allocator.update(_allocator_after_run(cuda.baseline))
    return result


def _name(optimizer: torch.optim.Optimizer) -> str:
    """``AdamW`` for torch's optimizers, ``optimi.AdamW`` for another library's."""
    root = type(optimizer).__module__.split(".")[0]
    return type(optimizer).__name__ if root == "torch" else f"{root}.{type(optimizer).__name__}"


def _allocator_after_run(baseline: int) -> dict[str, int]:
    """What the CUDA allocator holds beyond ``baseline`` once the run's objects are gone, and how much is cuBLAS's."""
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - baseline
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()  # cuBLAS keeps a workspace per handle and stream until told to let go
    after = torch.cuda.memory_allocated() - baseline
    return {"survived": after, "workspaces": held - after}
