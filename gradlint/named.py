"""Files named on the command line: always compiled, so that a syntax error in one is never silent.

A folder walk lets the prefilter skip, unparsed, every file no selected rule
could fire on; a syntax error in such a file goes unreported. A file named
explicitly (as pre-commit and editors name them) is different: the user
asked about it. When the prefilter skips it, Python's own parser still reads
it, which costs a fraction of the LibCST parse it avoids (and nothing on a
warm run: the answer is cached).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from pathlib import Path

from gradlint.source import SourceError

# Added to the rule codes a cache entry is keyed by, so that the answer for a
# named file (compiled) and a walked one (maybe not) are never mixed up.
COMPILED = "compiled"


def named_files(paths: Iterable[str]) -> frozenset[str]:
    """The paths among ``paths`` that are not folders, spelled as discovery yields them."""
    return frozenset(os.path.normpath(raw) for raw in paths if not Path(raw).is_dir())


def syntax_error(text: str) -> str | None:
    """Why ``text`` does not parse, in the words of a LibCST parse error, or None when it parses.

    Python's compiler answers first (a third faster than building the
    ``ast`` objects, on torch's own sources); only text it refuses goes to
    LibCST, which reads syntax newer than the running Python and has the
    last word, as it has for every file gradlint parses. The compiler's
    warnings (``"is" with a literal``) are not gradlint's to print.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, "<gradlint>", "exec", dont_inherit=True, optimize=2)
        return None
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    from gradlint.linter import parse  # the linter imports the rules; only a refused file needs it

    try:
        parse(text)
    except SourceError as error:
        return str(error)
    return None
