"""``gradlint measure``: run a loop as written, with ``set_to_none=True``, with gradient release and fused.

Each mode runs the user's script from the top (:mod:`~gradlint.runtime.modes`)
under a :class:`TensorMemoryMeter` (and the CUDA allocator, per phase, on a
GPU), stops it after the same number of optimizer steps, and keeps the peak
with its split, the parameters at the end and the memory curve of the last
step; a second run of the mode, without any meter, times it. Every run is a
process of its own (:mod:`~gradlint.runtime.isolation`): each starts from the
same allocator baseline, with nothing of an earlier run alive, and what
survives a run is reported as such.

The gradient release mode measures what ``gradlint check --fix`` would give:
the script's GL204 rewrite run as written (the optimizer kept and handed to
:class:`~gradlint.runtime.release.GradientRelease`; torch-optimi's release
in a module that already uses optimi, where optimi is installed), and
elsewhere gradlint's own release applied to every optimizer the script
builds; the table says which.
On CUDA, unless the script made its algorithms deterministic, the as-written
mode runs a second time to measure the run-to-run noise that parameter
differences are judged against.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
from typing import Any, Callable, Sequence

import torch

from gradlint.runtime.isolation import ChildDied, call_in_child
from gradlint.runtime.launch import Outcome
from gradlint.runtime.memory import CATEGORIES, UNSIZED_BY_FAKE, MemoryReport
from gradlint.runtime.modes import (
    AS_WRITTEN,
    FUSED,
    MODES,
    RELEASE,
    SET_TO_NONE,
    MeasureError,
    RunResult,
    RunSpec,
    run_in_child,
)

__all__ = ["AS_WRITTEN", "FUSED", "MODES", "OPTIMI_REWRITE", "RELEASE", "REWRITE_RELEASE", "SET_TO_NONE",
           "MeasureError", "ModeResult", "measure_mode", "measure_script", "max_param_difference", "format_table",
           "plot"]

RELEASED_AS_WRITTEN = (
    "the script already releases gradients as written (its optimizers step inside backward); "
    "'as written' is the gradient release measurement"
)
OWN_RELEASE = "gradlint GradientRelease"
REWRITE_RELEASE = "GL204 rewrite (GradientRelease)"
OPTIMI_REWRITE = "GL204 rewrite (torch-optimi)"
REWRITES = {REWRITE_RELEASE: "GradientRelease", OPTIMI_REWRITE: "torch-optimi"}


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
    survived: int = 0  # tensor bytes the run made that outlived its objects
    allocator: dict[str, Any] = dataclasses.field(default_factory=dict)  # CUDA: baseline, survived, workspaces
    kernels: list[str] = dataclasses.field(default_factory=list)
    fused_candidates: list[str] = dataclasses.field(default_factory=list)
    release_kernels: list[str] = dataclasses.field(default_factory=list)
    variant: str = ""  # gradient release: REWRITE_RELEASE, OPTIMI_REWRITE, or OWN_RELEASE and why
    param_devices: list[str] = dataclasses.field(default_factory=list)
    deterministic: bool = False
    device_story: str = ""
    noise: float | None = None  # as written: max |Δparam| between two as-written runs (CUDA)
    step_time_again: float | None = None  # as written: the median step of the second as-written run, where timed

    @property
    def median_step_time(self) -> float | None:
        return statistics.median(self.step_times) if self.step_times else None


def step_intervals(times: Sequence[float], warmup: int = 1) -> list[float]:
    """Seconds between consecutive loop steps, without the first ``warmup`` intervals (lazy state, caches)."""
    return [b - a for a, b in zip(times, times[1:])][warmup:]


def _in_child(spec: RunSpec, on_step: Callable[[int], None]) -> RunResult:
    from gradlint.runtime import launch

    def on_message(message: tuple[str, int]) -> None:
        kind, value = message
        if kind == "step":
            on_step(value)
        else:  # "groups closed"
            launch.set_groups_closed(value)

    spec.groups_closed = launch.groups_closed()
    try:
        return call_in_child(run_in_child, spec, on_message=on_message)
    except ChildDied as died:
        raise MeasureError(f"{spec.mode}: {died}") from None


def _load_params(path: str) -> list[torch.Tensor]:
    """The parameters a child wrote, mapped from the file rather than read (a large model's stay on disk)."""
    return torch.load(path, mmap=True, weights_only=True)


def measure_mode(
    path: str,
    mode: str,
    args: Sequence[str] = (),
    steps: int = 5,
    fake: bool = False,
    on_step: Callable[[int], None] = lambda n: None,
    time_steps: int = 12,
    snapshot: str | None = None,
    source: str | None = None,
    release_fused: bool = True,
) -> ModeResult:
    """Run the script in ``mode``: once under the memory meter for ``steps`` steps, once without it to time.

    Each run is a fresh process. The meter intercepts every op and would
    inflate step times (about 2x), so times come from a second run of
    ``time_steps`` steps with no meter at all, on the same seed; the first
    interval is dropped as warm-up. On fake tensors nothing is timed.
    ``time_steps`` below 3 skips the timing run. On CUDA, ``snapshot`` names
    the file for the allocator's memory history. ``source``: text to run
    instead of the file's (the GL204 rewrite).
    """
    path = os.path.abspath(path)
    with tempfile.TemporaryDirectory(prefix="gradlint-measure-") as folder:
        params_file = None if fake else os.path.join(folder, "params.pt")
        spec = RunSpec(path, mode, tuple(args), steps, True, fake, snapshot, params_file, source=source,
                       release_fused=release_fused)
        metered = _in_child(spec, on_step)
        params = _load_params(params_file) if params_file else None
    times: list[float] = []
    if not fake and time_steps >= 3:
        timed = _in_child(dataclasses.replace(spec, steps=time_steps, metered=False, snapshot=None, params_file=None),
                          lambda n: None)
        times = step_intervals(timed.times)
    allocator = metered.allocator
    return ModeResult(
        mode,
        metered.count,
        metered.memory,
        times,
        params,
        _last_step_curve(metered),
        Outcome(metered.how),
        allocator.get("peak"),
        metered.release_as_written,
        _last_step_phases(metered),
        allocator.get("phases", {}),
        metered.unsized_ops,
        metered.survived or 0,
        {k: v for k, v in allocator.items() if k not in ("peak", "phases")},
        metered.kernels,
        metered.fused_candidates,
        metered.release_kernels,
        param_devices=metered.param_devices,
        deterministic=metered.deterministic,
        device_story=metered.device_story,
    )


def gl204_rewrite(path: str) -> tuple[str | None, str]:
    """The text ``gradlint check --fix --select GL204 --unsafe-fixes`` would write, or ``None`` and why not."""
    try:
        from gradlint.config import Config
        from gradlint.fixer import fix_text
    except ImportError:
        return None, "the static linter is not installed"
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    outcome = fix_text(text, path, Config(select=("GL204",)), unsafe=True)
    if outcome.changed:
        return outcome.text, ""
    if any(f.code == "GL204" for f in outcome.result.findings):
        return None, "GL204 flags the loop but cannot rewrite it (its optimizer or its shape is not one the fix handles)"
    return None, "GL204 does not flag this loop, so --fix offers no rewrite"


def _optimi_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("optimi") is not None


def _last_step_window(meter: RunResult) -> tuple[float, float] | None:
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


def _last_step_curve(meter: RunResult) -> list[tuple[float, int]]:
    """``(seconds since the step began, live bytes)`` over the last measured step."""
    window = _last_step_window(meter)
    if window is None:
        return []
    start, end = window
    return [(t - start, live) for _, t, live in meter.timeline or [] if start <= t <= end]


def _last_step_phases(meter: RunResult) -> list[tuple[str, float, float]]:
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
    noise: bool | None = None,
) -> tuple[list[ModeResult], str | None]:
    """Every mode, in order; see :func:`measure_mode`.

    Returns the results and, when the loop cannot run with gradient release
    (a GradScaler, clipping, accumulation), the reason instead of that mode.
    The fused optimizer mode runs when an optimizer of the script has a fused
    kernel it does not use. ``noise``: rerun the as-written mode to measure
    run-to-run noise (``None``: where runs can differ, see :func:`noise_floor_needed`).
    """
    total = len(MODES)

    def run(mode: str, number: int, **extra: Any) -> ModeResult:
        label = f"mode {number}/{total} ({mode})"
        progress(f"{label}: starting")
        name = mode.replace(" ", "-").replace("=", "-")
        return measure_mode(
            path, mode, args, steps, fake,
            on_step=lambda n: progress(f"{label}: step {n}/{steps}"),
            time_steps=time_steps,
            snapshot=f"{snapshot_prefix}.{name}.pickle" if snapshot_prefix else None,
            **extra,
        )

    base = run(AS_WRITTEN, 1)
    results = [base]
    if not fake and (noise or (noise is None and noise_floor_needed(base))):
        progress("as written, again: run-to-run noise")
        again = measure_mode(path, AS_WRITTEN, args, steps, time_steps=time_steps)
        base.noise = max_param_difference(base, again)
        base.step_time_again = again.median_step_time
    results.append(run(SET_TO_NONE, 2))
    refused = None
    if base.release_as_written:
        refused = RELEASED_AS_WRITTEN
    else:
        try:
            results.append(_measure_release(path, run))
        except MeasureError as err:
            if err.cause == "ReleaseUnsupported":
                refused = err.reason
            elif err.cause is not None:
                # ran as written, fails once gradients are freed after backward: it reads them
                refused = f"the script fails under gradient release, which frees each gradient during backward: {err.detail}"
            else:
                raise
    if base.fused_candidates:
        results.append(run(FUSED, 4))
    return results, refused


def noise_floor_needed(base: ModeResult) -> bool:
    """Whether two runs of the same script can differ: parameters on CUDA, algorithms not made deterministic."""
    return base.params is not None and "cuda" in base.param_devices and not base.deterministic


def _measure_release(path: str, run: Callable[..., ModeResult]) -> ModeResult:
    """The release mode on the GL204 rewrite where ``--fix`` can write one, on gradlint's own release elsewhere."""
    source, why = gl204_rewrite(path)
    variant = REWRITE_RELEASE if source is None or "GradientRelease(" in source else OPTIMI_REWRITE
    if source is not None and variant == OPTIMI_REWRITE and not _optimi_installed():
        source, why = None, "the GL204 rewrite uses torch-optimi, which is not installed (pip install torch-optimi)"
    if source is not None:
        try:
            result = run(RELEASE, 3, source=source)
        except MeasureError as err:
            why = f"the GL204 rewrite failed when run ({err.detail})"
        else:
            result.variant = variant
            return result
    result = run(RELEASE, 3)
    result.variant = f"{OWN_RELEASE}: {why}"
    return result


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
    """The table ``gradlint measure`` prints, with plain verdicts on gradient release, fused and the differences."""
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
    lines.append(f"peak split at the moment of the peak; {base.steps} optimizer steps per mode, each run in a "
                 f"process of its own"
                 + ("; fake tensors: nothing was allocated, no times or values" if fake
                    else f"; step time is the median between loop steps of a separate run without the meter "
                         f"({len(base.step_times)} intervals)"))
    if fake and base.device_story:
        lines.append(f"fake tensors: {base.device_story}")
    lines.append(timing_noise_line(base))
    lines.extend(_allocator_lines(results))
    survivors = [r for r in results if r.survived]
    if survivors:
        lines.append("outlived its run (still alive once the script's objects were let go: a module's cache, a "
                     "reference cycle through tensor hooks that gc does not break; gone with the run's process, not "
                     "counted in the next mode): "
                     + ", ".join(f"{r.mode} {human_bytes(r.survived)}" for r in survivors))
    unsized = sorted({op for r in results for op in r.unsized_ops})
    if unsized:
        lines.append(
            "the fake estimate is LOW: it cannot size what these ops allocate in a real run: "
            + "; ".join(f"{op.removeprefix('aten.')} ({UNSIZED_BY_FAKE[op]})" for op in unsized)
        )
    if not fake:
        lines.extend(difference_lines(results))
    by_mode = {r.mode: r for r in results}
    if RELEASE in by_mode and by_mode[RELEASE].variant:
        variant = by_mode[RELEASE].variant
        lines.append("gradient release measured on " + (
            f"the script's GL204 rewrite ({REWRITES[variant]}), as `gradlint check --select GL204 --unsafe-fixes "
            f"--fix` writes it" if variant in REWRITES else f"{variant}"))
    if release_refused:
        lines.append(f"gradient release: not applicable to this loop: {release_refused}")
    else:
        lines.append(release_verdict(results))
    lines.append(fused_verdict(results))
    return "\n".join(line for line in lines if line)


def _allocator_lines(results: list[ModeResult]) -> list[str]:
    lines = []
    for r in results:
        if not r.cuda_phases:
            continue
        per_phase = ", ".join(
            f"{phase} {human_bytes(v['allocated'])}/{human_bytes(v['reserved'])}/{human_bytes(v['peak'])}"
            for phase, v in r.cuda_phases.items()
        )
        lines.append(f"CUDA allocator, {r.mode} (allocated/reserved/peak of each phase, from the run's baseline of "
                     f"{human_bytes(r.allocator.get('baseline', 0))}): {per_phase}")
        workspaces, survived = r.allocator.get("workspaces", 0), r.allocator.get("survived", 0)
        if workspaces or survived:
            lines.append(f"  {r.mode}: cuBLAS workspaces {human_bytes(workspaces)} (in the allocator peak, not tensors); "
                         f"still allocated after the run's objects were gone: {human_bytes(survived)}")
    return lines


def timing_noise_line(base: ModeResult) -> str:
    """How far apart two identical as-written runs' step times were: the floor for comparing modes' times."""
    first, again = base.median_step_time, base.step_time_again
    if first is None or again is None:
        return ""
    spread = abs(first - again) / min(first, again)
    return (f"step time of as written, run twice: {first * 1000:.1f} and {again * 1000:.1f} ms ({spread:.0%} apart): "
            f"differences between modes' step times of that order are run-to-run noise")


NOISE_FACTOR = 4  # a difference up to this many times the measured run-to-run noise is of its order


def judge_difference(diff: float | None, noise: float | None) -> str:
    """A difference from the as-written run in words, against the run-to-run noise where it was measured."""
    if diff is None:
        return "not compared"
    if diff != diff:
        return "not comparable (the modes stepped different parameters)"
    if diff == 0:
        return "bitwise equal"
    if noise is None:
        return f"{diff:.3g}"
    if noise == 0:
        return f"{diff:.3g}: beyond run-to-run noise (two as-written runs were bitwise equal)"
    ratio = diff / noise
    if ratio <= 1:
        return f"{diff:.3g}: within run-to-run noise ({noise:.3g})"
    if ratio <= NOISE_FACTOR:
        return f"{diff:.3g}: of the order of run-to-run noise ({ratio:.1f}x the {noise:.3g} between two as-written runs)"
    return f"{diff:.3g}: beyond run-to-run noise ({ratio:.0f}x the {noise:.3g} between two as-written runs)"


def difference_lines(results: list[ModeResult]) -> list[str]:
    """What max |Δparam| means for each mode: noise, the kernels' rounding, or a real difference."""
    base = results[0]
    if base.noise is not None:
        head = f"max |Δparam| against as written, whose run-to-run noise is {base.noise:.3g} (as written run twice)"
    elif base.deterministic:
        head = "max |Δparam| against as written (the script uses deterministic algorithms: not run twice)"
    else:
        head = "max |Δparam| against as written (not run twice: parameters on the CPU)"
    parts = []
    for r in results[1:]:
        words = judge_difference(max_param_difference(base, r), base.noise)
        kernels = r.release_kernels if r.mode == RELEASE and r.release_kernels else r.kernels
        if r.mode in (RELEASE, FUSED) and kernels and sorted(kernels) != sorted(base.kernels) and words != "bitwise equal":
            words += f" (steps with {', '.join(kernels)}; as written with {', '.join(base.kernels)}: rounding differs)"
        parts.append(f"{r.mode} {words}")
    return [f"{head}: " + "; ".join(parts)] if parts else []


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


def fused_verdict(results: list[ModeResult]) -> str:
    """One sentence on ``fused=True``: its saving, or why it was not measured."""
    by_mode = {r.mode: r for r in results}
    plain, fused = by_mode.get(AS_WRITTEN), by_mode.get(FUSED)
    if plain is None:
        return ""
    if fused is None:
        kernels = ", ".join(plain.kernels) or "none"
        return f"fused optimizer: not measured: no optimizer of the script has a fused kernel it does not use ({kernels})."
    delta = plain.memory.peak - fused.memory.peak
    names = ", ".join(sorted(set(plain.fused_candidates)))
    if delta > 0:
        return (f"fused=True on {names} lowers the peak by {human_bytes(delta)} ({delta / plain.memory.peak:.0%}): "
                f"the fused kernel makes no temporaries, and it is one argument to the constructor.")
    if delta == 0:
        return f"fused=True on {names} leaves the peak as it is in this loop (its temporaries do not set the peak)."
    return f"fused=True on {names} does not lower the peak in this loop ({human_bytes(-delta)} higher)."


_STYLES = {AS_WRITTEN: ("-", 3.0, "tab:blue"), SET_TO_NONE: ("--", 1.8, "tab:orange"), RELEASE: (":", 2.2, "tab:green"),
           FUSED: ("-.", 1.8, "tab:purple")}
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
