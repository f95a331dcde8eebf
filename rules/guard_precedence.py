"""Whether a step's guard computes the remainder it means (GL023)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from gradlint.events import EventKind
from gradlint.findings import FixKind, Severity
from gradlint.fixes.edits import Fix, Replace
from gradlint.model import FrameKind, LoopModel
from gradlint.rule import STEP, Report, Rule, Spelled

# A divisor that is an accumulation count: the remainder decides which micro-batches step, wherever it is written.
_COUNT_WORDS = r"accum|update_freq"
_ACCUMULATION_COUNT = re.compile(_COUNT_WORDS, re.IGNORECASE)
# ``x + 1 % accum_steps``: a sum whose right operand is a literal's remainder by an accumulation count (the prefilter's
# spelling of what :func:`_traps_on_accumulation_counts` reports).
_SUM_WITH_REMAINDER_OF_COUNT = Spelled("%", rf"[+\-]\s*\d+\s*%\s*[\w.\[\]'\"]*(?:{_COUNT_WORDS})")


class RemainderPrecedenceInGuard(Rule):
    """A step's guard writes ``i + 1 % k``, which Python reads as ``i + (1 % k)``.

    **Why it matters.** ``%`` binds tighter than ``+`` and ``-``:
    ``batch_idx + 1 % accum == 0`` takes the remainder of 1, not of the
    counter, and is ``batch_idx + 1 == 0`` for any ``accum`` above 1, never
    true for a counter that starts at 0. The optimizer then steps only
    where another clause of the guard says so (``or batch_idx + 1 ==
    len(loader)``: once per pass, on the whole pass's gradients), or never,
    and nothing fails.

    **Fix.** Parenthesise the sum: ``(batch_idx + 1) % accum == 0``.

    The same sum is reported wherever the divisor is an accumulation count
    (``skip_step = epoch_minibatches + 1 % self.accumulation_steps`` in a
    callback, the test of the micro-batches that run outside ``no_sync()``:
    ``fixtures/realworld/gl023_remainder_of_one_outside_the_step_guard__myrtlespeech.py``).

    **Stays quiet when** the literal is not the left operand of ``%``
    (``i + k % 2``, a remainder of a name, may be meant), or the test guards
    no optimizer step, clear or scheduler step and its divisor is no
    accumulation count.

    **Bad**::

        for batch_idx, batch in enumerate(loader):
            accelerator.backward(model(**batch).loss / accum)
            if batch_idx + 1 % accum == 0 or batch_idx + 1 == len(loader):
                optimizer.step()
                optimizer.zero_grad()

    **Good**::

        for batch_idx, batch in enumerate(loader):
            accelerator.backward(model(**batch).loss / accum)
            if (batch_idx + 1) % accum == 0 or batch_idx + 1 == len(loader):
                optimizer.step()
                optimizer.zero_grad()
    """

    code = "GL023"
    name = "guard-remainder-precedence"
    summary = "a step's guard writes `i + 1 % k`, which is `i + (1 % k)`: `%` binds tighter than `+`"
    severity = Severity.ERROR
    fix = FixKind.SAFE
    needs = ((STEP, "%"), (_SUM_WITH_REMAINDER_OF_COUNT,))

    def check(self, model: LoopModel) -> Iterator[Report]:
        reported: set[int] = set()
        for root in model.roots:
            for event in root.events:
                if event.kind not in (EventKind.STEP, EventKind.ZERO, EventKind.SCHED_STEP):
                    continue
                for frame in event.frames:
                    if frame.kind is not FrameKind.BRANCH or type(frame.node) not in (cst.If, cst.While):
                        continue
                    for trap in _precedence_traps(model, frame.node.test):
                        if id(trap) in reported:
                            continue
                        reported.add(id(trap))
                        meant = _meant(model, trap)
                        yield Report(
                            trap,
                            f"`{model.code(trap)}` is `{model.code(trap.left)} {_sign(trap)} ({model.code(trap.right)})`: "
                            f"`%` binds tighter than `{_sign(trap)}`, so the guard takes the remainder of "
                            f"`{model.code(trap.right.left)}`, not of the counter, and `{model.code(event.node)}` at line "
                            f"{model.line(event.node)} runs only where another clause of the test allows it; write `{meant}`",
                            fix=_parenthesise(trap),
                        )
        yield from _traps_on_accumulation_counts(model, reported)  # the rest: not around a step, clear or schedule



def _traps_on_accumulation_counts(model: LoopModel, reported: set[int]) -> Iterator[Report]:
    """``a + 1 % k`` with ``k`` an accumulation count, in any test or assignment of the module: a flag handed to the
    loop (``skip_step = kwargs["epoch_minibatches"] + 1 % self.accumulation_steps``), the test of the micro-batches
    that run outside ``no_sync()``. The remainder of 1 decides nothing."""
    text = model.file.text
    if text is not None and _SUM_WITH_REMAINDER_OF_COUNT.search(text) is None:
        return  # no such sum is spelled anywhere in the file: nothing to walk for
    for trap in _precedence_traps(model, model.module, every=True):
        if id(trap) in reported or not _ACCUMULATION_COUNT.search(model.code(trap.right.right)):
            continue
        reported.add(id(trap))
        meant = _meant(model, trap)
        yield Report(
            trap,
            f"`{model.code(trap)}` is `{model.code(trap.left)} {_sign(trap)} ({model.code(trap.right)})`: `%` binds "
            f"tighter than `{_sign(trap)}`, so it takes the remainder of `{model.code(trap.right.left)}`, not of the "
            f"counter: for any `{model.code(trap.right.right)}` above 1 the test is the same on every micro-batch of "
            f"a counter that starts at 0, not the accumulation window it means; write `{meant}`",
            fix=_parenthesise(trap),
        )


def _precedence_traps(model: LoopModel, test: cst.CSTNode, every: bool = False) -> list[cst.BinaryOperation]:
    """``a + 1 % k`` / ``a - 1 % k`` in a test: a sum or difference whose right operand is a remainder of an integer
    literal, written without parentheses around the remainder."""
    found = []
    for node in model.file.every_node(test) if every else model.file.walk(test):
        if type(node) is not cst.BinaryOperation or type(node.operator) not in (cst.Add, cst.Subtract):
            continue
        right = node.right
        if type(right) is not cst.BinaryOperation or type(right.operator) is not cst.Modulo or right.lpar:
            continue
        if type(right.left) is cst.Integer:
            found.append(node)
    return found


def _meant(model: LoopModel, trap: cst.BinaryOperation) -> str:
    """``(a + 1) % k`` for ``a + 1 % k``: the sum the remainder was meant of, as the message writes it."""
    return f"({model.code(trap.left)} {_sign(trap)} {model.code(trap.right.left)}) % {model.code(trap.right.right)}"


def _sign(operation: cst.BinaryOperation) -> str:
    return "+" if type(operation.operator) is cst.Add else "-"


def _parenthesise(trap: cst.BinaryOperation) -> Fix:
    """``(a + 1) % k`` for ``a + 1 % k``."""

    def make(node: cst.CSTNode) -> cst.CSTNode:
        remainder = node.right
        summed = cst.BinaryOperation(
            left=node.left, operator=node.operator, right=remainder.left,
            lpar=[cst.LeftParen()], rpar=[cst.RightParen()],
        )
        return cst.BinaryOperation(
            left=summed, operator=remainder.operator, right=remainder.right, lpar=node.lpar, rpar=node.rpar,
        )

    return Fix("parenthesise the sum before taking its remainder", lambda: [Replace(trap, make)])
