"""Errors a static finding predicts, recognised when the script raises them at the finding's line.

Some bugs do not corrupt training quietly: torch refuses them. GradScaler
keeps a stage per optimizer (ready, unscaled, stepped) and raises when a loop
calls it out of order, which is what GL104 and GL105 predict. A script that
raises such an error, from the line of such a finding, has confirmed it as
strongly as a run can: the verdict is ``confirmed``, with the traceback line
as evidence. Any other exception still means the script could not be judged.
"""

from __future__ import annotations

import dataclasses
import os
import traceback
from typing import Iterable

from gradlint.findings import Finding
from gradlint.runtime.predicates import same_file


@dataclasses.dataclass(frozen=True)
class PredictedError:
    """An exception type and the start of its message, as torch raises it."""

    type_name: str
    message: str
    meaning: str

    def matches(self, exc: BaseException) -> bool:
        return type(exc).__name__ == self.type_name and str(exc).strip().startswith(self.message)


# torch/amp/grad_scaler.py, GradScaler.unscale_, .step and .update
PREDICTED: dict[str, tuple[PredictedError, ...]] = {
    "GL104": (
        PredictedError("RuntimeError", "step() has already been called since the last update()",
                       "scaler.step() ran again with no scaler.update() in between"),
    ),
    "GL105": (
        PredictedError("RuntimeError", "unscale_() has already been called on this optimizer since the last update()",
                       "unscale_() ran on a second micro-batch before the step and update()"),
        PredictedError("AssertionError", "No inf checks were recorded prior to update",
                       "update() ran on a micro-batch whose optimizer was neither unscaled nor stepped"),
    ),
}


def _frames_at(exc: BaseException, finding: Finding) -> list[traceback.FrameSummary]:
    """The traceback's frames at the finding's file and line."""
    return [
        frame for frame in traceback.extract_tb(exc.__traceback__)
        if frame.lineno == finding.line and same_file(frame.filename, finding.path)
    ]


def crash_evidence(finding: Finding, exc: BaseException) -> str | None:
    """Why ``exc`` confirms ``finding`` (it is the error the finding predicts, raised through its line), or ``None``."""
    for predicted in PREDICTED.get(finding.code, ()):
        if not predicted.matches(exc):
            continue
        frames = _frames_at(exc, finding)
        if frames:
            frame = frames[-1]
            message = str(exc).strip().splitlines()[0].rstrip(".")
            return (
                f"the script raised {type(exc).__name__}: {message} at {os.path.basename(frame.filename)}:"
                f"{frame.lineno} (`{frame.line}`), the error {finding.code} predicts: {predicted.meaning}"
            )
    return None


def confirmed_by_crash(findings: Iterable[Finding], exc: BaseException) -> dict[int, str]:
    """``{index of the finding: evidence}`` for every finding the exception confirms."""
    found = {}
    for i, finding in enumerate(findings):
        evidence = crash_evidence(finding, exc)
        if evidence is not None:
            found[i] = evidence
    return found
