"""Baselines: record today's findings, then report only new ones.

A team turning gradlint on in a large codebase writes a baseline once
(``--write-baseline FILE``) and checks with ``--baseline FILE`` from then on:
only findings that are not in the baseline are reported. A finding is keyed
by what survives moving code around: its file (relative to the configuration's
folder), its code and the text of its line with whitespace collapsed, plus
how many findings with that same key come before it in the file. Lines
inserted above it, a re-indented block or a function moved within the file
leave the key alone; a new finding on a line like one already recorded adds
an occurrence, and is reported.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

from gradlint.config import Config
from gradlint.findings import FileResult, Finding
from gradlint.source import SourceError, read_source

FORMAT = "gradlint-baseline"
VERSION = 1

Key = tuple[str, str, str]  # relative path, code, normalised line text


class BaselineError(Exception):
    """The baseline file cannot be read or written; the message says why, in one line."""


def normalise(line: str) -> str:
    """A line's text with its indentation and every run of blanks reduced to nothing or one space."""
    return " ".join(line.split())


class FileLines:
    """The lines of the files findings point at, each file read once (``texts`` holds text not on disk, e.g. stdin)."""

    def __init__(self, texts: dict[str, str] | None = None) -> None:
        self._lines: dict[str, list[str]] = {path: text.splitlines() for path, text in (texts or {}).items()}

    def line(self, path: str, number: int) -> str:
        """Line ``number`` (1-based) of ``path``, or ``""`` when the file cannot be read or is shorter."""
        if path not in self._lines:
            try:
                self._lines[path] = read_source(path).text.splitlines()
            except SourceError:
                self._lines[path] = []
        lines = self._lines[path]
        return lines[number - 1] if 0 < number <= len(lines) else ""


def keys(findings: Sequence[Finding], config: Config, lines: FileLines) -> list[tuple[Key, int]]:
    """Each finding's key and occurrence index (0 for the first finding with that key in its file), in order."""
    seen: Counter[Key] = Counter()
    result = []
    for finding in sorted(findings):
        key = (config.relative(finding.path), finding.code, normalise(lines.line(finding.path, finding.line)))
        result.append((key, seen[key]))
        seen[key] += 1
    return result


def write(path: str, findings: Sequence[Finding], config: Config, lines: FileLines) -> int:
    """Write the baseline of ``findings`` to ``path``; return how many findings it records."""
    counts = Counter(key for key, _ in keys(findings, config, lines))
    entries = [
        {"path": relative, "code": code, "line": text, "count": count}
        for (relative, code, text), count in sorted(counts.items())
    ]
    document = {"format": FORMAT, "version": VERSION, "findings": entries}
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1, ensure_ascii=False)
            handle.write("\n")
    except OSError as error:
        raise BaselineError(f"{path}: cannot write: {error.strerror or error}") from error
    return sum(counts.values())


def load(path: str) -> Counter[Key]:
    """How many findings the baseline at ``path`` records under each key."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except FileNotFoundError as error:
        raise BaselineError(f"{path}: no such file (write one with --write-baseline)") from error
    except OSError as error:
        raise BaselineError(f"{path}: cannot read: {error.strerror or error}") from error
    except ValueError as error:
        raise BaselineError(f"{path}: not a gradlint baseline: {error}") from error
    if not isinstance(document, dict) or document.get("format") != FORMAT or document.get("version") != VERSION:
        raise BaselineError(f"{path}: not a gradlint baseline (format {FORMAT!r}, version {VERSION})")
    counts: Counter[Key] = Counter()
    try:
        for entry in document["findings"]:
            counts[(entry["path"], entry["code"], entry["line"])] += int(entry["count"])
    except (KeyError, TypeError, ValueError) as error:
        raise BaselineError(f"{path}: a baseline entry is malformed: {error!r}") from error
    return counts


def only_new(results: Sequence[FileResult], baseline: Counter[Key], config: Config, lines: FileLines) -> tuple[list[FileResult], int]:
    """``results`` without the findings the baseline records, and how many were left out.

    The first ``count`` findings of a key in a file are the recorded ones;
    any further finding with that key is new.
    """
    kept, hidden = [], 0
    for result in results:
        ordered = sorted(result.findings)
        new = [finding for finding, (key, index) in zip(ordered, keys(ordered, config, lines)) if index >= baseline.get(key, 0)]
        hidden += len(ordered) - len(new)
        kept.append(FileResult(result.path, new, result.error))
    return kept, hidden
