"""``gradlint measure``: run a loop as written, with ``set_to_none=True`` and with gradient release.

Each mode runs the user's script from the top under a :class:`TensorMemoryMeter`
(or the CUDA allocator's peak on a GPU), stops it after the same number of
optimizer steps, and keeps the peak with its split, the time between
consecutive ``step()`` calls, the parameters at the end and the memory curve of
the last step. The RNGs are seeded identically before every mode, so the
parameter difference between modes measures the modes, not the data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import random
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import torch

from gradlint.runtime._patching import Patcher
from gradlint.runtime.launch import Outcome, run_script
from gradlint.runtime.memory import CATEGORIES, UNSIZED_BY_FAKE, CudaPhaseMeter, MemoryReport, TensorMemoryMeter
from gradlint.runtime.release import GradientRelease, ReleaseUnsupported
from gradlint.runtime.tracer import StopTraining, in_backward

AS_WRITTEN = "as written"
SET_TO_NONE = "set_to_none=True"
RELEASE = "gradient release"
MODES = (AS_WRITTEN, SET_TO_NONE, RELEASE)
SEED = 0
RELEASED_AS_WRITTEN = (
    "the script already releases gradients as written (its optimizers step inside backward); "
    "'as written' is the gradient release measurement"
)


class MeasureError(Exception):
    """A mode could not be measured (the script failed or never stepped)."""

    def __init__(self, message: str, cause: BaseException | None = None, detail: str = "", traceback: str = "") -> None:
        super().__init__(message)
        self.cause = cause
        self.detail = detail or message
        self.traceback = traceback


@dataclasses.dataclass
class ModeResult:
    """What one mode measured."""

    mode: str
    steps: int
    memory: MemoryReport
    step_times: list[float]
    params: list[torch.Tensor] | None
    curve: list[tuple[float, int]]
    outcome: Outcome
    allocator_peak: int | None = None
    release_as_written: bool = False
    phases: list[tuple[str, float, float]] = dataclasses.field(default_factory=list)
    cuda_phases: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    unsized_ops: dict[str, int] = dataclasses.field(default_factory=dict)  # fake only: ops the estimate undercounts

    @property
    def median_step_time(self) -> float | None:
        return statistics.median(self.step_times) if self.step_times else None


def _seed() -> None:
    torch.manual_seed(SEED)
    random.seed(SEED)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(SEED)


class _ModeRun:
    """The patches that turn the user's script into one mode of the measurement."""

    def __init__(
        self, mode: str, steps: int, meter: TensorMemoryMeter | None, on_step: Callable[[int], None] = lambda n: None
    ) -> None:
        self.mode, self.steps, self.meter, self.on_step = mode, steps, meter, on_step
        self.optimizers: list[torch.optim.Optimizer] = []
        self.releases: list[GradientRelease] = []
        self.times: list[float] = []
        self.count = 0
        self.params: list[torch.Tensor] | None = None
        self.sinks: list[Any] = [meter] if meter is not None else []  # meters told about phases
        self.release_loop = False  # the script steps inside backward (gradient release as written)
        self._stepped_in_backward = False
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
                release = GradientRelease(opt)
                release.step_callbacks.append(run._user_step)
                run.releases.append(release)

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

    def __enter__(self) -> "_ModeRun":
        from torch.optim.optimizer import Optimizer, register_optimizer_step_post_hook

        p = self.patcher
        p.set(Optimizer, "__init__", self._wrap_init(Optimizer.__init__))
        p.keep(register_optimizer_step_post_hook(self._post_step_hook))
        p.set(torch.Tensor, "backward", self._wrap_backward(torch.Tensor.backward))
        p.set(torch.autograd, "backward", self._wrap_backward(torch.autograd.backward))
        p.set(Optimizer, "zero_grad", self._wrap_zero_grad(Optimizer.zero_grad))
        p.set(torch.nn.Module, "zero_grad", self._wrap_zero_grad(torch.nn.Module.zero_grad))
        return self

    def __exit__(self, *exc: Any) -> None:
        for release in self.releases:
            release.remove()
        self.patcher.restore()

    def final_params(self) -> list[torch.Tensor]:
        return [p.detach().clone() for opt in self.optimizers for g in opt.param_groups for p in g["params"]]


def _run_mode(path: str, mode: str, args: Sequence[str], steps: int, meter: TensorMemoryMeter | None,
              fake: bool = False, on_step: Callable[[int], None] = lambda n: None,
              snapshot: str | None = None) -> tuple[_ModeRun, Outcome, Any]:
    from gradlint.runtime.fake import fake_tensors

    gc.collect()
    _seed()
    outer = fake_tensors() if fake else contextlib.nullcontext()
    cuda = None if fake or meter is None or not torch.cuda.is_available() else CudaPhaseMeter(snapshot=snapshot)
    with outer:
        run = _ModeRun(mode, steps, meter, on_step)
        if cuda is not None:
            run.sinks.append(cuda)
        with run, (cuda or contextlib.nullcontext()), (meter or contextlib.nullcontext()):
            outcome = run_script(path, args)
        run.params = None if fake else run.final_params()
    if not outcome.ok:
        from gradlint.runtime.run import user_traceback

        trace = user_traceback(outcome.exc, path) if outcome.exc else ""
        raise MeasureError(f"{mode}: the script {outcome.how}: {outcome.detail}", outcome.exc, outcome.detail, trace)
    if run.count == 0:
        raise MeasureError(f"{mode}: no optimizer step ran: the script has no training loop gradlint can follow")
    return run, outcome, cuda


def step_intervals(times: Sequence[float], warmup: int = 1) -> list[float]:
    """Seconds between consecutive loop steps, without the first ``warmup`` intervals (lazy state, caches)."""
    return [b - a for a, b in zip(times, times[1:])][warmup:]


def measure_mode(
    path: str,
    mode: str,
    args: Sequence[str] = (),
    steps: int = 5,
    fake: bool = False,
    on_step: Callable[[int], None] = lambda n: None,
    time_steps: int = 12,
    snapshot: str | None = None,
) -> ModeResult:
    """Run the script in ``mode``: once under the memory meter for ``steps`` steps, once without it to time.

    The meter intercepts every op and would inflate step times (about 2x), so
    times come from a second run of ``time_steps`` steps with no meter at all,
    on the same seed; the first interval is dropped as warm-up. On fake tensors
    nothing is timed. ``time_steps`` below 3 skips the timing run. On CUDA,
    ``snapshot`` names the file for the allocator's memory history.
    """
    meter = TensorMemoryMeter(timeline=True, flag_unsized=fake)
    run, outcome, cuda = _run_mode(path, mode, args, steps, meter, fake, on_step, snapshot)
    times: list[float] = []
    if not fake and time_steps >= 3:
        timed, _, _ = _run_mode(path, mode, args, time_steps, None)
        times = step_intervals(timed.times)
    return ModeResult(
        mode,
        run.count,
        meter.report(),
        times,
        run.params,
        _last_step_curve(meter),
        outcome,
        cuda.peak if cuda else None,
        run.release_loop,
        _last_step_phases(meter),
        cuda.phases if cuda else {},
        dict(meter.unsized or {}),
    )


def _last_step_window(meter: TensorMemoryMeter) -> tuple[float, float] | None:
    """Start and end (perf_counter seconds) of the last complete step: between two step marks.

    The very last step is cut short (the run is stopped inside its step hook,
    before its step phase is closed), so the one before it is shown.
    """
    timeline = meter.timeline or []
    if not timeline:
        return None
    by_op = {op: t for op, t, _ in timeline}
    ops = [op for op, _ in meter.marks]
    if len(ops) >= 3:
        start_op, end_op = ops[-3], ops[-2]
    elif len(ops) == 2:
        start_op, end_op = ops[0], ops[1]
    else:
        start_op, end_op = 0, ops[-1] if ops else timeline[-1][0]
    start = by_op.get(start_op, timeline[0][1])
    end = by_op.get(end_op, timeline[-1][1])
    return start, end


def _last_step_curve(meter: TensorMemoryMeter) -> list[tuple[float, int]]:
    """``(seconds since the step began, live bytes)`` over the last measured step."""
    window = _last_step_window(meter)
    if window is None:
        return []
    start, end = window
    return [(t - start, live) for _, t, live in meter.timeline or [] if start <= t <= end]


def _last_step_phases(meter: TensorMemoryMeter) -> list[tuple[str, float, float]]:
    """The phases (backward, step, clear) of the last measured step, in seconds since it began."""
    window = _last_step_window(meter)
    if window is None:
        return []
    start, end = window
    # phases that began in the window (the previous step's hooks may still be closing as it opens)
    return [(name, a - start, min(b, end) - start) for name, a, b in meter.phases if start <= a <= end]


def measure_script(
    path: str,
    args: Sequence[str] = (),
    steps: int = 5,
    fake: bool = False,
    progress: Callable[[str], None] = lambda s: None,
    time_steps: int = 12,
    snapshot_prefix: str | None = None,
) -> tuple[list[ModeResult], str | None]:
    """All three modes, in order; see :func:`measure_mode`.

    Returns the results and, when the loop cannot run with gradient release
    (a GradScaler, clipping, accumulation), the reason instead of that mode.
    """
    results: list[ModeResult] = []
    for i, mode in enumerate(MODES, 1):
        label = f"mode {i}/{len(MODES)} ({mode})"
        if mode == RELEASE and results[0].release_as_written:
            return results, RELEASED_AS_WRITTEN
        progress(f"{label}: starting")
        try:
            results.append(
                measure_mode(
                    path, mode, args, steps, fake,
                    on_step=lambda n, label=label: progress(f"{label}: step {n}/{steps}"),
                    time_steps=time_steps,
                    snapshot=f"{snapshot_prefix}.{mode.replace(' ', '-').replace('=', '-')}.pickle" if snapshot_prefix else None,
                )
            )
        except MeasureError as err:
            if mode == RELEASE and isinstance(err.cause, ReleaseUnsupported):
                return results, str(err.cause)
            if mode == RELEASE and err.cause is not None:
                # ran as written, fails once gradients are freed after backward: it reads them
                return results, f"the script fails under gradient release, which frees each gradient during backward: {err.detail}"
            raise
    return results, None


def max_param_difference(a: ModeResult, b: ModeResult) -> float | None:
    """Largest absolute parameter difference between two modes (``None`` on fake tensors)."""
    if a.params is None or b.params is None:
        return None
    if len(a.params) != len(b.params) or a.steps != b.steps:
        return float("nan")
    diffs = [float((x.double() - y.double()).abs().max()) if x.numel() else 0.0 for x, y in zip(a.params, b.params)]
    return max(diffs, default=0.0)


def human_bytes(n: float) -> str:
    """1536 -> '1.50 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def format_table(results: list[ModeResult], fake: bool = False, release_refused: str | None = None) -> str:
    """The table ``gradlint measure`` prints, with a plain verdict on gradient release."""
    short = {"optimizer state": "opt state"}
    headers = ["mode", "peak", *[short.get(c, c) for c in CATEGORIES], "step time", "max |Δparam|"]
    cuda = any(r.allocator_peak is not None for r in results)
    if cuda:
        headers.insert(2, "CUDA allocator peak")
    rows = []
    base = results[0]
    for r in results:
        t = r.median_step_time
        diff = max_param_difference(base, r)
        row = [
                r.mode,
                human_bytes(r.memory.peak),
                *[human_bytes(r.memory.split.get(c, 0)) for c in CATEGORIES],
                "-" if fake or t is None else f"{t * 1000:.1f} ms",
                "-" if diff is None else f"{diff:.3g}",
        ]
        if cuda:
            row.insert(2, "-" if r.allocator_peak is None else human_bytes(r.allocator_peak))
        rows.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in [headers, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(f"peak split at the moment of the peak; {base.steps} optimizer steps per mode"
                 + ("; fake tensors: nothing was allocated, no times or values" if fake
                    else f"; step time is the median between loop steps of a separate run without the meter "
                         f"({len(base.step_times)} intervals)"))
    for r in results:
        if r.cuda_phases:
            per_phase = ", ".join(
                f"{phase} {human_bytes(v['allocated'])}/{human_bytes(v['reserved'])}/{human_bytes(v['peak'])}"
                for phase, v in r.cuda_phases.items()
            )
            lines.append(f"CUDA allocator, {r.mode} (allocated/reserved/peak at the end of each phase): {per_phase}")
    unsized = sorted({op for r in results for op in r.unsized_ops})
    if unsized:
        lines.append(
            "the fake estimate is LOW: it cannot size what these ops allocate in a real run: "
            + "; ".join(f"{op.removeprefix('aten.')} ({UNSIZED_BY_FAKE[op]})" for op in unsized)
        )
    if release_refused:
        lines.append(f"gradient release: not applicable to this loop: {release_refused}")
    else:
        lines.append(release_verdict(results))
    return "\n".join(lines)


def release_verdict(results: list[ModeResult]) -> str:
    """One sentence on whether gradient release lowers the peak here."""
    by_mode = {r.mode: r for r in results}
    plain, release = by_mode.get(AS_WRITTEN), by_mode.get(RELEASE)
    if plain is None or release is None:
        return ""
    delta = plain.memory.peak - release.memory.peak
    if delta > 0:
        return f"gradient release lowers the peak by {human_bytes(delta)} ({delta / plain.memory.peak:.0%}) in this loop."
    return (
        f"gradient release does NOT lower the peak in this loop ({human_bytes(-delta)} higher): the peak is set by "
        f"{max(release.memory.split, key=lambda c: release.memory.split[c])}, not by gradients."
    )


_STYLES = {AS_WRITTEN: ("-", 3.0, "tab:blue"), SET_TO_NONE: ("--", 1.8, "tab:orange"), RELEASE: (":", 2.2, "tab:green")}
_PHASE_COLOURS = {"forward": "#d9d9d9", "backward": "#9ecae1", "step": "#fdae6b", "clear": "#a1d99b"}


def _phase_spans(result: ModeResult) -> list[tuple[str, float, float]]:
    """Backward, step and clear spans of the plotted step; the gaps between them are the forward (and data)."""
    end = max((t for t, _ in result.curve), default=0.0)
    spans = sorted(p for p in result.phases if p[0] != "step" or not any(
        q[0] == "backward" and q[1] <= p[1] and p[2] <= q[2] for q in result.phases))  # release steps inside backward
    out, cursor = [], 0.0
    for name, a, b in sorted(spans, key=lambda p: p[1]):
        if a > cursor:
            out.append(("forward", cursor, a))
        out.append((name, a, b))
        cursor = max(cursor, b)
    if end > cursor:
        out.append(("forward", cursor, end))
    return out


def plot(results: list[ModeResult], path: str) -> None:
    """Write a PNG of live memory over the last measured step of each mode.

    One time axis for all modes (milliseconds since the step began, under the
    meter), a line style per mode so overlapping curves stay visible, the peak
    of each in the legend, and a strip per mode showing its phases: forward,
    backward, step, clear.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    shown = [r for r in results if r.curve]
    top = max((b for r in shown for _, b in r.curve), default=1)
    unit, scale = next(((u, f) for u, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if top >= f), ("B", 1))
    fig, (ax, strip) = plt.subplots(
        2, 1, figsize=(9, 5.5), sharex=True, gridspec_kw={"height_ratios": [4, 0.35 * max(len(shown), 1)]}
    )
    for r in shown:
        style, width, colour = _STYLES.get(r.mode, ("-", 1.5, None))
        xs = [t * 1000 for t, _ in r.curve]
        ys = [b / scale for _, b in r.curve]
        ax.step(xs, ys, where="post", linestyle=style, linewidth=width, color=colour,
                label=f"{r.mode}: peak {human_bytes(r.memory.peak)}")
    ax.set_ylabel(f"live tensor memory ({unit})")
    ax.set_title("memory over one training step (the last complete one)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left")
    for row, r in enumerate(shown):
        for name, a, b in _phase_spans(r):
            strip.broken_barh([(a * 1000, max(b - a, 1e-6) * 1000)], (row - 0.4, 0.8), color=_PHASE_COLOURS[name])
        for name, a, b in r.phases:  # optimizer steps inside backward (gradient release): drawn over it
            if name == "step" and any(q[0] == "backward" and q[1] <= a and b <= q[2] for q in r.phases):
                strip.broken_barh([(a * 1000, max(b - a, 1e-6) * 1000)], (row - 0.2, 0.4), color=_PHASE_COLOURS["step"])
    strip.set_yticks(range(len(shown)), [r.mode for r in shown])
    strip.set_ylim(len(shown) - 0.5, -0.5)
    strip.set_xlabel("time since the step began (ms, measured under the memory meter)")
    strip.legend(handles=[Patch(color=c, label=n) for n, c in _PHASE_COLOURS.items()], loc="upper center",
                 bbox_to_anchor=(0.5, -0.9), ncol=4, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
