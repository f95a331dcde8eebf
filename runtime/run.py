"""``gradlint run``: trace a script for a few steps and judge the static findings on what happened."""

from __future__ import annotations

import dataclasses
import os
import traceback
from typing import Sequence

from gradlint.events import EventKind
from gradlint.findings import Finding
from gradlint.runtime.crashes import confirmed_by_crash
from gradlint.runtime.launch import RAISED, Outcome, run_script
from gradlint.runtime.predicates import Violation, same_file
from gradlint.runtime.tracer import Event, Tracer
from gradlint.runtime.verdicts import CONFIRMED, Verdict, judge, unreported


class RunError(Exception):
    """The script could not be judged (it raised, exited, or never stepped an optimizer).

    ``events``: what the tracer saw before that; ``traceback``: the script's
    own traceback when it raised (the tool's frames left out).
    """

    def __init__(self, message: str, events: Sequence[Event] = (), traceback: str = "") -> None:
        super().__init__(message)
        self.events = list(events)
        self.traceback = traceback


@dataclasses.dataclass
class RunReport:
    """Everything ``gradlint run`` prints."""

    path: str
    outcome: Outcome
    events: list[Event]
    executed: set[tuple[str, int]]
    steps: int
    verdicts: list[Verdict]
    unreported: list[Violation]
    traceback: str = ""  # the script's traceback, when it raised an error a finding predicts

    @property
    def confirmed(self) -> bool:
        return any(v.status == CONFIRMED for v in self.verdicts)


def trace_script(
    path: str, args: Sequence[str] = (), steps: int = 5, watch_lines: Sequence[int] = ()
) -> tuple[Tracer, Outcome]:
    """Run ``path`` under a :class:`Tracer` that stops it after ``steps`` optimizer steps.

    ``tracer.executed`` receives ``(path, line)`` for each of ``watch_lines`` that ran.
    """
    path = os.path.abspath(path)
    tracer = Tracer(max_steps=steps)
    with tracer:
        outcome = run_script(path, args, watch_lines, lambda line: tracer.executed.add((path, line)))
    return tracer, outcome


def run_and_judge(path: str, findings: Sequence[Finding], args: Sequence[str] = (), steps: int = 5) -> RunReport:
    """Trace the script and confront ``findings`` with the trace.

    A script that raises, at a finding's line, the error that finding
    predicts (:mod:`~gradlint.runtime.crashes`) confirms it; the other
    findings are judged on the events seen until then. Raises
    :class:`RunError` when the script fails otherwise or no optimizer step ran.
    """
    watch = sorted({f.line for f in findings if same_file(f.path, path)})
    tracer, outcome = trace_script(path, args, steps, watch)
    crashed = confirmed_by_crash(findings, outcome.exc) if outcome.how == RAISED and outcome.exc else {}
    if crashed:
        verdicts = judge(findings, tracer.events, tracer.executed, tracer.disabled_scalers)
        for i, evidence in crashed.items():
            verdicts[i] = Verdict(findings[i], CONFIRMED, evidence)
        return RunReport(
            os.path.abspath(path), outcome, tracer.events, tracer.executed, tracer.steps, verdicts,
            unreported(findings, tracer.events), user_traceback(outcome.exc, path),
        )
    if not outcome.ok:
        if outcome.how == RAISED:
            raise RunError(
                f"the script raised {outcome.detail} after {tracer.steps} optimizer steps",
                tracer.events,
                user_traceback(outcome.exc, path) if outcome.exc else "",
            )
        raise RunError(f"the script called sys.exit({outcome.detail}) after {tracer.steps} optimizer steps", tracer.events)
    if tracer.steps == 0:
        backwards = sum(1 for e in tracer.events if e.kind is EventKind.BACKWARD)
        if backwards:
            raise RunError(f"the script ran {backwards} backwards but never stepped a torch.optim optimizer")
        raise RunError("no optimizer step ran: the script has no training loop gradlint can follow")
    verdicts = judge(findings, tracer.events, tracer.executed, tracer.disabled_scalers)
    return RunReport(
        os.path.abspath(path),
        outcome,
        tracer.events,
        tracer.executed,
        tracer.steps,
        verdicts,
        unreported(findings, tracer.events),
    )


def user_traceback(exc: BaseException, script: str) -> str:
    """The traceback of ``exc`` from the script's first frame on, as Python would print it."""
    script = os.path.abspath(script)
    tb = exc.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != script:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__)).rstrip()


def format_events(events: list[Event], max_steps: int = 3) -> list[str]:
    """The event sequence grouped by loop step, for the first ``max_steps`` steps.

    The STEP events of one backward under gradient release (one per optimizer)
    close a single group.
    """
    lines: list[str] = []
    current: list[Event] = []
    step = 0
    for i, e in enumerate(events):
        current.append(e)
        if e.kind is not EventKind.STEP:
            continue
        following = events[i + 1] if i + 1 < len(events) else None
        if (
            following is not None
            and following.kind is EventKind.STEP
            and following.facts.get("loop_step") == e.facts.get("loop_step")
        ):
            continue
        step += 1
        if step <= max_steps:
            lines.append(f"  step {step}:")
            lines.extend(f"    {x.describe()}" for x in current)
        current = []
    if current and step < max_steps:
        lines.append(f"  after step {step}:")
        lines.extend(f"    {x.describe()}" for x in current)
    return lines


def format_report(report: RunReport, show_steps: int = 3) -> str:
    """The text ``gradlint run`` prints."""
    name = os.path.basename(report.path)
    how = report.outcome.how if report.outcome.how != RAISED else f"raised {report.outcome.detail}"
    out = [f"gradlint run {name}: {report.steps} optimizer steps ({how})"]
    if report.traceback:
        out += ["the script's traceback:", *(f"  {line}" for line in report.traceback.splitlines())]
    out.append("observed events:")
    out += format_events(report.events, show_steps)
    if report.verdicts:
        out.append("static findings:")
        for v in report.verdicts:
            out.append(f"  {name}:{v.finding.line}: {v.finding.code} {v.status}: {v.evidence}")
    else:
        out.append("static findings: none")
    if report.unreported:
        out.append("observed at runtime without a static finding:")
        out += [f"  {v.code}: {v.evidence}" for v in report.unreported]
    return "\n".join(out)


def static_findings(path: str) -> list[Finding] | None:
    """The static linter's findings for ``path``; ``None`` when the linter is not installed."""
    try:
        from gradlint.linter import lint_file
    except ImportError:
        return None
    result = lint_file(path)
    if result.error:
        raise RunError(f"the static linter could not check {path}: {result.error}")
    return list(result.findings)
