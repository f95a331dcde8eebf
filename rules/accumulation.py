"""Rules about gradient accumulation beyond clearing and dividing (GL006–GL008).

When clipping runs, and who divides the loss by the number of micro-batches:
the loop itself or the framework it hands the loss to.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from gradlint.events import EventKind
from gradlint.findings import Severity
from gradlint.frameworks import framework_settings
from gradlint.model import Event, Frame, FrameKind, LoopModel, Root
from gradlint.queries import Accumulation, accumulation, clears, exclusive, frames_inside, home_loop, leaves_before, steps_with_loops
from gradlint.rule import BACKWARD, STEP, Report, Rule
from gradlint.syntax import dotted_name, keyword_arg, positional_args


class ClipPerMicroBatch(Rule):
    """Gradients are clipped on every micro-batch while the optimizer steps only once per accumulation, or after the step.

    **Why it matters.** Clipping is meant for the gradient the optimizer
    applies: the sum over all micro-batches of an accumulation. Clipping on
    every micro-batch clips partial sums instead: the first micro-batches'
    share is clipped again and again, the clipping threshold no longer
    bounds the step, and the result depends on how the batch was split.
    Inside ``with accelerator.accumulate(model):`` ``optimizer.step()`` is a
    no-op on the micro-batches that do not sync, but
    ``accelerator.clip_grad_norm_`` is not (accelerate's own examples guard
    it with ``if accelerator.sync_gradients:``); under DDP those gradients
    are not even all-reduced yet. Clipping after ``optimizer.step()`` in the
    same iteration is the opposite mistake: the step has already used the
    unclipped gradients, and the clipped ones are cleared before the next
    backward.

    **Fix.** Clip exactly once per optimizer step, after the last backward
    of the accumulation and before the step: under the same guard as the
    step (``if accelerator.sync_gradients:`` with accelerate).

    **Bad**::

        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / accum).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()

    **Good**::

        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()

    **Stays quiet when** the clip only measures the norm
    (``max_norm=float("inf")``); the clip sits under an accumulation guard or
    leaves the loop before the step; inside ``accelerator.accumulate()``, when
    the module builds its ``Accelerator`` without any accumulation setting
    (every batch then syncs); after the step, when a backward or another step
    follows the clip in the same iteration (it may be meant for them) or the
    loop never clears the stepped optimizer's gradients (the clipped values
    would then reach the next step).
    """

    code = "GL006"
    name = "clip-per-micro-batch"
    summary = "gradients are clipped on every micro-batch of an accumulation, or after the step that used them"
    severity = Severity.ERROR
    fix = None  # where the clip belongs depends on what else the loop does between backward and step
    needs = ((BACKWARD, STEP, "clip"),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            reported: set[int] = set()
            for report in self._per_micro_batch(model, root):
                reported.add(id(report.node))
                yield report
            for report in self._in_accumulate(model, root):
                if id(report.node) not in reported:
                    reported.add(id(report.node))
                    yield report
            for report in self._after_step(model, root):
                if id(report.node) not in reported:
                    yield report

    def _per_micro_batch(self, model: LoopModel, root: Root) -> Iterator[Report]:
        """Clips that run on every micro-batch while the step waits for the accumulation boundary."""
        seen: set[int] = set()
        for step, loop in steps_with_loops(root):
            acc = accumulation(root, step, loop)
            if acc is None:
                continue
            for clip in root.events_of(EventKind.CLIP, loop):
                if id(clip) in seen or not _clips(clip) or not _every_micro_batch(clip, loop, acc):
                    continue
                if leaves_before(clip, step) or exclusive(clip, step):
                    continue
                seen.add(id(clip))
                yield Report(
                    clip.node,
                    f"`{model.code(clip.node)}` clips on every micro-batch but `{step.target}` only steps "
                    f"{_where(model, acc)}: it clips partial sums of the gradients; clip once, right before the step",
                )

    def _in_accumulate(self, model: LoopModel, root: Root) -> Iterator[Report]:
        """Clips inside ``accelerator.accumulate()`` with no ``if accelerator.sync_gradients:`` around them."""
        if framework_settings(model).accelerator_without_accumulation and not framework_settings(model).accelerator_counts:
            return
        for clip in root.events_of(EventKind.CLIP):
            context = _accumulate_frame(clip)
            if context is None or not _clips(clip) or any(f.kind is FrameKind.BRANCH and f.accumulation for f in clip.frames):
                continue
            if not root.events_of(EventKind.STEP, context):
                continue
            yield Report(
                clip.node,
                f"`{model.code(clip.node)}` runs on every micro-batch inside `accumulate()` at line "
                f"{model.line(context.node)}, also on those that do not step: it clips partial (and, under DDP, "
                f"not yet all-reduced) gradients; clip under `if accelerator.sync_gradients:`",
            )

    def _after_step(self, model: LoopModel, root: Root) -> Iterator[Report]:
        """Clips that come after the step in the same iteration, with nothing after them that could use them."""
        for clip in root.events_of(EventKind.CLIP):
            if not clip.loops or not _clips(clip):
                continue
            loop = clip.loops[-1]
            events = root.events_in(loop)
            at = root.order(clip)
            if any(root.order(e) > at and e.kind in (EventKind.BACKWARD, EventKind.STEP) for e in events):
                continue
            steps = [
                e for e in events
                if e.kind is EventKind.STEP and root.order(e) < at and not exclusive(e, clip) and home_loop(root, e) is loop
            ]
            if not steps:
                continue
            step = steps[-1]
            if not any(clears(model, z, step.target) for z in root.events_of(EventKind.ZERO, loop)):
                continue
            yield Report(
                clip.node,
                f"`{model.code(clip.node)}` clips after `{step.target}` stepped at line {model.line(step.node)}: "
                f"the step already used the unclipped gradients; clip between the backward and the step",
            )


def _clips(clip: Event) -> bool:
    """Whether a clipping call can change gradients: not when its threshold is infinite (it only measures the norm)."""
    call = clip.node
    if not isinstance(call, cst.Call):
        return True
    args = positional_args(call)
    threshold = keyword_arg(call, "max_norm") or keyword_arg(call, "clip_value") or keyword_arg(call, "gradient_clip_val")
    if threshold is None:  # clip_grad_norm_(params, max_norm); model.clip_grad_norm_(max_norm) (FSDP)
        threshold = args[1] if len(args) >= 2 else (args[0] if len(args) == 1 else None)
    return threshold is None or not _is_infinite(threshold.value)


def _is_infinite(node: cst.BaseExpression) -> bool:
    """``float("inf")``, ``math.inf``, ``torch.inf``, ``np.inf``."""
    if isinstance(node, cst.Call) and dotted_name(node.func) == "float":
        args = positional_args(node)
        return len(args) == 1 and isinstance(args[0].value, cst.SimpleString) and args[0].value.evaluated_value.lower() in ("inf", "infinity")
    name = dotted_name(node)
    return name is not None and name.rsplit(".", 1)[-1] == "inf"


def _every_micro_batch(event: Event, loop: Frame, acc: Accumulation) -> bool:
    """Whether an event runs on the micro-batches that do not step."""
    if acc.style == "guard":
        return not any(f.accumulation for f in frames_inside(event, loop))
    return event.inside(acc.frame)


def _accumulate_frame(event: Event) -> Frame | None:
    """The innermost ``with accelerator.accumulate(...)`` around an event."""
    return next((f for f in reversed(event.frames) if f.kind is FrameKind.WITH and f.context == "accumulate"), None)


def _where(model: LoopModel, acc: Accumulation) -> str:
    if acc.style == "guard":
        return f"under the accumulation guard at line {model.line(acc.frame.node)}"
    return f"after the micro-batch loop at line {model.line(acc.frame.node)}"
