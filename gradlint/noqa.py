"""``# noqa`` and ``# noqa: GL003, GL001`` comments: which codes each line suppresses."""

from __future__ import annotations

import bisect
import io
import re
import tokenize
from collections.abc import Collection, Sequence

# Same spelling flake8 accepts: "# noqa", "# noqa: GL001", "# NOQA:GL001,GL002".
_NOQA = re.compile(r"#\s*noqa(?::[\s]?(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)

_MENTION = re.compile("noqa", re.IGNORECASE)

ALL_CODES = frozenset({"*"})


def noqa_lines(
    source: str, asked: Collection[int] | None = None, statements: Sequence[tuple[int, int]] | None = None
) -> dict[int, frozenset[str]]:
    """Map each line with a noqa comment to the codes it suppresses (``{"*"}`` for a bare ``# noqa``).

    ``asked``, when given, holds the only lines the caller will look up: unless
    one of them mentions noqa, the answer is empty without tokenizing the source.
    ``statements``, the first and last line of each top-level statement in
    order (from Python's tree), lets only the statements holding such a line be
    tokenized: the tokenizer starts afresh at each of them.
    """
    if asked is None:
        return _comments(source, 1)
    mentioned = _asked_lines_mentioning(source, asked)
    if not mentioned:
        return {}
    if statements is None or "\r" in source:
        return _comments(source, 1)
    starts = [first for first, _ in statements]
    chosen: dict[int, tuple[int, int]] = {}
    for line in mentioned:
        position = bisect.bisect_right(starts, line) - 1
        if position < 0 or statements[position][1] < line:
            return _comments(source, 1)  # outside every statement: the whole text decides
        chosen[position] = statements[position]
    lines = source.split("\n")
    result: dict[int, frozenset[str]] = {}
    for first, last in chosen.values():
        result.update(_comments("\n".join(lines[first - 1:last]) + "\n", first))
    return result


def _comments(source: str, first_line: int) -> dict[int, frozenset[str]]:
    """The noqa comments of ``source``, whose first line is line ``first_line`` of the file."""
    result: dict[int, frozenset[str]] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return result
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        match = _NOQA.search(token.string)
        if match is None:
            continue
        codes = match.group("codes")
        result[token.start[0] + first_line - 1] = (
            frozenset(c.upper() for c in re.split(r"[,\s]+", codes) if c) if codes else ALL_CODES
        )
    return result


def _asked_lines_mentioning(source: str, asked: Collection[int]) -> set[int]:
    """The lines ``asked`` on which the text ``noqa`` (any case) stands, counted as the tokenizer counts them."""
    found: set[int] = set()
    line, counted_to = 1, 0
    for match in _MENTION.finditer(source):
        line += source.count("\n", counted_to, match.start())
        counted_to = match.start()
        if line in asked:
            found.add(line)
    return found


def is_suppressed(code: str, line: int, noqa: dict[int, frozenset[str]]) -> bool:
    """Whether ``code`` reported on ``line`` is silenced by a noqa comment on that line."""
    codes = noqa.get(line)
    return codes is not None and (codes is ALL_CODES or "*" in codes or code in codes)
