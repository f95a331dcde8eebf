"""Reached lines: markers compiled into the script report exactly the watched lines that ran, tracebacks unchanged."""

from __future__ import annotations

import traceback

import pytest

from gradlint.runtime.reached import MARKER, compile_watching

SOURCE = b"""\
import functools

def helper(x):
    total = sum(
        [x, 1],
    )
    return total

@functools.lru_cache
def cached(x):
    return x

for i in range(2):
    if i > 5:
        print("never")
    else:
        y = helper(i)
try:
    raise KeyError("k")
except KeyError:
    z = 1
if y > 100:
    raise ValueError("boom")
"""


def _run(lines):
    seen = []
    code = compile_watching(SOURCE, "script.py", lines)
    exec(code, {MARKER: seen.append, "__name__": "__main__"})
    return seen


def test_only_watched_lines_that_ran_are_reported():
    # 5: inside a multi-line call (its statement starts at 4); 15: dead branch; 21: except body;
    # 13: a for header; 9: a decorator line; 23: a raise that does not run
    assert _run([5, 15, 21, 13, 9, 23]) == [9, 13, 5, 5, 21]


def test_line_numbers_in_tracebacks_are_unchanged():
    code = compile_watching(SOURCE.replace(b"y > 100", b"y < 100"), "script.py", [22, 23])
    with pytest.raises(ValueError) as info:
        exec(code, {MARKER: lambda line: None, "__name__": "__main__"})
    assert traceback.extract_tb(info.value.__traceback__)[-1].lineno == 23
