"""Output formats: how findings and per-file errors are printed."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from gradlint import __version__
from gradlint.findings import FileResult, Finding, FixKind, Severity
from gradlint.ruledoc import render_markdown, render_text

if TYPE_CHECKING:
    from gradlint.rule import Rule


def all_findings(results: Sequence[FileResult]) -> list[Finding]:
    """Every finding of a run, in path, line, column order."""
    return sorted(f for r in results for f in r.findings)


def format_text(findings: Sequence[Finding], *, links: bool = False) -> str:
    """``path:line:col: CODE message``, one per line; with ``links``, each followed by where its rule is documented."""
    if not links:
        return "".join(f"{f.path}:{f.line}:{f.column}: {f.code} {f.message}\n" for f in findings)
    base = docs_url()
    return "".join(
        f"{f.path}:{f.line}:{f.column}: {f.code} {f.message}\n    see {rule_url(f.code, base) or f'`gradlint rule {f.code}`'}\n"
        for f in findings
    )


def format_json(findings: Sequence[Finding]) -> str:
    """A JSON list of finding objects (see :meth:`Finding.to_dict`), each with the ``url`` of its rule's page (or null)."""
    base = docs_url()
    return json.dumps([{**f.to_dict(), "url": rule_url(f.code, base)} for f in findings], indent=2) + "\n"


def format_errors(results: Sequence[FileResult]) -> str:
    """``path: reason`` for each file that could not be checked."""
    return "".join(f"{r.path}: {r.error}\n" for r in results if r.error)


def _plural(count: int, noun: str) -> str:
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {noun}{'es' if noun.endswith(('x', 's', 'sh', 'ch')) else 's'}"


def unsafe_hint(findings: Sequence[Finding]) -> str:
    """`` N fixes available with `--unsafe-fixes`.`` for findings whose fix only that option applies, else ``""``."""
    hidden = sum(1 for f in findings if f.fix is FixKind.UNSAFE)
    return f" {_plural(hidden, 'fix')} available with `--unsafe-fixes`." if hidden else ""


def summary(results: Sequence[FileResult], fixed: int | None = None, *, unsafe: bool = False) -> str:
    """The closing line of a text run; after ``--fix``, ``fixed`` says how many fixes were applied.

    It counts the findings ``--fix`` would fix, and, unless ``unsafe`` (the
    run has ``--unsafe-fixes``), says how many more fixes ``--unsafe-fixes``
    would allow.
    """
    findings = all_findings(results)
    failed = sum(1 for r in results if r.error)
    checked = len(results) - failed
    files = _plural(checked, "file") + " checked"
    if findings:
        allowed = {FixKind.SAFE, FixKind.UNSAFE} if unsafe else {FixKind.SAFE}
        fixable = sum(1 for f in findings if f.fix in allowed)
        with_findings = len({f.path for f in findings})
        text = (
            f"Found {_plural(len(findings), 'problem')} in {_plural(with_findings, 'file')} ({files}"
            + (f"; {fixable} fixable with `--fix`" if fixable else "")
            + ")."
        )
    elif failed:
        text = f"No problems found ({files})."
    else:
        text = f"All checks passed ({files})."
    if failed:
        text += f" {_plural(failed, 'file')} could not be checked."
    if fixed is not None:
        text += f" Fixed {_plural(fixed, 'problem')}."
    if not unsafe:
        text += unsafe_hint(findings)
    return text + "\n"


def format_statistics(findings: Sequence[Finding]) -> str:
    """``--statistics``: one line per code, most frequent first: count, code, rule name."""
    counts = Counter(f.code for f in findings)
    names = {f.code: f.name for f in findings}
    return "".join(f"{count:>6}  {code}  {names[code]}\n" for code, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


# GitHub workflow commands: the level of each severity, and the characters
# that must be escaped in a property value and in the message.
_GITHUB_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def _github_escape(text: str, *, property_value: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if property_value:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def format_github(findings: Sequence[Finding]) -> str:
    """GitHub Actions workflow commands: ``::error file=…,line=…,col=…,endLine=…,endColumn=…,title=GL003::message``."""
    lines = []
    for f in findings:
        properties = {
            "file": f.path,
            "line": f.line,
            "col": f.column,
            "endLine": f.end_line,
            "endColumn": f.end_column,
            "title": f.code,
        }
        joined = ",".join(f"{key}={_github_escape(str(value), property_value=True)}" for key, value in properties.items())
        lines.append(f"::{_GITHUB_LEVEL[f.severity]} {joined}::{_github_escape(f'{f.code} {f.name}: {f.message}')}\n")
    return "".join(lines)


SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_SARIF_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def docs_url() -> str | None:
    """Where the documentation site lives: the package's ``Documentation`` project URL (pyproject.toml), if it has one."""
    from importlib import metadata  # only here: reading the package's metadata is not free

    try:
        urls = metadata.metadata("gradlint").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        return None
    by_label = dict(tuple(part.strip() for part in url.split(",", 1)) for url in urls if "," in url)
    return by_label.get("Documentation")


def rule_url(code: str, base: str | None) -> str | None:
    """The address of rule ``code``'s page on the documentation site at ``base`` (``BASE/rules/GL003/``), or None without one.

    The site is built by mkdocs from ``docs/``: ``docs/rules/GL003.md`` is
    served as ``rules/GL003/``, below the site's own address whether or not
    ``base`` ends with a slash.
    """
    return f"{base.rstrip('/')}/rules/{code}/" if base else None


def format_sarif(findings: Sequence[Finding], results: Sequence[FileResult], rules: Sequence[type[Rule]], root: Path) -> str:
    """A SARIF 2.1.0 log (for GitHub code scanning): every rule with its documentation, every finding with its place.

    Paths are written relative to ``root`` (given as ``%SRCROOT%``) when they lie below it.
    Files that could not be checked become tool execution notifications.
    """
    base = docs_url()
    index = {rule.code: i for i, rule in enumerate(rules)}
    sarif_rules = []
    for rule in rules:
        documentation = rule.documentation()
        entry: dict = {
            "id": rule.code,
            "name": rule.name,
            "shortDescription": {"text": rule.summary},
            "fullDescription": {"text": documentation.split("\n\n", 1)[0]},
            "help": {"text": render_text(rule, style=False), "markdown": render_markdown(rule)},
            "defaultConfiguration": {"level": _SARIF_LEVEL[rule.severity], "enabled": rule.enabled_by_default},
            "properties": {"tags": ["pytorch", "training-loop"], "fix": rule.fix.value if rule.fix else "none"},
        }
        if base:
            entry["helpUri"] = rule_url(rule.code, base)
        sarif_rules.append(entry)
    sarif_results = []
    for f in findings:
        result: dict = {
            "ruleId": f.code,
            "level": _SARIF_LEVEL[f.severity],
            "message": {"text": f.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": _artifact(f.path, root),
                        "region": {"startLine": f.line, "startColumn": f.column, "endLine": f.end_line, "endColumn": f.end_column},
                    }
                }
            ],
        }
        if f.code in index:
            result["ruleIndex"] = index[f.code]
        sarif_results.append(result)
    notifications = [
        {"level": "error", "message": {"text": r.error}, "locations": [{"physicalLocation": {"artifactLocation": _artifact(r.path, root)}}]}
        for r in results
        if r.error
    ]
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "gradlint", "version": __version__, "semanticVersion": __version__, "rules": sarif_rules}},
                "originalUriBaseIds": {"%SRCROOT%": {"uri": root.absolute().as_uri() + "/"}},
                "invocations": [{"executionSuccessful": not notifications, "toolExecutionNotifications": notifications}],
                "results": sarif_results,
            }
        ],
    }
    if base:
        log["runs"][0]["tool"]["driver"]["informationUri"] = base
    return json.dumps(log, indent=2) + "\n"


def _artifact(path: str, root: Path) -> dict:
    """A SARIF artifact location: relative to ``%SRCROOT%`` when below it, else an absolute file URI."""
    absolute = Path(path).absolute()
    try:
        relative = absolute.relative_to(root.absolute())
    except ValueError:
        return {"uri": absolute.as_uri()}
    return {"uri": quote(relative.as_posix()), "uriBaseId": "%SRCROOT%"}
