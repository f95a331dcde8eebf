"""Output formats: how findings and per-file errors are printed."""

from __future__ import annotations

import json
from collections.abc import Sequence

from gradlint.findings import FileResult, Finding


def all_findings(results: Sequence[FileResult]) -> list[Finding]:
    """Every finding of a run, in path, line, column order."""
    return sorted(f for r in results for f in r.findings)


def format_text(findings: Sequence[Finding]) -> str:
    """``path:line:col: CODE message``, one per line."""
    return "".join(f"{f.path}:{f.line}:{f.column}: {f.code} {f.message}\n" for f in findings)


def format_json(findings: Sequence[Finding]) -> str:
    """A JSON list of finding objects (see :meth:`Finding.to_dict`)."""
    return json.dumps([f.to_dict() for f in findings], indent=2) + "\n"


def format_errors(results: Sequence[FileResult]) -> str:
    """``path: reason`` for each file that could not be checked."""
    return "".join(f"{r.path}: {r.error}\n" for r in results if r.error)


def summary(results: Sequence[FileResult], fixed: int | None = None) -> str:
    """The closing line of a text run; after ``--fix``, ``fixed`` says how many fixes were applied."""
    findings = all_findings(results)
    failed = sum(1 for r in results if r.error)
    checked = len(results) - failed
    files = f"{checked} file{'s' if checked != 1 else ''} checked"
    if findings:
        fixable = sum(1 for f in findings if f.fix is not None)
        with_findings = len({f.path for f in findings})
        text = (
            f"Found {len(findings)} problem{'s' if len(findings) != 1 else ''} in {with_findings} "
            f"file{'s' if with_findings != 1 else ''} ({files}"
            + (f"; {fixable} with a fix" if fixable else "")
            + ")."
        )
    elif failed:
        text = f"No problems found ({files})."
    else:
        text = f"All checks passed ({files})."
    if failed:
        text += f" {failed} file{'s' if failed != 1 else ''} could not be checked."
    if fixed is not None:
        text += f" Fixed {fixed} problem{'s' if fixed != 1 else ''}."
    return text + "\n"
