"""Rules about mixed precision with a ``GradScaler`` (GL101–GL105)."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from gradlint.events import EventKind
from gradlint.findings import FixKind, Severity
from gradlint.fixes import amp as fixes
from gradlint.model import Event, LoopModel
from gradlint.objects import last_name
from gradlint.queries import (
    Accumulation,
    accumulation,
    accumulation_place,
    backwards_reaching,
    exclusive,
    home_loop,
    innermost_loop,
    leaves_before,
    loop_phrase,
    region,
    runs_every_micro_batch,
    same_object,
    stepping_loop,
    steps_with_loops,
)
from gradlint.rule import BACKWARD, SCALER, STEP, Report, Rule, Settled, call_of
from gradlint.syntax import dotted_name, receiver

_SCALER_EVENTS = (EventKind.UNSCALE, EventKind.SCALER_UPDATE)


def _uses_scaler(event: Event) -> bool:
    return event.kind in _SCALER_EVENTS or (event.kind is EventKind.STEP and event.via_scaler is not None)


def _unscales(event: Event) -> bool:
    """Whether gradients are unscaled here: ``scaler.unscale_(opt)``, or ``scaler.step(opt)``, which unscales first."""
    return event.kind is EventKind.UNSCALE or (event.kind is EventKind.STEP and event.via_scaler is not None)


def _scaler_name(event: Event) -> str:
    return event.via_scaler or event.target or "scaler"


class BackwardWithoutScaler(Rule):
    """A ``GradScaler`` steps the optimizer, but the loss is backpropagated without ``scaler.scale()``.

    **Why it matters.** ``scaler.step()`` unscales the gradients by the loss
    scale before stepping. If the loss was never scaled, the gradients are
    divided by a scale they never got (65536 by default): the updates are
    tiny, and float16 gradients may underflow to zero.

    **Fix.** ``scaler.scale(loss).backward()``.

    **Stays quiet when**

    - another backward of the same loop is scaled (the scaler is optional:
      ``if scaler: ... else: loss.backward()``);
    - a framework backpropagates (``accelerator.backward``, Lightning, a
      DeepSpeed engine), or the loss is rebound to ``scaler.scale(loss)``
      (also through ``typing.cast``).

    **Bad**::

        loss.backward()
        scaler.step(optimizer)
        scaler.update()

    **Good**::

        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """

    code = "GL101"
    name = "backward-without-scaler"
    summary = "a GradScaler is in use but the loss is backpropagated without scaler.scale()"
    severity = Severity.ERROR
    fix = FixKind.SAFE
    # A scaler in use: scaler.step(), scaler.update() or scaler.unscale_().
    needs = ((BACKWARD, STEP, SCALER), (BACKWARD, call_of("update"), SCALER), (BACKWARD, call_of("unscale_"), SCALER))

    def check(self, model: LoopModel) -> Iterator[Report]:
        settled = Settled()
        for root in model.roots:
            done: set[int] = set()  # regions whose every unscaled backward is settled
            for user in (e for e in root.events if _uses_scaler(e)):
                loop = innermost_loop(user)
                if id(loop) in done:
                    continue
                events = region(root, user)
                backwards = [e for e in events if e.kind is EventKind.BACKWARD and e.framework is None]
                if any(b.scaled for b in backwards):
                    done.add(id(loop))
                    continue
                scaler = _scaler_name(user)
                for backward in backwards:
                    if backward.node in settled:
                        continue
                    yield settled.note(
                        Report(
                            backward.node,
                            f"`{scaler}` is used at line {model.line(user.node)} but this backward is not scaled: "
                            f"use `{scaler}.scale({model.code(backward.loss) if backward.loss is not None else 'loss'}).backward()`",
                            fix=fixes.scale_backward(model, backward, user),
                        )
                    )
                if all(b.node in settled for b in backwards):
                    done.add(id(loop))


class StepBypassesScaler(Rule):
    """The loss is backpropagated through ``scaler.scale()``, but the optimizer is stepped directly.

    **Why it matters.** The gradients are still multiplied by the loss scale,
    so ``optimizer.step()`` applies updates thousands of times too large, and
    steps with inf/NaN gradients are not skipped.

    **Fix.** ``scaler.step(optimizer)`` followed by ``scaler.update()``.

    **Stays quiet when**

    - the direct step and the scaled backward sit in complementary branches
      (``if amp: scaler.step(opt) else: opt.step()``), also when each branch
      calls its own method;
    - the optimizer is also stepped through the scaler, or steps a closure.

    **Bad**::

        scaler.scale(loss).backward()
        optimizer.step()

    **Good**::

        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """

    code = "GL102"
    name = "step-bypasses-scaler"
    summary = "a scaled backward is followed by optimizer.step() instead of scaler.step(optimizer)"
    severity = Severity.ERROR
    fix = FixKind.SAFE
    needs = ((BACKWARD, STEP, SCALER),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            reaching: dict[int, list[Event]] = {}
            bypassing: dict[int, list[Event]] = {}  # per stepping loop: its direct steps of optimizers no scaler steps
            for backward in root.events_of(EventKind.BACKWARD):
                if not backward.scaled:
                    continue
                loop = stepping_loop(root, backward)
                if id(loop) not in bypassing:
                    steps = root.events_of(EventKind.STEP, loop)
                    scaled = {last_name(s.target) for s in steps if s.via_scaler is not None and s.target is not None}
                    bypassing[id(loop)] = [
                        s for s in steps
                        if s.via_scaler is None and s.framework not in ("closure", "handed") and (s.target is None or last_name(s.target) not in scaled)
                    ]
                for step in bypassing[id(loop)]:
                    if id(step) not in reaching:
                        reaching[id(step)] = backwards_reaching(root.events, step, position=root.order(step))
                    if not any(b is backward for b in reaching[id(step)]):
                        continue  # another backward (or none) feeds this step
                    scaler = _scaler_of(backward, model)
                    yield Report(
                        step.node,
                        f"the backward at line {model.line(backward.node)} is scaled by `{scaler}` but "
                        f"`{step.target}.step()` bypasses it: use `{scaler}.step({step.target})` so the gradients "
                        f"are unscaled and inf/NaN steps are skipped",
                        fix=fixes.step_through_scaler(model, step, backward),
                    )


def _scaler_of(backward: Event, model: LoopModel) -> str:
    """The scaler in ``scaler.scale(loss).backward()``."""
    scale_call = receiver(backward.node) if type(backward.node) is cst.Call else None
    if type(scale_call) is cst.Call:
        return dotted_name(receiver(scale_call)) or "scaler"
    return "scaler"


class ClipBeforeUnscale(Rule):
    """Gradients are clipped while they are still multiplied by the loss scale.

    **Why it matters.** After ``scaler.scale(loss).backward()`` every gradient
    is multiplied by the loss scale (65536 at first). Clipping to a norm of
    1.0 then clips almost every step, by the wrong amount, and changes as the
    scale changes.

    **Fix.** Call ``scaler.unscale_(optimizer)`` before clipping.

    **Stays quiet when**

    - ``scaler.unscale_(optimizer)`` runs between the scaled backward and the
      clip, or the clip only runs on the unscaled branch;
    - the clip is a framework's (``accelerator.clip_grad_norm_`` unscales first).

    **Bad**::

        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)

    **Good**::

        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)

    Also flagged: a step function that clips and then calls
    ``scaler.step(opt)`` with no ``unscale_`` before the clip, called from a
    loop of the run (in this module or another of its package) that does
    the scaled backward.

    **Stays quiet when** an ``unscale_`` runs between the scaled backward and
    the clip (in the step function, or in any function of the run that calls
    it), the clip is accelerate's or another framework's (they unscale
    first), or the backward that reaches the clip is not scaled.
    """

    code = "GL103"
    name = "clip-before-unscale"
    summary = "gradients are clipped before scaler.unscale_(optimizer)"
    severity = Severity.ERROR
    fix = FixKind.SAFE
    needs = ((BACKWARD, "clip", SCALER), (STEP, "clip", SCALER))  # the second: a step function whose caller scales the backward

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            for event in root.events:
                if event.kind is EventKind.CLIP and event.framework is None:
                    position = root.order(event)
                    reaching = backwards_reaching(root.events, event, stop=_unscales, position=position)
                    last_backward = next((b for b in reaching if b.scaled), None)
                    if last_backward is not None:
                        scaler = _scaler_of(last_backward, model)
                        yield Report(
                            event.node,
                            f"gradients are clipped while still scaled by `{scaler}` (backward at line "
                            f"{model.line(last_backward.node)}): call `{scaler}.unscale_(optimizer)` first",
                            fix=fixes.unscale_before_clip(model, root.events[position:], event, last_backward),
                            event=event, against=(last_backward,),
                        )
                    elif not reaching:
                        yield from _clip_before_scaler_step(model, root, event, position)


def _clip_before_scaler_step(model: LoopModel, root, clip: Event, position: int) -> Iterator[Report]:
    """A step function that clips and then steps through a ``GradScaler``, its scaled backward left to a caller.

    ``scaler.step(opt)`` means the gradients arrive scaled; with no
    ``unscale_`` before the clip, they are clipped scaled. Only for a
    function some loop of the run calls; quiet when a caller of this module
    inlines it (the caller's view decides), or when some function of the run
    that calls it also calls ``unscale_``.
    """
    function = root.node
    if type(function) is not cst.FunctionDef or function.name.value not in model.called_in_loop:
        return
    if function.name.value in model.unscaled_by_caller:
        return
    if any(e.kind is EventKind.UNSCALE for e in root.events[:position]):
        return
    if any(r is not root and any(e.node is clip.node for e in r.events) for r in model.roots):
        return
    for later in root.events[position + 1 :]:
        if later.kind is EventKind.UNSCALE and not exclusive(later, clip):
            return
        if later.kind is EventKind.STEP and later.via_scaler is not None and not exclusive(later, clip):
            yield Report(
                clip.node,
                f"gradients are clipped before `{later.via_scaler}.step({later.target})` at line {model.line(later.node)} "
                f"with no `unscale_` first, here or in any caller of `{function.name.value}`: the backward its callers "
                f"scale leaves them multiplied by the loss scale; call `{later.via_scaler}.unscale_({later.target})` first",
                event=clip, against=(later,),
            )
            return


class ScalerWithoutUpdate(Rule):
    """``scaler.step()`` is called in a loop that never calls ``scaler.update()``.

    **Why it matters.** ``update()`` is what lowers the loss scale after an
    overflow and raises it again later. Without it the scale is frozen: after
    one overflow every following step is skipped, and training silently stops.

    **Fix.** Call ``scaler.update()`` once per step, after ``scaler.step()``.

    **Stays quiet when**

    - the training loop that runs the step (in this function or in a caller
      of it) calls ``scaler.update()``;
    - the step is not in a training loop of its own (a per-batch method, or a
      loop over optimizers): its caller is judged where it is inlined.

    **Bad**::

        scaler.scale(loss).backward()
        scaler.step(optimizer)

    **Good**::

        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """

    code = "GL104"
    name = "scaler-without-update"
    summary = "scaler.step() with no scaler.update()"
    severity = Severity.ERROR
    fix = FixKind.SAFE
    needs = ((STEP, SCALER),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        updated = _steps_updated_somewhere(model)
        settled = Settled()
        for root in model.roots:
            for step in root.events:
                if step.kind is not EventKind.STEP or step.via_scaler is None:
                    continue
                loop = home_loop(root, step)
                if loop is None:
                    continue  # a per-step helper (or a loop over optimizers): the training loop that calls it is checked where it is inlined
                if step.node in updated or step.node in settled:
                    continue  # a caller's training loop updates the scaler after calling this code
                yield settled.note(Report(
                    step.node,
                    f"`{step.via_scaler}.step({step.target})` runs {loop_phrase(model, loop)} "
                    f"but `{step.via_scaler}.update()` never does: the loss scale never adapts",
                    fix=fixes.add_scaler_update(model, step),
                ))


def _steps_updated_somewhere(model: LoopModel) -> set:
    """The scaler steps that some root runs in a training loop (one that backpropagates) which also updates that scaler."""
    updated = set()
    for root in model.roots:
        for step in root.events:
            if step.kind is not EventKind.STEP or step.via_scaler is None:
                continue
            for loop in step.loops:
                if EventKind.BACKWARD not in root.kinds_in(loop):
                    continue
                if any(same_object(e.target, step.via_scaler) for e in root.events_of(EventKind.SCALER_UPDATE, loop)):
                    updated.add(step.node)
                    break
    return updated


class ScalerUnscalePerMicroBatch(Rule):
    """``scaler.unscale_(optimizer)`` or ``scaler.update()`` runs on micro-batches that do not step.

    **Why it matters.** A ``GradScaler`` expects one ``unscale_`` per
    optimizer and one ``update()`` per optimizer step. torch's
    ``GradScaler.unscale_`` raises ``RuntimeError: unscale_() has already
    been called on this optimizer since the last update()`` on the second
    micro-batch of an accumulation; if ``update()`` runs on every micro-batch
    too, nothing raises but the gradients already unscaled are summed with
    new, scaled ones, and the scale changes in the middle of the
    accumulation. ``update()`` alone on a micro-batch that neither stepped
    nor unscaled fails with ``No inf checks were recorded prior to
    update.``

    **Fix.** Unscale (and clip) and update under the same guard as
    ``scaler.step(optimizer)``: ``unscale_`` right before the clip,
    ``update()`` right after the step.

    **Bad**::

        for i, (x, y) in enumerate(loader):
            scaler.scale(loss_fn(model(x), y) / accum).backward()
            scaler.unscale_(optimizer)
            if (i + 1) % accum == 0:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()

    **Good**::

        for i, (x, y) in enumerate(loader):
            scaler.scale(loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                scaler.unscale_(optimizer)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()

    **Stays quiet when** the optimizer is not stepped through the same
    scaler; the unscale or update sits under an accumulation guard, in the
    other branch of the step's ``if`` (also of an ``if accumulation_steps >
    1:`` that picks the mode once), or leaves the loop before the step (a
    skipped batch). The fix moves a per-micro-batch ``update()`` that is a
    statement of its own in a block around the step to right after the step;
    a per-micro-batch ``unscale_`` is not moved, since the clipping that
    reads the unscaled gradients has to move with it.
    """

    code = "GL105"
    name = "scaler-unscale-per-micro-batch"
    summary = "scaler.unscale_() or scaler.update() runs on micro-batches that do not step the optimizer"
    severity = Severity.ERROR
    fix = FixKind.SAFE
    needs = ((BACKWARD, STEP, call_of("unscale_"), SCALER), (BACKWARD, STEP, call_of("update"), SCALER))

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            seen: set[int] = set()
            for step, loop in steps_with_loops(root):
                if step.via_scaler is None:
                    continue
                acc = accumulation(root, step, loop)
                if acc is None:
                    continue
                region_frame = loop if acc.style == "guard" else acc.frame
                for event in root.events_in(region_frame):
                    if id(event) in seen or not _belongs_to(event, step):
                        continue
                    if not runs_every_micro_batch(event, loop, acc) or leaves_before(event, step) or exclusive(event, step):
                        continue
                    seen.add(id(event))
                    yield self._report(model, event, step, acc)

    def _report(self, model: LoopModel, event: Event, step: Event, acc: Accumulation) -> Report:
        where = accumulation_place(model, acc)
        if event.kind is EventKind.UNSCALE:
            return Report(
                event.node,
                f"`{model.code(event.node)}` runs on every micro-batch but `{step.via_scaler}.step({step.target})` only "
                f"runs {where}: the second micro-batch raises `unscale_() has already been called on this optimizer "
                f"since the last update()`; unscale once, right before clipping and the step",
                event=event, against=(step,),
            )
        return Report(
            event.node,
            f"`{model.code(event.node)}` runs on every micro-batch but `{step.via_scaler}.step({step.target})` only "
            f"runs {where}: the loss scale changes in the middle of the accumulation (and with nothing unscaled it "
            f"raises); update once, right after the step",
            fix=fixes.move_update_after_step(model, event, step),
            event=event, against=(step,),
        )


def _belongs_to(event: Event, step: Event) -> bool:
    """An ``unscale_`` of the stepped optimizer through the step's scaler, or an ``update()`` of that scaler."""
    if event.kind is EventKind.UNSCALE:
        return same_object(event.via_scaler, step.via_scaler) and (event.target is None or same_object(event.target, step.target))
    return event.kind is EventKind.SCALER_UPDATE and same_object(event.target, step.via_scaler)
