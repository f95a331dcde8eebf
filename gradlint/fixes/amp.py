"""Fixes for the GradScaler rules (GL101–GL105): route backward, step, unscale and update through the scaler."""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from gradlint.events import EventKind
from gradlint.fixes.edits import Edit, Fix, Insert, Remove, Replace, parse_statements
from gradlint.fixes.locate import code, movable, optimizer_of_step, scaler_of_step, statement_of, tensor_backward_receiver
from gradlint.model import Event, LoopModel
from gradlint.syntax import method_name, positional_args, receiver


def scale_backward(model: LoopModel, backward: Event, user: Event) -> Fix:
    """GL101: ``loss.backward()`` → ``scaler.scale(loss).backward()``, with the scaler the loop already uses."""

    def build() -> list[Edit] | None:
        if backward.call_chain != user.call_chain:
            return None
        loss, scaler = tensor_backward_receiver(backward.node), _scaler_used_by(model.module, user)
        if loss is None or scaler is None:
            return None

        def make(node: cst.CSTNode) -> cst.CSTNode:
            return _method_call(scaler, "scale", node.with_changes(lpar=[], rpar=[]))

        return [Replace(loss, make)]

    return Fix("scale the loss with the scaler", build)


def step_through_scaler(model: LoopModel, step: Event, backward: Event) -> Fix:
    """GL102: ``optimizer.step()`` → ``scaler.step(optimizer)``, with the scaler of the scaled backward."""

    def build() -> list[Edit] | None:
        call = step.node
        scaler = scaler_of_backward(model.module, backward)
        if step.call_chain != backward.call_chain or scaler is None or type(call) is not cst.Call or call.args:
            return None
        if receiver(call) is None:
            return None
        return [Replace(call, lambda node: _method_call(scaler, "step", receiver(node)).with_changes(lpar=node.lpar, rpar=node.rpar))]

    return Fix("step through the scaler", build)


def unscale_before_clip(model: LoopModel, events: Sequence[Event], clip: Event, backward: Event) -> Fix:
    """GL103: ``scaler.unscale_(optimizer)`` right before the clip, for the optimizer stepped next in the same block."""

    def build() -> list[Edit] | None:
        module = model.module
        scaler = scaler_of_backward(module, backward)
        step = _next_step(events, clip)
        if scaler is None or step is None or step.frames != clip.frames or step.call_chain != clip.call_chain:
            return None
        optimizer = optimizer_of_step(module, step)
        statement = statement_of(model.file, clip.node)
        if optimizer is None or statement is None:
            return None
        return [Insert(statement, parse_statements(f"{scaler}.unscale_({optimizer})\n"), before=True)]

    return Fix("unscale the gradients before clipping", build)


def add_scaler_update(model: LoopModel, step: Event) -> Fix:
    """GL104: ``scaler.update()`` right after ``scaler.step(optimizer)``."""

    def build() -> list[Edit] | None:
        scaler = scaler_of_step(model.module, step)
        statement = statement_of(model.file, step.node)
        if scaler is None or statement is None:
            return None
        return [Insert(statement, parse_statements(f"{scaler}.update()\n"))]

    return Fix("update the scaler after the step", build)


def move_update_after_step(model: LoopModel, update: Event, step: Event) -> Fix:
    """GL105: ``scaler.update()`` moves from every micro-batch to right after ``scaler.step(optimizer)``.

    Only an update written as a statement of its own, directly in a block
    around the step (so it runs whenever the step could), moves.
    """

    def build() -> list[Edit] | None:
        if update.call_chain != step.call_chain or len(update.frames) >= len(step.frames):
            return None
        if any(a is not b for a, b in zip(update.frames, step.frames)):
            return None
        unit = statement_of(model.file, update.node)
        anchor = statement_of(model.file, step.node)
        if not (type(unit) is cst.Expr and unit.value is update.node):
            return None
        if not (type(anchor) is cst.Expr and anchor.value is step.node):
            return None
        return [Remove(unit), Insert(anchor, (movable(model.file, unit),))]

    return Fix("update the scaler once, right after its step", build)


def scaler_of_backward(module: cst.Module, backward: Event) -> str | None:
    """The scaler as written in ``scaler.scale(loss).backward()`` or ``features.backward(scaler.scale(grad))``."""
    scale = scale_call(backward.node)
    return code(module, receiver(scale)) if scale is not None else None


def scale_call(backward: cst.CSTNode) -> cst.Call | None:
    """The ``scaler.scale(...)`` of a scaled backward: its receiver, or the upstream gradient it is handed."""
    if type(backward) is not cst.Call:
        return None
    candidates = [receiver(backward)]
    if method_name(backward) == "backward":
        gradient = positional_args(backward)[:1] or [a for a in backward.args if a.keyword is not None and a.keyword.value == "gradient"]
        candidates += [arg.value for arg in gradient]
    for scale in candidates:
        if type(scale) is cst.Call and method_name(scale) == "scale" and receiver(scale) is not None:
            return scale
    return None


def _scaler_used_by(module: cst.Module, user: Event) -> str | None:
    """The scaler as written at ``scaler.step(opt)``, ``scaler.unscale_(opt)`` or ``scaler.update()``."""
    call = user.node
    if user.kind in (EventKind.STEP, EventKind.UNSCALE, EventKind.SCALER_UPDATE) and type(call) is cst.Call:
        scaler = receiver(call)
        if scaler is not None and (user.kind is not EventKind.STEP or positional_args(call)):
            return code(module, scaler)
    return None


def _next_step(events: Sequence[Event], after: Event) -> Event | None:
    seen = False
    for event in events:
        if event is after:
            seen = True
        elif seen and event.kind is EventKind.STEP:
            return event
    return None


def _method_call(owner: str, method: str, argument: cst.BaseExpression) -> cst.Call:
    """``owner.method(argument)``, keeping the argument's own formatting."""
    call = cst.parse_expression(f"{owner}.{method}(_)")
    return call.with_changes(args=[cst.Arg(argument)])
