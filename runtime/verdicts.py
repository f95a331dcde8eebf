"""Confront static findings with an observed trace: confirmed, refuted, not exercised or not reached.

``refuted`` is said only when the run put the rule to the test and the bug did
not happen; a run that never did (no accumulation, a disabled GradScaler)
says ``not exercised`` and why.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from gradlint.events import EventKind
from gradlint.findings import Finding
from gradlint.runtime.predicates import PREDICATES, Violation, evaluate, same_file
from gradlint.runtime.tracer import Event

CONFIRMED = "confirmed"
REFUTED = "refuted"
NOT_REACHED = "not reached"
NOT_CHECKED = "not checked"
NOT_EXERCISED = "not exercised"
SCALER_CODES = frozenset({"GL101", "GL102", "GL103", "GL104"})


@dataclasses.dataclass
class Verdict:
    """What the run says about one static finding."""

    finding: Finding
    status: str
    evidence: str


def _reached(finding: Finding, events: list[Event], executed: set[tuple[str, int]]) -> bool:
    for path, line in executed:
        if line == finding.line and same_file(path, finding.path):
            return True
    return any(e.site.line == finding.line and same_file(e.site.path, finding.path) for e in events)


def _at_line(v: Violation, finding: Finding) -> bool:
    return v.anywhere or any(line == finding.line and same_file(path, finding.path) for path, line in v.lines)


def judge(
    findings: Iterable[Finding],
    events: list[Event],
    executed: set[tuple[str, int]],
    disabled_scalers: Iterable[str] = (),
) -> list[Verdict]:
    """One :class:`Verdict` per finding, in the order given.

    ``disabled_scalers``: GradScalers seen with ``enabled=False``, named in the
    reason a scaler rule was not exercised.
    """
    disabled = sorted(disabled_scalers)
    results = evaluate(events)
    steps = sum(1 for e in events if e.kind is EventKind.STEP)
    verdicts = []
    for f in findings:
        if f.code not in PREDICATES:
            verdicts.append(Verdict(f, NOT_CHECKED, f"no runtime check exists for {f.code}"))
            continue
        if not _reached(f, events, executed):
            verdicts.append(Verdict(f, NOT_REACHED, f"line {f.line} did not run in the first {steps} optimizer steps"))
            continue
        violations, checked, exercised = results[f.code]
        here = [v for v in violations if _at_line(v, f)]
        if here:
            verdicts.append(Verdict(f, CONFIRMED, here[0].evidence))
        elif violations:
            verdicts.append(Verdict(f, REFUTED, f"not at line {f.line}; observed instead: {violations[0].evidence}"))
        elif not exercised and f.code in SCALER_CODES and disabled:
            verdicts.append(
                Verdict(
                    f,
                    NOT_EXERCISED,
                    f"scaler disabled: {', '.join(disabled)} ran with enabled=False, so scale, unscale_, step and "
                    f"update passed everything through ({steps} optimizer steps observed)",
                )
            )
        elif not exercised:
            verdicts.append(Verdict(f, NOT_EXERCISED, f"{checked} ({steps} optimizer steps observed)"))
        else:
            verdicts.append(Verdict(f, REFUTED, f"{checked} ({steps} optimizer steps observed)"))
    return verdicts


def unreported(findings: Iterable[Finding], events: list[Event]) -> list[Violation]:
    """Violations the run observed that no static finding of the same code covers."""
    codes = {f.code for f in findings}
    out = []
    for code, (violations, _, _) in evaluate(events).items():
        if code not in codes and violations:
            out.append(violations[0])
    return out
