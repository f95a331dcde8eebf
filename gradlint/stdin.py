"""Source read from standard input, for editors: ``gradlint - --stdin-filename path.py``.

The text is checked (or fixed) as if it were the file ``path.py``: the
configuration found from that file's folder upwards applies, with its
``per-file-ignores`` and, under ``force-exclude``, its excludes matched
against that name. Nothing is written: a fix comes back as text.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gradlint.config import Config
from gradlint.findings import FileResult
from gradlint.named import syntax_error
from gradlint.source import SourceError, decode

if TYPE_CHECKING:
    from gradlint.fixer import FixOutcome

STDIN = "-"


def check_stdin(data: bytes, path: str, config: Config, *, fix: bool, unsafe: bool, prefilter: bool = True) -> FixOutcome | None:
    """Check (with ``fix``, also fix) ``data`` as the file ``path``; None when ``force_exclude`` excludes ``path``.

    Like a file named on the command line, the text is always compiled: a
    syntax error is reported even when no rule could fire on it.
    """
    from gradlint.fixer import FixOutcome, fix_text
    from gradlint.linter import lint_text

    if config.force_exclude and path != STDIN and config.is_excluded(Path(path)):
        return None
    try:
        text = decode(data).text
    except SourceError as error:
        return FixOutcome(path, "", "", 0, FileResult(path, error=str(error)))
    if fix:
        outcome = fix_text(text, path, config, unsafe=unsafe, prefilter=prefilter)
    else:
        outcome = FixOutcome(path, text, text, 0, lint_text(text, path, config, prefilter=prefilter))
    if not outcome.changed and outcome.result.error is None and not outcome.result.findings:
        problem = syntax_error(text)
        if problem is not None:
            outcome = FixOutcome(path, text, text, 0, FileResult(path, error=problem))
    return outcome


def encode_like(outcome: FixOutcome, data: bytes) -> bytes:
    """The bytes to hand back for ``data`` after fixing: ``data`` itself when nothing changed, else the new text in its encoding."""
    if not outcome.changed:
        return data
    return outcome.text.encode(decode(data).encoding)
