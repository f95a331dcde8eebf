"""Positions computed per reporting statement agree with LibCST's PositionProvider over the whole module."""

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from gradlint.build import build_model
from gradlint.linter import parse
from gradlint.parsed_file import ParsedFile
from gradlint.positions import Positions

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*ROOT.glob("fixtures/**/*.py"), *ROOT.glob("examples/*.py")])
# Whitespace belongs to no finding; every other node must have the position PositionProvider gives it.
_WHITESPACE = (cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.TrailingWhitespace, cst.Newline, cst.EmptyLine, cst.Comment)

DECORATED = '''import functools


# a comment before the decorator

@functools.cache  # why
@staticmethod
def f(x):
    return x; y = 2

class A:  # trailing
    """doc"""

    @property
    def g(self):
        return (
            1
        )
x = 1; z = f(
  2)
for attr in attrs:
    match getattr(t, attr):
        case A() as inner:
            if inner:
                f(inner, *args, [
                    1,
                ])
        case _:
            pass
try:
    import torch
except ImportError:  # noqa
    torch = None
else:
    y = 3
finally:
    z = 4
if a:
    b = 1
elif c:
    d = 2
else:
    e = 3
'''


def _expected(module: cst.Module) -> dict:
    return MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)


def _check_model(text: str) -> int:
    parsed = parse(text)
    module = parsed.module
    model = build_model(parsed)
    checked = 0
    for node, code_range in _expected(module).items():
        if node is module or isinstance(node, _WHITESPACE) or node not in model.parents:
            continue
        start, end = code_range.start, code_range.end
        assert model.position(node) == (start.line, start.column + 1, end.line, end.column + 1), (type(node).__name__, code_range)
        assert model.line(node) == start.line, (type(node).__name__, code_range)
        checked += 1
    return checked


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_positions_match_position_provider(path):
    assert _check_model(path.read_text(encoding="utf-8")) > 10


def test_decorators_comments_and_semicolons():
    assert _check_model(DECORATED) > 30


def test_without_the_parsers_lines_or_the_parent_map():
    """A module LibCST parsed alone: start lines from Python's parser run on demand, statements found by walking."""
    module = cst.parse_module(DECORATED)
    positions = Positions(ParsedFile(module, DECORATED))
    for node, code_range in _expected(module).items():
        if node is not module and not isinstance(node, _WHITESPACE):
            assert positions[node] == code_range


def test_code_python_cannot_read_falls_back_to_counting_lines():
    text = "x = 1\n\ntype Alias = int\ny = f(\n  2)\n"  # a type alias statement: newer than this Python's parser
    module = cst.parse_module(text)
    positions = Positions(ParsedFile(module, text))
    for node, code_range in _expected(module).items():
        if node is not module and not isinstance(node, _WHITESPACE):
            assert positions[node] == code_range


NON_ASCII = '''for batch in loader:
    if batch:
        print("größe", "損失")  # ü
    with ctx() as c, \\
            other():
        log("λ = 0.5")
    while n:  # é
        n -= 1; s = "ñ"
'''


def test_loops_branches_and_withs_end_in_characters_not_bytes():
    """Their spans come from Python's parser, which counts UTF-8 bytes: the end column must still be LibCST's."""
    assert _check_model(NON_ASCII) > 20
