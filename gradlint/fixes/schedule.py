"""Fix for GL301: a per-step LR scheduler moves under the accumulation guard, after the optimizer step."""

from __future__ import annotations

import libcst as cst

from gradlint.fixes.edits import Edit, Fix, Insert, Remove
from gradlint.fixes.locate import after_step, movable, statement_of
from gradlint.model import Event, LoopModel


def move_scheduler_step(model: LoopModel, sched: Event, step: Event) -> Fix:
    """Move ``scheduler.step()`` to just after the optimizer step (after ``scaler.update()`` when there is one).

    Only a scheduler step written directly in a block around the optimizer
    step moves: one under a condition of its own is left as it is.
    """

    def build() -> list[Edit] | None:
        if sched.call_chain != step.call_chain or len(sched.frames) >= len(step.frames):
            return None
        if any(a is not b for a, b in zip(sched.frames, step.frames)):
            return None
        unit = statement_of(model.file, sched.node)
        anchor = after_step(model.file, step)
        if not (type(unit) is cst.Expr and unit.value is sched.node) or anchor is None:
            return None
        return [Remove(unit), Insert(anchor, (movable(model.file, unit),))]

    return Fix("step the scheduler under the accumulation guard, after the optimizer", build)
