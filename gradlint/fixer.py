"""Applying fixes: lint, apply what can be fixed, re-parse, lint again, and write atomically.

A tree is linted once by :mod:`gradlint.runner`; the files with a fix to
apply then go through the rounds below, one file at a time.

Each round lints the current text, takes the fixes the run allows (safe
ones, unsafe ones too with ``--unsafe-fixes``) of findings not silenced by
``# noqa``, applies those whose code does not overlap in one pass, and
re-parses. Fixes that touch the same code wait for the next round, which
sees the code the earlier ones left. Rounds are bounded; a round that would
produce text that does not parse stops everything and leaves the file as it
was, with an error.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import os
import stat
import tempfile
from collections.abc import Iterable, Sequence

from gradlint.config import Config
from gradlint.findings import FileResult, Finding, FixKind
from gradlint.fixes.edits import AddImport, CannotApply, Edit, anchors, apply_edits
from gradlint.linter import OLD_NAMES, lint_text, might_fire, parse, rule_reports
from gradlint.build import build_model
from gradlint.model import LoopModel
from gradlint.noqa import is_suppressed, noqa_lines
from gradlint.rule import Rule
from gradlint.rules import ALL_RULES
from gradlint.runner import run
from gradlint.source import Source, SourceError, decode, read_bytes

MAX_ROUNDS = 12


@dataclasses.dataclass
class FixOutcome:
    """One file after fixing: its text before and after, how many fixes went in, and what is left to report."""

    path: str
    original: str
    text: str
    fixed: int
    result: FileResult

    @property
    def changed(self) -> bool:
        """Whether fixing changed the text."""
        return self.text != self.original


@dataclasses.dataclass
class _Candidate:
    finding: Finding
    edits: list[Edit]
    spans: list[tuple[int, int]]  # line ranges the edits touch; (0, 0) stands for the import block


def fix_text(
    text: str,
    path: str = "<string>",
    config: Config | None = None,
    *,
    unsafe: bool = False,
    prefilter: bool = True,
    context: Iterable[str] | None = None,
) -> FixOutcome:
    """Fix ``text`` as if it were the file ``path``; the outcome holds the new text and the findings left.

    ``context`` is what the other files of the run say about this one (:func:`gradlint.build.build_model`).
    """
    config = config or Config()
    rules = config.rules_for(path, ALL_RULES)
    if not rules or (prefilter and not might_fire(text, rules)):
        return FixOutcome(path, text, text, 0, FileResult(path))
    current, fixed, seen = text, 0, {text}
    for _ in range(MAX_ROUNDS):
        try:
            parsed = parse(current, old_names=False)  # a stand-in's code must never be written back
            model = build_model(parsed, context)
            findings, candidates = _lint_round(model, path, rules, current, unsafe)
            batch = _non_overlapping(candidates)
            if not batch:
                return FixOutcome(path, text, current, fixed, FileResult(path, sorted(set(findings))))
            new_text, applied = _apply(model, batch)
        except SourceError as error:
            if str(error).endswith(OLD_NAMES):  # checked all the same, only not fixed
                findings = lint_text(text, path, config, prefilter=prefilter, context=context).findings
                return FixOutcome(path, text, text, 0, FileResult(path, findings, error=str(error)))
            return FixOutcome(path, text, text, 0, FileResult(path, error=str(error)))
        except Exception as error:  # noqa: BLE001 - a broken fix must leave the file alone, not stop the run
            return FixOutcome(path, text, text, 0, FileResult(path, error=f"internal error while fixing: {type(error).__name__}: {error}"))
        if new_text is None:
            break
        problem = _parse_problem(new_text)
        if problem is not None:
            codes = ", ".join(sorted({c.finding.code for c in applied}))
            error = f"fixing {codes} would produce code that does not parse ({problem}); file left unchanged"
            return FixOutcome(path, text, text, 0, FileResult(path, error=error))
        if new_text in seen:
            break
        seen.add(new_text)
        current, fixed = new_text, fixed + len(applied)
    return FixOutcome(path, text, current, fixed, lint_text(current, path, config, prefilter=prefilter, context=context))


def _lint_round(model: LoopModel, path: str, rules: Sequence[type[Rule]], text: str, unsafe: bool) -> tuple[list[Finding], list[_Candidate]]:
    """Every finding not silenced by ``# noqa``, and the fixes this run may apply, in source order."""
    allowed = _allowed_fixes(unsafe)
    noqa = noqa_lines(text)
    findings, candidates = [], []
    for rule in rules:
        for finding, report in rule_reports(rule, model, path):
            if is_suppressed(finding.code, finding.line, noqa):
                continue
            findings.append(finding)
            if report.fix is None or rule.fix not in allowed:
                continue
            edits = report.fix.edits()
            if edits:
                candidates.append(_Candidate(finding, edits, _spans(model, edits)))
    candidates.sort(key=lambda c: (c.finding.line, c.finding.column, c.finding.code))
    return findings, candidates


def _spans(model: LoopModel, edits: Iterable[Edit]) -> list[tuple[int, int]]:
    spans = []
    for edit in edits:
        if isinstance(edit, AddImport):
            spans.append((0, 0))
        for node in anchors(edit):
            line, _, end_line, _ = model.position(node)
            spans.append((line, end_line))
    return spans


def _non_overlapping(candidates: list[_Candidate]) -> list[_Candidate]:
    """The candidates, in order, that share no touched line with an earlier one."""
    taken: list[tuple[int, int]] = []
    batch = []
    for candidate in candidates:
        if any(a <= d and c <= b for a, b in candidate.spans for c, d in taken):
            continue
        batch.append(candidate)
        taken.extend(candidate.spans)
    return batch


def _apply(model: LoopModel, batch: list[_Candidate]) -> tuple[str | None, list[_Candidate]]:
    """Apply the batch in one pass; if one fix does not fit, the first one that does, alone."""
    try:
        return apply_edits(model.module, [e for c in batch for e in c.edits]).code, batch
    except CannotApply:
        pass
    for candidate in batch:
        try:
            return apply_edits(model.module, candidate.edits).code, [candidate]
        except CannotApply:
            continue
    return None, []


def _parse_problem(text: str) -> str | None:
    """Why ``text`` is not valid Python, or None."""
    try:
        ast.parse(text)
    except SyntaxError as error:
        return f"{error.msg}, line {error.lineno}"
    except ValueError as error:
        return str(error)
    return None


class NotWritten(Exception):
    """The fixed text was not written, for a reason the message gives in one line; the file is as it was."""


def fix_file(
    path: str,
    config: Config | None = None,
    *,
    unsafe: bool = False,
    write: bool = True,
    prefilter: bool = True,
    context: Iterable[str] | None = None,
) -> FixOutcome:
    """Fix one file; with ``write``, save the result atomically when it changed.

    The file is written only if it still holds the bytes that were fixed:
    a file edited meanwhile, or a read-only one, is left alone with an error.
    """
    try:
        data = read_bytes(path)
        source = decode(data)
    except SourceError as error:
        return FixOutcome(path, "", "", 0, FileResult(path, error=str(error)))
    outcome = fix_text(source.text, path, config, unsafe=unsafe, prefilter=prefilter, context=context)
    if write and outcome.changed:
        try:
            write_atomic(path, outcome.text, source, expected=data)
        except NotWritten as error:
            return FixOutcome(path, outcome.original, outcome.original, 0, FileResult(path, error=str(error)))
        except (OSError, UnicodeEncodeError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            return FixOutcome(path, outcome.original, outcome.original, 0, FileResult(path, error=f"cannot write the fixed file: {reason}"))
    return outcome


def fix_paths(
    paths: Iterable[str],
    config: Config | None = None,
    *,
    unsafe: bool = False,
    write: bool = True,
    prefilter: bool = True,
    jobs: int | None = None,
) -> list[FixOutcome]:
    """Fix every file under ``paths``; outcomes come sorted by path, unreadable paths as errors.

    The runner lints the whole tree once (discovery, prefilter, parsing on
    ``jobs`` processes); only the files with a fix this run may apply go
    through the fix rounds, and only a file that changed is linted again.
    """
    config = config or Config()
    allowed = _allowed_fixes(unsafe)
    outcomes = []
    contexts: dict[str, tuple[str, ...]] = {}
    for result in run(paths, config, jobs=jobs, cache=None, prefilter=prefilter, contexts=contexts):
        if result.error is None and any(finding.fix in allowed for finding in result.findings):
            context = contexts.get(result.path)
            outcomes.append(fix_file(result.path, config, unsafe=unsafe, write=write, prefilter=prefilter, context=context))
        else:
            outcomes.append(FixOutcome(result.path, "", "", 0, result))
    return outcomes


def _allowed_fixes(unsafe: bool) -> set[FixKind]:
    """The kinds of fix a run applies: the safe ones, and the unsafe ones when asked."""
    return {FixKind.SAFE, FixKind.UNSAFE} if unsafe else {FixKind.SAFE}


def write_atomic(path: str, text: str, source: Source, *, expected: bytes | None = None) -> None:
    """Replace the file's content by ``text`` in its own encoding: a temporary file beside it, then a rename.

    A reader, or a run that is killed, sees the old bytes or the new ones,
    never a mix. The file keeps its permission bits; a symbolic link keeps
    pointing at the (rewritten) file it pointed at. Line endings are those of
    ``text``, which keeps the file's own. A read-only file raises
    :class:`NotWritten`, and so does one whose bytes are no longer
    ``expected`` (it was edited while being fixed): both are left as they are.
    """
    real = os.path.realpath(path)
    data = text.encode(source.encoding)
    mode = stat.S_IMODE(os.stat(real).st_mode)
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(real, os.W_OK):
        raise NotWritten("cannot fix: the file is read-only; left unchanged")
    folder, name = os.path.split(real)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".gradlint")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        if expected is not None and _current_bytes(real) != expected:
            raise NotWritten("changed while being fixed; left as it is now (run again to fix it)")
        os.replace(temporary, real)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _current_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def unified_diff(outcome: FixOutcome) -> str:
    """The change fixing made to one file, as a unified diff (empty when nothing changed)."""
    if not outcome.changed:
        return ""
    lines = difflib.unified_diff(
        outcome.original.splitlines(keepends=True),
        outcome.text.splitlines(keepends=True),
        fromfile=f"a/{outcome.path}",
        tofile=f"b/{outcome.path}",
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
