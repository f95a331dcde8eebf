"""Whether an optimizer step has gradients to apply at all (GL022)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from gradlint.events import EventKind
from gradlint.findings import Severity
from gradlint.model import HANDOFF, Event, LoopModel
from gradlint.queries import accumulation_side, clears, frames_inside
from gradlint.rule import STEP, Report, Rule, call_of
from gradlint.syntax import callee_name, dotted_name, is_grad, method_name

# What reading a loss for a log does: none of these hands its graph to anything.
_LOGGING_READS = frozenset({"item", "data", "detach", "cpu", "numpy", "tolist", "float"})
_LOGGING_CALLS = frozenset({"print", "float", "format", "str", "repr", "len", "round"})


class StepWithoutBackward(Rule):
    """An optimizer is cleared and stepped, and the loss computed between is never backpropagated.

    **Why it matters.** ``optimizer.zero_grad()`` leaves every gradient zero
    (or None); with no ``backward()`` before ``optimizer.step()`` the step
    has nothing to apply. The parameters move only by weight decay and
    momentum, the logged loss is computed every iteration, and nothing fails.

    **Fix.** Backpropagate the loss before the step: ``loss.backward()``.

    **Stays quiet when**

    - anything in the loop backpropagates, writes or reads ``.grad``, or hands
      the optimizer to other code;
    - the step is given an argument (``step(closure)``, an optimizer that
      takes the loss), or a framework steps;
    - a statement between the clear and the step calls something for its
      effect (``trainer.backward_step(batch)``), or calls something whose name
      says it may backpropagate (``loss = trainer.forward_backward_step(batch)``),
      or the loss is handed to a
      call other than a log's (``accelerator.backward(loss)`` is a backward;
      ``amp.scale_loss(loss, opt)``, ``engine.step(loss)`` may be one);
    - the clear and the step are not statements of one block.

    The same holds for a step whose loop backpropagates only inside a test
    of the accumulation setting (``if gradient_accumulation_steps > 1: loss
    = loss / gradient_accumulation_steps; loss.backward()``) while the step
    runs with the setting off too: with a count of 1, the default, nothing is
    ever backpropagated; and for one that backpropagates only in that test's
    ``else`` (``if accum > 1: loss = loss / accum`` ``else: loss.backward()``):
    with accumulation configured, nothing is. Quiet when the step sits on the
    same side of the setting, or the loop backpropagates anywhere else.

    **Bad**::

        for images, targets in loader:
            optimizer.zero_grad()
            loss = criterion(net(images), targets)
            optimizer.step()

    **Good**::

        for images, targets in loader:
            optimizer.zero_grad()
            loss = criterion(net(images), targets)
            loss.backward()
            optimizer.step()
    """

    code = "GL022"
    name = "step-without-backward"
    summary = "an optimizer is cleared and stepped with no backward of the loss computed between"
    severity = Severity.ERROR
    fix = None  # which loss the step should follow is the author's
    needs = ((STEP, call_of("zero_grad"), "loss"), (STEP, "backward", "accum"))

    def check(self, model: LoopModel) -> Iterator[Report]:
        yield from _backward_on_one_side_of_the_setting(model)
        seen: set[int] = set()
        for root in model.roots:
            for step in root.events_of(EventKind.STEP):
                if id(step.node) in seen or step.framework is not None or step.target is None or not step.loops:
                    continue
                if type(step.node) is not cst.Call or step.node.args or step.call_chain:
                    continue
                loop = step.loops[-1]
                if any(e.kind not in (EventKind.ZERO, EventKind.STEP, EventKind.SCHED_STEP) for e in root.events_in(loop)):
                    continue  # a backward, a gradient read or write, a handoff: the step may have gradients
                clear = _clear_before(model, root.events_in(loop), step)
                if clear is None:
                    continue
                loss = _unused_loss(model, loop.node, clear.node, step.node)
                if loss is None:
                    continue
                seen.add(id(step.node))
                yield Report(
                    step.node,
                    f"`{step.target}` is cleared at line {model.line(clear.node)} and stepped at line "
                    f"{model.line(step.node)}, but nothing backpropagates between: `{loss[0]}`, computed at line "
                    f"{model.line(loss[1])}, is only read for logs, so every step applies empty gradients; call "
                    f"`{loss[0]}.backward()` before the step",
                    event=step,
                )


def _backward_on_one_side_of_the_setting(model: LoopModel) -> Iterator[Report]:
    """A step whose loop backpropagates only on one side of ``if accum > 1:`` while the step runs on both."""
    seen: set[int] = set()
    for root in model.roots:
        for step in root.events_of(EventKind.STEP):
            if id(step.node) in seen or step.framework is not None or step.target is None or not step.loops:
                continue
            loop = step.loops[-1]
            events = root.events_in(loop)
            backwards = [e for e in events if e.kind is EventKind.BACKWARD]
            if not backwards or any(e.kind is HANDOFF for e in events):
                continue
            sides = [accumulation_side(b, loop) for b in backwards]
            if any(side is None for side in sides) or len(set(sides)) != 1:
                continue
            setting, on = sides[0]
            if any(f.accumulation_on is not None and f.accumulation_on[0] == setting for f in frames_inside(step, loop)):
                continue  # the step is on one side of the setting too
            seen.add(id(step.node))
            backward = backwards[0]
            if on:
                only, empty = "with accumulation on", "with a count of 1 every step applies empty gradients"
            else:
                only, empty = "with accumulation off", "with a count above 1 every step applies empty gradients"
            yield Report(
                step.node,
                f"`{step.target}` steps at line {model.line(step.node)} whatever `{setting}` is, but the loop "
                f"backpropagates only {only} (the backward at line {model.line(backward.node)} runs under "
                f"the test of `{setting}`): {empty}; backpropagate outside that test",
                event=step,
            )



def _clear_before(model: LoopModel, events: list[Event], step: Event) -> Event | None:
    """The last clear of the step's optimizer before it in the iteration, if it clears by a call."""
    at = next(i for i, e in enumerate(events) if e is step)
    for event in reversed(events[:at]):
        if event.kind is EventKind.ZERO and not event.manual and not event.call_chain and clears(model, event, step.target):
            return event
    return None


def _unused_loss(model: LoopModel, loop: cst.CSTNode, clear: cst.CSTNode, step: cst.CSTNode) -> tuple[str, cst.CSTNode] | None:
    """A name with ``loss`` in it assigned between the clear's and the step's statements (siblings in one block),
    never handed to a call but a log's in the loop; None when any statement between calls something for its effect,
    or the loop touches ``.grad``."""
    parents = model.parents or {}
    clear_statement, step_statement = _statement(parents, clear), _statement(parents, step)
    block = parents.get(clear_statement)
    if block is None or block is not parents.get(step_statement):
        return None
    body = list(block.body)
    start, end = body.index(clear_statement), body.index(step_statement)
    if start >= end:
        return None
    losses: list[tuple[str, cst.CSTNode]] = []
    for statement in body[start + 1:end]:
        if type(statement) is not cst.SimpleStatementLine:
            return None
        for small in statement.body:
            if type(small) is cst.Expr:
                return None  # called for its effect
            if any(type(n) is cst.Call and _may_backpropagate(n) for n in model.file.walk(small)):
                return None  # ``loss = trainer.forward_backward_step(batch)``: the call may backpropagate what it returns
            if type(small) is cst.Assign:
                for target in small.targets:
                    for node in model.file.walk(target.target):
                        name = dotted_name(node) if type(node) in (cst.Name, cst.Attribute) else None
                        if name is not None and "loss" in name.rsplit(".", 1)[-1].lower():
                            losses.append((name, small))
    if not losses:
        return None
    names = {name for name, _ in losses}
    for node in model.file.walk(loop):
        if is_grad(node):
            return None
        if type(node) is cst.Call and not _logging_call(node):
            handed = [a.value for a in node.args] + ([node.func.value] if type(node.func) is cst.Attribute else [])
            if any(dotted_name(value) in names for value in handed):
                return None
    return losses[-1]


def _may_backpropagate(call: cst.Call) -> bool:
    """A call whose name says it may backpropagate or update (``forward_backward_step``, ``train_batch``)."""
    name = callee_name(call)
    return name is not None and _BACKPROPAGATING_WORDS.search(name) is not None


_BACKPROPAGATING_WORDS = re.compile(r"backward|step|train|update|optimize(?!r)|optimise(?!r)|grad|fit", re.IGNORECASE)


def _logging_call(call: cst.Call) -> bool:
    """``loss.item()``, ``loss.data``-style reads, ``print(...)``, ``float(loss)``, ``logger.info(...)``."""
    method = method_name(call)
    if method is not None and (method in _LOGGING_READS or method in ("info", "debug", "warning", "log", "add_scalar", "set_description", "set_postfix", "format")):
        return True
    return type(call.func) is cst.Name and call.func.value in _LOGGING_CALLS


def _statement(parents: dict, node: cst.CSTNode) -> cst.CSTNode:
    """The statement of a block that holds ``node``."""
    current = node
    while current is not None and type(current) not in (cst.SimpleStatementLine, cst.If, cst.For, cst.While, cst.With, cst.Try):
        current = parents.get(current)
    return current
