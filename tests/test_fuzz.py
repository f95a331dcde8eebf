"""Fuzzing: generated programs and mutated training loops never crash the linter, and fixing them is sound.

Two sources of input:

- ``hypothesmith``: arbitrary Python programs, from the grammar and from
  LibCST's node types (almost never a training loop: they test that the
  model survives any syntax);
- the fixture scripts with one of their loops mutated: statements shuffled,
  deleted and duplicated inside the loop or a block of it, names renamed,
  guards inverted (training loops in every broken shape).

Properties: linting never raises and never reports an internal error; the
same input gives the same findings, file by file, as part of a run over a
folder, and with worker processes (``-j``); ``--fix --unsafe-fixes`` gives code that parses, leaves no finding
that still has a fix, and a second ``--fix`` changes nothing.

The example count comes from the hypothesis profile (``tests/conftest.py``):
500 per property in CI, fewer locally.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import tempfile

import hypothesmith
import libcst as cst
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from run_size import full_run

from fixture_markers import extra_selected, marker_fixtures
from gradlint import runner
from gradlint.config import Config
from gradlint.fixer import fix_text
from gradlint.old_syntax import stand_in
from gradlint.linter import lint_paths, lint_text
from gradlint.rules import ALL_RULES

# Generated programs are full of ``1()`` and ``"s"[1, 2]``: Python warns while compiling them, rightly.
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")

ALL = Config(select=tuple(rule.code for rule in ALL_RULES))  # the off-by-default rules too


def _loop_sources() -> list[str]:
    """Fixture scripts that hold at least one loop with a backward in it.

    Python 3.6 scripts that LibCST reads only through a stand-in (``async`` as a name) are left out: the
    mutations rewrite code, and such a file is never rewritten (``tests/test_old_syntax.py``).
    """
    sources = []
    for path in marker_fixtures():
        text = path.read_text(encoding="utf-8")
        if "backward" in text and stand_in(text) is None and any(_loops(cst.parse_module(text))):
            sources.append(text)
    return sources


def _loops(module: cst.Module) -> list[cst.For | cst.While]:
    found = []
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.For, cst.While)) and "backward" in module.code_for_node(node):
            found.append(node)
        stack.extend(node.children)
    return found


def _blocks(node: cst.CSTNode) -> list[cst.IndentedBlock]:
    """Every indented block inside ``node`` (its own body first)."""
    found = []
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.IndentedBlock):
            found.append(current)
        stack.extend(reversed(current.children))
    return found


class _Replace(cst.CSTTransformer):
    def __init__(self, target: cst.CSTNode, replacement: cst.CSTNode) -> None:
        self.target, self.replacement = target, replacement

    def leave_IndentedBlock(self, original, updated):
        return self.replacement if original is self.target else updated

    def leave_If(self, original, updated):
        return self.replacement if original is self.target else updated


class _Rename(cst.CSTTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def leave_Name(self, original, updated):
        return updated.with_changes(value=self.new) if updated.value == self.old else updated


NEW_NAMES = ["optimizer", "opt", "scaler", "loss", "model", "accum", "i", "scheduler", "renamed"]
OPERATIONS = ["shuffle", "delete", "duplicate", "invert", "rename"]


def _mutate(draw, text: str) -> str:
    """One mutation of one training loop of ``text``."""
    module = cst.parse_module(text)
    loops = _loops(module)
    if not loops:  # an earlier mutation took the backward out of every loop
        return text
    loop = draw(st.sampled_from(loops))
    operation = draw(st.sampled_from(OPERATIONS))
    if operation == "rename":
        names = sorted({n.value for n in _walk(loop) if isinstance(n, cst.Name)})
        if not names:
            return text
        old = draw(st.sampled_from(names))
        return module.visit(_Rename(old, draw(st.sampled_from(NEW_NAMES)))).code
    if operation == "invert":
        branches = [n for n in _walk(loop) if isinstance(n, cst.If)]
        if not branches:
            return text
        branch = draw(st.sampled_from(branches))
        inverted = branch.with_changes(
            test=cst.UnaryOperation(cst.Not(), cst.ensure_type(branch.test, cst.BaseExpression).with_changes(
                lpar=[cst.LeftParen()], rpar=[cst.RightParen()]
            ))
        )
        return module.visit(_Replace(branch, inverted)).code
    blocks = _blocks(loop)
    if not blocks:  # a loop written on one line (`for b in data: f(b).backward()`) has no indented block
        return text
    block = draw(st.sampled_from(blocks))
    body = list(block.body)
    if operation == "shuffle":
        body = [body[i] for i in draw(st.permutations(range(len(body))))]
    elif operation == "delete":
        del body[draw(st.integers(0, len(body) - 1))]
        body = body or [cst.SimpleStatementLine([cst.Pass()])]
    else:
        copy = body[draw(st.integers(0, len(body) - 1))]
        body.insert(draw(st.integers(0, len(body))), copy)
    return module.visit(_Replace(block, block.with_changes(body=body))).code


def _walk(node: cst.CSTNode):
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(current.children)


SOURCES = _loop_sources()


@st.composite
def mutated_loops(draw) -> str:
    """A fixture script after one to four mutations of its training loops."""
    text = draw(st.sampled_from(SOURCES))
    for _ in range(draw(st.integers(1, 4))):
        text = _mutate(draw, text)
    return text


def _config(text: str) -> Config:
    return Config(select=tuple(r.code for r in ALL_RULES if r.enabled_by_default) + extra_selected(text))


def _lint_is_sound(text: str, config: Config) -> list:
    first = lint_text(text, "fuzzed.py", config, prefilter=False)
    assert first.error is None or first.error.startswith("cannot parse"), first.error
    second = lint_text(text, "fuzzed.py", config, prefilter=False)
    assert (second.error, second.findings) == (first.error, first.findings), "the same input gave different findings"
    return first.findings


def _fix_is_sound(text: str, config: Config) -> None:
    fixed = fix_text(text, "fuzzed.py", config, unsafe=True)
    assert fixed.result.error is None, fixed.result.error
    ast.parse(fixed.text)
    left = [f"{f.code} line {f.line}" for f in fixed.result.findings if f.fix is not None]
    assert left == [], f"findings with a fix are left after fixing: {left}"
    again = fix_text(fixed.text, "fuzzed.py", config, unsafe=True)
    assert again.text == fixed.text and again.fixed == 0, "a second --fix changed the code"


@given(hypothesmith.from_grammar())
def test_generated_programs_never_crash(source):
    _lint_is_sound(source, ALL)


@given(hypothesmith.from_node())
def test_generated_syntax_trees_never_crash(source):
    _lint_is_sound(source, ALL)


@given(mutated_loops())
def test_mutated_loops_lint_without_errors_and_deterministically(text):
    findings = _lint_is_sound(text, ALL)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "fuzzed.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        for name in ("a.py", "z.py"):  # other files around it change nothing
            with open(os.path.join(folder, name), "w", encoding="utf-8") as handle:
                handle.write(text)
        results = {os.path.basename(r.path): r for r in lint_paths([folder], ALL)}
    for name in ("fuzzed.py", "a.py"):
        assert [_where_and_what(f) for f in results[name].findings] == [_where_and_what(f) for f in findings]


def _where_and_what(finding):
    """A finding with its path left out."""
    return dataclasses.replace(finding, path="")


@given(mutated_loops())
def test_fixing_mutated_loops_is_sound(text):
    _fix_is_sound(text, _config(text))


@settings(max_examples=60 if full_run() else 5)  # each example is a folder of 10 programs, checked twice with processes
@given(st.lists(mutated_loops(), min_size=10, max_size=10))
def test_parallel_runs_give_the_same_findings(texts):
    with tempfile.TemporaryDirectory() as folder:
        for number, text in enumerate(texts):
            with open(os.path.join(folder, f"m{number:02d}.py"), "w", encoding="utf-8") as handle:
                handle.write(text)
        serial = runner.run([folder], ALL, jobs=1)
        original = runner.MIN_PARALLEL_CHARS
        runner.MIN_PARALLEL_CHARS = 0  # small files too go to the worker processes
        try:
            parallel = runner.run([folder], ALL, jobs=2)
        finally:
            runner.MIN_PARALLEL_CHARS = original
    assert parallel == serial
    assert [r.findings for r in serial] == [lint_text(t, os.path.join(folder, f"m{n:02d}.py"), ALL).findings for n, t in enumerate(texts)]
