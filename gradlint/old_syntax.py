"""Python 3.6 code that uses ``async`` and ``await`` as names, read through a same-length stand-in.

Training scripts of 2017-2018 wrote ``x.cuda(async=True)`` (the old spelling
of ``non_blocking``). Since Python 3.7 ``async`` is a keyword, and LibCST's
parser refuses the file in every mode. Python's own parser still reads it
with ``feature_version=(3, 6)``. When it does, each ``async``/``await`` used
as a name is replaced by an identifier of the same length that the file does
not contain, so every line and column stays where it was; the linter parses
that stand-in and reports on the original text (messages quote the original,
sliced by position). The fixer never writes a stand-in: such a file is
checked, not fixed.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import tokenize

_WORDS = ("async", "await")
# Same-length stand-ins for each word; for each, the first one the file does not contain is used.
_STAND_INS = {
    "async": ("asyn_", "_asyn", "asy__", "as___", "a____"),
    "await": ("awai_", "_awai", "awa__", "aw___", "w____"),
}


@dataclasses.dataclass(frozen=True)
class StandIn:
    """The text to parse, and the word each stand-in name replaces (to say things in the original's words)."""

    text: str
    originals: dict[str, str]

    def restore(self, message: str) -> str:
        """``message`` with every stand-in name put back as the word it replaced."""
        for name, word in self.originals.items():
            message = message.replace(name, word)
        return message
# After ``async`` these make it a keyword (``async def``, ``async for``, ``async with``).
_KEYWORD_AFTER_ASYNC = ("def", "for", "with")
# Around ``await`` these make it a name: ``.await``, ``await=``, ``await,``, ``await)``.
_NAME_AFTER_AWAIT = ("=", ",", ")", "]", "}", ":")


def stand_in(text: str) -> StandIn | None:
    """``text`` with each ``async``/``await`` used as a name replaced by a same-length identifier; None when the text
    has none, Python's 3.6 grammar does not read it either, or no stand-in name is free."""
    if not any(word in text for word in _WORDS):
        return None
    try:
        ast.parse(text, feature_version=(3, 6))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    names = {word: next((c for c in candidates if c not in text), None) for word, candidates in _STAND_INS.items()}
    places = _names_used(text)
    if not places or any(names[word] is None for _, word in places):
        return None
    lines = text.splitlines(keepends=True)
    for (row, column), word in places:
        line = lines[row - 1]
        lines[row - 1] = line[:column] + names[word] + line[column + len(word):]
    return StandIn("".join(lines), {names[word]: word for _, word in places})


def _names_used(text: str) -> list[tuple[tuple[int, int], str]]:
    """Where ``async``/``await`` stand as names: the (line, column) of each such token, and the word."""
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type not in _SKIPPED]
    except (tokenize.TokenError, SyntaxError):
        return []
    places = []
    for index, token in enumerate(tokens):
        if token.type != tokenize.NAME or token.string not in _WORDS:
            continue
        after = tokens[index + 1].string if index + 1 < len(tokens) else ""
        before = tokens[index - 1].string if index else ""
        if token.string == "async":
            named = after not in _KEYWORD_AFTER_ASYNC
        else:
            named = before == "." or after in _NAME_AFTER_AWAIT
        if named:
            places.append((token.start, token.string))
    return places


_SKIPPED = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
