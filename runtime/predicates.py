"""The rules, evaluated on an observed trace instead of the source.

Each predicate reads the events a :class:`~gradlint.runtime.tracer.Tracer`
recorded and returns the :class:`Violation` s it saw, each with the user lines
involved, plus one sentence saying what was checked when nothing was wrong, or
why the trace never exercised the rule.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Iterable, NamedTuple

from gradlint.events import EventKind
from gradlint.runtime.tracer import Event

CLEAN_GRADS = ("none", "zero")


@dataclasses.dataclass
class Violation:
    """One observed instance of a rule: the evidence and the user lines it involves.

    ``anywhere`` marks evidence that cannot be pinned to a line (gradients found
    allocated-but-zero, cleared by a loop the tracer does not see).
    """

    code: str
    evidence: str
    lines: frozenset[tuple[str, int]]
    anywhere: bool = False


class Checked(NamedTuple):
    """What a predicate found on a trace.

    ``summary`` says what was checked when nothing was wrong, or, when
    ``exercised`` is false, why the trace never put the rule to the test (no
    accumulation happened, no scaled backward ran): such a trace can neither
    confirm nor refute a finding.
    """

    violations: list[Violation]
    summary: str
    exercised: bool = True


@dataclasses.dataclass
class StepRecord:
    """One optimizer step and what led to it.

    ``backwards``: the backwards since this optimizer's previous step that
    reached its parameters. ``consumed``: the backwards whose gradients were
    still in ``.grad`` when the step ran (possibly from earlier windows).
    """

    optimizer: str
    number: int
    event: Event
    previous: Event | None
    window: list[Event]
    backwards: list[Event]
    consumed: list[Event]

    @property
    def saw_gradients(self) -> bool:
        return self.event.facts.get("grads") not in CLEAN_GRADS


def _site(event: Event) -> tuple[str, int]:
    return (event.site.path, event.site.line)


def _lines(events: Iterable[Event]) -> str:
    lines = sorted({e.site.line for e in events})
    return ", ".join(str(n) for n in lines)


def _touches(event: Event, optimizer: str) -> bool:
    return optimizer in event.facts.get("touched", ())


def _zero_targets(event: Event, optimizer: str) -> bool:
    targets = event.facts.get("targets") or []
    return not targets or optimizer in targets


def step_records(events: list[Event]) -> list[StepRecord]:
    """Split the trace into per-optimizer step windows and count what each step consumed."""
    optimizers = sorted({e.target for e in events if e.kind is EventKind.STEP and e.target})
    records: list[StepRecord] = []
    for opt in optimizers:
        contributors: list[Event] = []
        window: list[Event] = []
        previous: Event | None = None
        number = 0
        for event in events:
            if event.kind is EventKind.BACKWARD and _touches(event, opt):
                if event.facts.get("before", {}).get(opt, "none") in CLEAN_GRADS:
                    contributors = [event]
                else:
                    contributors.append(event)
            if event.kind is EventKind.STEP and event.target == opt:
                number += 1
                backwards = [e for e in window if e.kind is EventKind.BACKWARD and _touches(e, opt)]
                consumed = list(contributors) if event.facts.get("grads") not in CLEAN_GRADS else []
                records.append(StepRecord(opt, number, event, previous, window, backwards, consumed))
                previous, window = event, []
            else:
                window.append(event)
    records.sort(key=lambda r: r.event.index)
    return records


def gl001(records: list[StepRecord], events: list[Event]) -> Checked:
    """A step used gradients accumulated across backwards of different steps."""
    found = []
    for r in records:
        if r.previous is None:
            continue
        old = [b for b in r.consumed if b.index < r.previous.index]
        if old:
            found.append(
                Violation(
                    "GL001",
                    f"step {r.number} of {r.optimizer} used gradients from {len(r.consumed)} backwards "
                    f"without a clear in between ({len(old)} of them ran before step {r.number - 1})",
                    frozenset({_site(r.event), *map(_site, r.consumed)}),
                )
            )
    later = [r for r in records if r.previous is not None]
    if not later:
        return Checked(found, "needs at least two optimizer steps to decide", exercised=False)
    return Checked(found, f"each of the {len(later)} steps after the first started from cleared gradients")


def gl002(records: list[StepRecord], events: list[Event]) -> Checked:
    """A clear ran after the last backward and before the step: the step saw no gradients."""
    found = []
    for r in records:
        if not r.backwards or r.saw_gradients:
            continue
        last = r.backwards[-1]
        zeros = [e for e in r.window if e.kind is EventKind.ZERO and e.index > last.index and _zero_targets(e, r.optimizer)]
        where = f"a clear at line {_lines(zeros)}" if zeros else "a clear"
        found.append(
            Violation(
                "GL002",
                f"step {r.number} of {r.optimizer} saw no gradients: {where} ran after the backward "
                f"at line {last.site.line} and before the step",
                frozenset({_site(r.event), *map(_site, zeros)}),
            )
        )
    return Checked(found, f"all {len(records)} steps saw the gradients of their backwards")


def gl003(records: list[StepRecord], events: list[Event]) -> Checked:
    """k>1 backwards per step, but a clear between them let only the last ones reach the step."""
    found = []
    for r in records:
        k = len(r.backwards)
        reached = [b for b in r.consumed if b in r.backwards]
        if k < 2 or not reached or len(reached) == k:
            continue
        first, last = r.backwards[0], r.backwards[-1]
        zeros = [
            e
            for e in r.window
            if e.kind is EventKind.ZERO and first.index < e.index < last.index and _zero_targets(e, r.optimizer)
        ]
        found.append(
            Violation(
                "GL003",
                f"step {r.number} of {r.optimizer} followed {k} backwards but only the last {len(reached)} "
                f"reached it: a clear at line {_lines(zeros) or '?'} ran between backwards of the same step",
                frozenset({_site(r.event), *map(_site, zeros)}),
            )
        )
    multi = sum(1 for r in records if len(r.backwards) > 1)
    if multi:
        return Checked(found, f"{multi} steps accumulated several backwards and every one reached the step")
    return Checked(found, "every step followed a single backward: no accumulation happened", exercised=False)


def gl004(records: list[StepRecord], events: list[Event]) -> Checked:
    """A step consumed k>1 backwards of its own window and the losses were not divided by k."""
    found = []
    checked = 0
    for r in records:
        own = [b for b in r.consumed if b in r.backwards]
        k = len(own)
        if k < 2 or len(own) != len(r.consumed):
            continue
        checked += 1
        bad = [b for b in own if abs(b.facts.get("factor", 1.0) * k - 1.0) > 1e-6]
        if bad:
            factors = sorted({round(b.facts.get("factor", 1.0), 6) for b in bad})
            found.append(
                Violation(
                    "GL004",
                    f"step {r.number} of {r.optimizer} summed the gradients of {k} backwards whose losses were "
                    f"not divided by {k} (constant factor at the graph root: {', '.join(map(str, factors))})",
                    frozenset(map(_site, bad)),
                )
            )
    if checked:
        return Checked(found, f"{checked} accumulating steps had their losses divided by the number of backwards")
    if any(len(r.backwards) > 1 for r in records):
        return Checked(
            found,
            "no step summed several backwards: a clear between them left only the last one's gradients",
            exercised=False,
        )
    return Checked(found, "every step followed a single backward: no accumulation happened", exercised=False)


def gl005(records: list[StepRecord], events: list[Event]) -> Checked:
    """Gradients kept allocated: ``zero_grad(set_to_none=False)`` or zeroed-in-place buffers."""
    found = []
    for e in events:
        if e.kind is EventKind.ZERO and e.facts.get("set_to_none") is False:
            found.append(
                Violation(
                    "GL005",
                    f"zero_grad(set_to_none=False) at line {e.site.line} kept the gradient buffers",
                    frozenset({_site(e)}),
                )
            )
    for e in events:
        if e.kind is EventKind.BACKWARD:
            kept = [opt for opt, state in e.facts.get("before", {}).items() if state == "zero"]
            if kept:
                found.append(
                    Violation(
                        "GL005",
                        f"the gradients of {', '.join(kept)} were allocated and all zero when the backward at "
                        f"line {e.site.line} started",
                        frozenset({_site(e)}),
                        anywhere=True,
                    )
                )
                break
    return Checked(found, "gradients were freed (None) between steps")


def _scaled(event: Event) -> bool:
    return bool(event.facts.get("scaled"))


def gl101(records: list[StepRecord], events: list[Event]) -> Checked:
    """A backward not via ``scaler.scale`` while a scaler steps the optimizer."""
    found = []
    for r in records:
        if not r.event.facts.get("via_scaler"):
            continue
        plain = [b for b in r.backwards if not _scaled(b)]
        if plain:
            found.append(
                Violation(
                    "GL101",
                    f"the backward at line {_lines(plain)} was not scaled while step {r.number} of "
                    f"{r.optimizer} went through {r.event.facts['via_scaler']}",
                    frozenset(map(_site, plain)),
                )
            )
    if not any(r.event.facts.get("via_scaler") for r in records):
        return Checked(found, "no optimizer step went through an enabled GradScaler", exercised=False)
    return Checked(found, "every backward before a scaler step was scaled")


def gl102(records: list[StepRecord], events: list[Event]) -> Checked:
    """``optimizer.step()`` called directly on gradients from a scaled backward."""
    found = []
    for r in records:
        scaled = [b for b in r.consumed if _scaled(b)]
        if scaled and not r.event.facts.get("via_scaler"):
            found.append(
                Violation(
                    "GL102",
                    f"step {r.number} of {r.optimizer} at line {r.event.site.line} applied gradients still multiplied "
                    f"by the loss scale of {scaled[0].facts['scaled']} (scaler.step bypassed)",
                    frozenset({_site(r.event)}),
                )
            )
    if not any(_scaled(e) for e in events if e.kind is EventKind.BACKWARD):
        return Checked(found, "no backward ran on a loss scaled by an enabled GradScaler", exercised=False)
    return Checked(found, "every step on scaled gradients went through scaler.step")


def _clips(event: Event) -> bool:
    """A CLIP event that changes gradients (``get_total_norm`` only measures them)."""
    return event.facts.get("fn") != "get_total_norm"


def gl103(records: list[StepRecord], events: list[Event]) -> Checked:
    """Clipping with no ``unscale_`` since the scaled backward."""
    found = []
    last_scaled: Event | None = None
    for e in events:
        if e.kind is EventKind.BACKWARD and _scaled(e):
            last_scaled = e
        elif e.kind in (EventKind.UNSCALE, EventKind.STEP):
            last_scaled = None
        elif e.kind is EventKind.CLIP and last_scaled is not None and _clips(e):
            found.append(
                Violation(
                    "GL103",
                    f"clipping at line {e.site.line} ran on gradients still multiplied by the loss scale "
                    f"(no unscale_ since the scaled backward at line {last_scaled.site.line})",
                    frozenset({_site(e)}),
                )
            )
    clips = any(e.kind is EventKind.CLIP and _clips(e) for e in events)
    if not clips or not any(_scaled(e) for e in events if e.kind is EventKind.BACKWARD):
        return Checked(found, "no clipping ran on gradients of a backward scaled by an enabled GradScaler", exercised=False)
    return Checked(found, "every clip of scaled gradients came after unscale_")


def gl104(records: list[StepRecord], events: list[Event]) -> Checked:
    """``scaler.step`` twice for an optimizer with no ``scaler.update()`` in between."""
    found = []
    pending: dict[tuple[str, str], Event] = {}
    for e in events:
        if e.kind is EventKind.SCALER_UPDATE:
            pending = {k: v for k, v in pending.items() if k[0] != e.target}
        elif e.kind is EventKind.STEP and e.facts.get("via_scaler"):
            key = (e.facts["via_scaler"], e.target or "")
            if key in pending:
                found.append(
                    Violation(
                        "GL104",
                        f"{key[0]} stepped {key[1]} at line {e.site.line} again without scaler.update() since "
                        f"line {pending[key].site.line}",
                        frozenset({_site(e), _site(pending[key])}),
                    )
                )
            pending[key] = e
    if not any(e.kind is EventKind.STEP and e.facts.get("via_scaler") for e in events):
        return Checked(found, "no optimizer step went through an enabled GradScaler", exercised=False)
    return Checked(found, "scaler.update() ran between scaler steps")


def gl301(records: list[StepRecord], events: list[Event]) -> Checked:
    """A scheduler stepped more than once between two steps of its optimizer."""
    found = []
    counts: dict[str, list[Event]] = {}
    steps: dict[str, int] = {}
    for e in events:
        if e.kind is EventKind.STEP and e.target:
            steps[e.target] = steps.get(e.target, 0) + 1
            for sched in [s for s, evs in counts.items() if evs and evs[0].facts.get("optimizer") == e.target]:
                counts[sched] = []
        elif e.kind is EventKind.SCHED_STEP and e.target:
            seen = counts.setdefault(e.target, [])
            seen.append(e)
            if len(seen) == 2:
                opt = e.facts.get("optimizer")
                found.append(
                    Violation(
                        "GL301",
                        f"{e.target} stepped twice (lines {_lines(seen)}) after step {steps.get(opt, 0)} of {opt} "
                        f"and before the next one",
                        frozenset(map(_site, seen)),
                    )
                )
    if not any(e.kind is EventKind.SCHED_STEP for e in events):
        return Checked(found, "no LR scheduler stepped", exercised=False)
    return Checked(found, "every scheduler stepped at most once per optimizer step")


def gl302(records: list[StepRecord], events: list[Event]) -> Checked:
    """More than one synchronising backward per optimizer step under DDP."""
    found = []
    ddp = any(e.facts.get("synced") for e in events if e.kind is EventKind.BACKWARD)
    for r in records:
        synced = [b for b in r.backwards if b.facts.get("synced")]
        if len(synced) > 1:
            calls = sum(b.facts["synced"] for b in synced)
            found.append(
                Violation(
                    "GL302",
                    f"step {r.number} of {r.optimizer} paid all-reduces on {len(synced)} of its {len(r.backwards)} "
                    f"backwards ({calls} all-reduce calls); only the last one needed to synchronise",
                    frozenset(map(_site, synced)),
                )
            )
    if not ddp:
        return Checked(found, "no DDP all-reduce was observed", exercised=False)
    return Checked(found, "each step synchronised gradients on one backward only")


def gl011(records: list[StepRecord], events: list[Event]) -> Checked:
    """An optimizer stepped from two lines, and one step came right after the other with no backward between."""
    sites: dict[str, set[tuple[str, int]]] = {}
    for r in records:
        sites.setdefault(r.optimizer, set()).add(_site(r.event))
    several = sorted(opt for opt, where in sites.items() if len(where) > 1)
    if not several:
        return Checked([], "every optimizer stepped from one line only", exercised=False)
    found = []
    for r in records:
        if r.optimizer in several and r.previous is not None and not r.backwards and _site(r.previous) != _site(r.event):
            found.append(
                Violation(
                    "GL011",
                    f"step {r.number} of {r.optimizer} (line {r.event.site.line}) ran right after its step at line "
                    f"{r.previous.site.line} with no backward between: it stepped twice on one micro-batch",
                    frozenset({_site(r.event), _site(r.previous)}),
                )
            )
    return Checked(found, f"{', '.join(several)} stepped from several lines, never twice without a backward between")


PREDICATES: dict[str, Callable[[list[StepRecord], list[Event]], Checked]] = {
    "GL001": gl001,
    "GL002": gl002,
    "GL003": gl003,
    "GL004": gl004,
    "GL005": gl005,
    "GL011": gl011,
    "GL101": gl101,
    "GL102": gl102,
    "GL103": gl103,
    "GL104": gl104,
    "GL301": gl301,
    "GL302": gl302,
}


def evaluate(events: list[Event]) -> dict[str, Checked]:
    """Run every predicate on a trace: ``{code: Checked(violations, what was checked, exercised)}``."""
    records = step_records(events)
    return {code: predicate(records, events) for code, predicate in PREDICATES.items()}


def same_file(a: str, b: str) -> bool:
    """Whether two paths name the same file."""
    return os.path.realpath(a) == os.path.realpath(b)
