"""``# noqa`` and ``# noqa: GL003, GL001`` comments: which codes each line suppresses."""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Collection

# Same spelling flake8 accepts: "# noqa", "# noqa: GL001", "# NOQA:GL001,GL002".
_NOQA = re.compile(r"#\s*noqa(?::[\s]?(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)

_MENTION = re.compile("noqa", re.IGNORECASE)

ALL_CODES = frozenset({"*"})


def noqa_lines(source: str, asked: Collection[int] | None = None) -> dict[int, frozenset[str]]:
    """Map each line with a noqa comment to the codes it suppresses (``{"*"}`` for a bare ``# noqa``).

    ``asked``, when given, holds the only lines the caller will look up: unless
    one of them mentions noqa, the answer is empty without tokenizing the source.
    """
    result: dict[int, frozenset[str]] = {}
    if asked is not None and not _mentioned_on(source, asked):
        return result
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
        result[token.start[0]] = (
            frozenset(c.upper() for c in re.split(r"[,\s]+", codes) if c) if codes else ALL_CODES
        )
    return result


def _mentioned_on(source: str, asked: Collection[int]) -> bool:
    """Whether the text ``noqa`` (any case) stands on one of the lines ``asked``, counted as the tokenizer counts them."""
    line, counted_to = 1, 0
    for match in _MENTION.finditer(source):
        line += source.count("\n", counted_to, match.start())
        counted_to = match.start()
        if line in asked:
            return True
    return False


def is_suppressed(code: str, line: int, noqa: dict[int, frozenset[str]]) -> bool:
    """Whether ``code`` reported on ``line`` is silenced by a noqa comment on that line."""
    codes = noqa.get(line)
    return codes is not None and (codes is ALL_CODES or "*" in codes or code in codes)
