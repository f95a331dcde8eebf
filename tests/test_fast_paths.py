"""The shortcuts taken for speed give exactly what LibCST itself gives: children in order, and positions."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from gradlint.parsed_file import ParsedFile
from gradlint.positions import Positions
from gradlint.syntax import children

ROOT = Path(__file__).resolve().parent.parent

# Every kind of statement and expression LibCST knows on Python 3.10+, with
# comments, blank lines and continuation lines in awkward places.
RICH = '''\
#!/usr/bin/env python
# -*- coding: utf-8 -*-
"""Module docstring."""
from __future__ import annotations

import os, sys as system
from . import sibling
from ..pkg import (a, b as c,)  # trailing comment

@decorator
@decorator.attr(arg, *rest, key=value, **more)
async def function(x, /, y: int = 1, *args, z, w=2, **kwargs) -> "T":
    global g
    nonlocal_name = lambda q, *r, s=1, **t: (q, r, s, t)
    async with open(x) as f, lock:
        async for item in aiter(f):
            await item
    yield from gen()
    return (yield)

class Klass(Base, metaclass=Meta):
    attribute: int = 3
    def method(self):
        def inner():
            nonlocal x
            x = 1
        try:
            pass
        except (ValueError, TypeError) as error:
            raise RuntimeError("x") from error
        else:
            pass
        finally:
            del self.x, self[0]
        # a footer comment in the block
        try:
            pass
        except* OSError:
            pass

match command.split():
    case [action, *rest] if rest:
        pass
    case {"key": value, **others}:
        pass
    case Point(x=0, y=0) | None:
        pass
    case _:
        pass

values = [i ** 2 for i in range(10) if i % 2 if i > 3]
mapping = {k: v for k, v in zip(a, b)}
unique = {x async for x in agen()} if flag else set()
generator = (x for x in y)
sliced = data[1:2, ::3, ...]
text = f"{value!r:>{width}} and {other=}" "implicit" 'concat'
number = -1 + 2j * 3.5e-3 @ matrix // 4 % 5 << 6 >> 7 & 8 | 9 ^ ~10
condition = a < b <= c != d is not e not in f and not g or h
(walrus := compute())
x, *y = z = w
total += 1; total -= 2
assert total, "message"
value = \\
    continued
if a:
    pass
elif b:
    pass
else:
    pass
while True:
    break
else:
    pass
for i in range(3):
    continue
with a as (b, c):
    pass
'''


def _modules():
    sources = [("rich", RICH), ("rich-crlf", RICH.replace("\n", "\r\n")), ("no-newline", RICH.rstrip("\n"))]
    for path in sorted((ROOT / "fixtures").rglob("*.py"))[:40]:
        sources.append((path.name, path.read_text(encoding="utf-8")))
    for path in sorted((ROOT / "gradlint").rglob("*.py")):
        sources.append((path.name, path.read_text(encoding="utf-8")))
    return sources


def _nodes(module: cst.Module):
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


@pytest.mark.parametrize("name,source", _modules(), ids=lambda v: v if len(v) < 40 else "")
def test_children_and_positions_match_libcst(name, source):
    module = cst.parse_module(source)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    positions = Positions(ParsedFile(module))
    for node in _nodes(module):
        real = list(node.children)
        fast = children(node)
        assert len(fast) == len(real) and all(a is b for a, b in zip(fast, real)), type(node).__name__
        assert positions[node] == expected[node], (type(node).__name__, module.code_for_node(node)[:60])


def test_the_collector_is_paused_while_checking_and_restored_after(monkeypatch):
    import gc

    from gradlint import linter

    seen = []
    real_parse = linter.parse

    def parse_watched(text, *tree):
        seen.append(gc.isenabled())
        return real_parse(text, *tree)

    monkeypatch.setattr(linter, "parse", parse_watched)
    assert gc.isenabled()
    result = linter.lint_text("import torch\nfor x in data:\n    loss.backward()\n    opt.step()\n")
    assert seen == [False] and gc.isenabled()
    assert [f.code for f in result.findings] == ["GL001"]
    assert linter.lint_text("loss.backward(\nopt.step()\n").error  # unparsable: the collector comes back all the same
    assert gc.isenabled()
    gc.disable()
    try:
        linter.lint_text("loss.backward()\nopt.step()\n")
        assert not gc.isenabled()  # a caller's own setting is left as it was
    finally:
        gc.enable()


def test_nodes_go_unchecked_only_while_parsing_text_python_reads(monkeypatch):
    from gradlint import linter
    from gradlint.source import SourceError

    checked = []
    real_validate = cst.Name._validate

    def validate_counted(node):
        checked.append(node.value)
        return real_validate(node)

    monkeypatch.setattr(cst.Name, "_validate", validate_counted)
    module = linter.parse("import torch\nfor batch in data:\n    loss.backward()\n").module
    assert module.code.startswith("import torch") and checked == []  # the parser's own nodes: not checked
    cst.Name("built_by_hand")
    assert checked == ["built_by_hand"]  # restored once the parse is over
    with pytest.raises(cst.CSTValidationError):
        cst.Name("")
    with pytest.raises(SourceError, match="cannot parse"):  # Python refuses it: LibCST's check decides, as before
        linter.parse('x = b"bytes" "text"\n')


@pytest.mark.parametrize(
    ("source", "asked", "expected"),
    [
        ("x = 1  # noqa: GL001\ny = 2\n", {1}, {1: frozenset({"GL001"})}),
        ("x = 1  # noqa: GL001\ny = 2\n", {2}, {}),
        ("x = 1\ny = 2  # NOQA\n", {2}, {2: frozenset({"*"})}),
        ('s = """\n# noqa\n"""\n', {2}, {}),  # mentioned on the line, but inside a string: no comment
    ],
)
def test_noqa_lines_asked_gives_the_full_answer_on_the_lines_asked(source, asked, expected):
    from gradlint.noqa import noqa_lines

    answer = noqa_lines(source, asked)
    assert {line: codes for line, codes in answer.items() if line in asked} == expected
    full = noqa_lines(source)
    assert {line: codes for line, codes in full.items() if line in asked} == expected


NOQA_SCRIPT = '''"""Doc: # noqa in a docstring is no comment."""
import torch  # noqa: F401


@decorate  # noqa: GL001
def train(loader):
    text = """
    loss.backward()  # noqa
    """
    for x in loader:
        model(x).backward(); opt.step()  # noqa: GL001, GL006
        call(
            x,  # noqa: GL003
        )


x = 1; y = 2  # NOQA
'''


def test_noqa_lines_read_per_statement_agree_with_the_whole_text():
    """Tokenizing only the top-level statements that hold an asked line gives the whole text's answer on those lines."""
    import ast

    from gradlint.noqa import noqa_lines

    tree = ast.parse(NOQA_SCRIPT)
    statements = [
        (s.decorator_list[0].lineno if getattr(s, "decorator_list", None) else s.lineno, s.end_lineno) for s in tree.body
    ]
    full = noqa_lines(NOQA_SCRIPT)
    assert set(full) == {2, 5, 11, 13, 17}
    for line in range(1, NOQA_SCRIPT.count("\n") + 1):
        answer = noqa_lines(NOQA_SCRIPT, {line}, statements)
        assert {n: c for n, c in answer.items() if n == line} == {n: c for n, c in full.items() if n == line}, line



def test_the_framework_walk_runs_only_when_the_text_names_a_framework(monkeypatch):
    from gradlint.build import build_model
    from gradlint.frameworks import settings as frameworks
    from gradlint.linter import parse

    walked = []
    real = frameworks._read
    monkeypatch.setattr(frameworks, "_read", lambda module, *rest: walked.append(module) or real(module, *rest))
    loop = "for x in data:\n    loss = model(x)\n    loss.backward()\n    opt.step()\n"
    wrapped = "from torch.nn.parallel import DistributedDataParallel as DDP\nmodel = DDP(net)\n" + loop
    plain = frameworks.framework_settings(build_model(parse(loop)))
    assert walked == [] and plain == frameworks.FrameworkSettings()
    settings = frameworks.framework_settings(build_model(parse(wrapped)))
    assert len(walked) == 1 and len(settings.wrap_calls("ddp")) == 1


def test_the_framework_shortcut_loses_no_setting_on_any_fixture():
    # A module whose walk finds any setting must name one of the framework names in its text; a
    # framework declaration whose names the shortcut does not know fails here.
    from gradlint.frameworks import settings as frameworks
    from gradlint.linter import parse

    missed = []
    for path in sorted((ROOT / "fixtures").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        try:
            module = parse(text).module
        except Exception:
            continue  # the unparsable fixtures test the error path
        if frameworks._read(module) != frameworks.FrameworkSettings():
            if not any(name in text for name in frameworks.LAST_NAMES):
                missed.append(path.relative_to(ROOT).as_posix())
    assert missed == []


def test_per_file_values_are_computed_once_per_key_and_belong_to_their_file():
    import libcst as cst

    from gradlint.parsed_file import ParsedFile

    first, second = ParsedFile(cst.parse_module("a = 1\n")), ParsedFile(cst.parse_module("a = 1\n"))
    calls = []
    compute = lambda: calls.append(1) or len(calls)  # noqa: E731
    assert first.once("k", compute) == 1
    assert first.once("k", compute) == 1  # cached
    assert first.once("other", compute) == 2  # another key
    assert second.once("k", compute) == 3  # another file: computed anew
    assert first.once("k", compute) == 1  # the first file's value is its own, whatever was asked of others meanwhile
