"""What a rule reports: one finding, with everything every output format needs."""

from __future__ import annotations

import dataclasses
import enum


class Severity(str, enum.Enum):
    """How bad a finding is. ``INFO`` rules are opportunities, off unless selected."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    def __str__(self) -> str:
        return self.value


class FixKind(str, enum.Enum):
    """Whether a rule's fix keeps behaviour (safe) or changes numbers (unsafe)."""

    SAFE = "safe"
    UNSAFE = "unsafe"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    """One reported problem. Lines and columns are 1-based, as editors show them."""

    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    code: str
    name: str
    message: str
    severity: Severity
    fix: FixKind | None

    def to_dict(self) -> dict:
        """The JSON form: plain strings and ints, ``fix`` is ``"safe"``, ``"unsafe"`` or ``None``."""
        return {
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
            "code": self.code,
            "name": self.name,
            "message": self.message,
            "severity": self.severity.value,
            "fix": self.fix.value if self.fix is not None else None,
        }


@dataclasses.dataclass
class FileResult:
    """The outcome of checking one file: its findings, or why it could not be checked."""

    path: str
    findings: list[Finding] = dataclasses.field(default_factory=list)
    error: str | None = None
