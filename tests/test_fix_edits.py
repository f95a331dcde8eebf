"""The edit engine: insertions, removals and replacements keep everything else byte for byte."""

from __future__ import annotations

import libcst as cst
import pytest

from gradlint.fixes.edits import AddImport, CannotApply, Insert, Remove, Replace, apply_edits, parse_statements
from gradlint.fixes.locate import descendants, statement_of
from gradlint.parsed_file import ParsedFile


def _call(module: cst.Module, text: str) -> cst.Call:
    """The call whose source is ``text``."""
    return next(n for n in descendants(module) if isinstance(n, cst.Call) and module.code_for_node(n) == text)


def _statement(module, text):
    return statement_of(ParsedFile(module), _call(module, text))


def test_insert_after_a_statement_on_its_own_line_adds_a_line_at_its_indentation():
    module = cst.parse_module("for x in xs:\n    if ok:\n        opt.step()  # step\n    done()\n")
    edits = [Insert(_statement(module, "opt.step()"), parse_statements("opt.zero_grad()\n"))]
    assert apply_edits(module, edits).code == "for x in xs:\n    if ok:\n        opt.step()  # step\n        opt.zero_grad()\n    done()\n"


def test_insert_into_a_one_line_suite_stays_under_the_same_guard():
    module = cst.parse_module("for n in ns:\n    if n % 4 == 0: opt.step()\n    log()\n")
    edits = [Insert(_statement(module, "opt.step()"), parse_statements("opt.zero_grad()\n"))]
    assert apply_edits(module, edits).code == "for n in ns:\n    if n % 4 == 0: opt.step(); opt.zero_grad()\n    log()\n"


def test_insert_between_statements_sharing_a_line():
    module = cst.parse_module("loss.backward(); opt.step(); log()\n")
    edits = [Insert(_statement(module, "opt.step()"), parse_statements("opt.zero_grad()\n"))]
    assert apply_edits(module, edits).code == "loss.backward(); opt.step(); opt.zero_grad(); log()\n"


def test_removing_the_last_of_several_statements_on_a_line_drops_its_semicolon():
    module = cst.parse_module("loss.backward(); opt.zero_grad()\n")
    edits = [Remove(_statement(module, "opt.zero_grad()"))]
    assert apply_edits(module, edits).code == "loss.backward()\n"


def test_removing_the_only_statement_of_a_block_leaves_pass():
    module = cst.parse_module("if ok:\n    opt.zero_grad()\nrest()\n")
    edits = [Remove(_statement(module, "opt.zero_grad()"))]
    assert apply_edits(module, edits).code == "if ok:\n    pass\nrest()\n"


def test_a_removed_statement_hands_its_blank_line_to_the_next_one():
    module = cst.parse_module("a()\n\nopt.zero_grad()\nb()\n")
    edits = [Remove(_statement(module, "opt.zero_grad()"))]
    assert apply_edits(module, edits).code == "a()\n\nb()\n"


def test_removing_the_first_statement_of_a_block_drops_the_blank_line_it_leaves_behind():
    module = cst.parse_module("for x in xs:\n    opt.zero_grad()\n\n    # forward\n    y = f(x)\n")
    edits = [Remove(_statement(module, "opt.zero_grad()"))]
    assert apply_edits(module, edits).code == "for x in xs:\n    # forward\n    y = f(x)\n"


def test_a_compound_statement_cannot_go_into_a_one_line_suite():
    module = cst.parse_module("if ok: opt.step()\n")
    loop = parse_statements("for p in ps:\n    p.grad = None\n")
    with pytest.raises(CannotApply):
        apply_edits(module, [Insert(_statement(module, "opt.step()"), loop)])


def test_replace_gets_the_node_after_inner_edits_and_keeps_comments_elsewhere():
    module = cst.parse_module("# header\nx = opt.zero_grad(set_to_none=False)  # why\n")
    false = next(n for n in descendants(module) if isinstance(n, cst.Name) and n.value == "False")
    edits = [Replace(false, lambda node: cst.Name("True"))]
    assert apply_edits(module, edits).code == "# header\nx = opt.zero_grad(set_to_none=True)  # why\n"


def test_imports_go_after_the_docstring_and_leading_imports_once():
    module = cst.parse_module('"""Doc."""\n\nimport torch\nfrom optimi import AdamW\n\nx = 1\n')
    edits = [AddImport("optimi", ("AdamW", "prepare_for_gradient_release")), AddImport("optimi", ())]
    expected = '"""Doc."""\n\nimport torch\nfrom optimi import AdamW\nfrom optimi import prepare_for_gradient_release\nimport optimi\n\nx = 1\n'
    assert apply_edits(module, edits).code == expected


def test_inserted_lines_use_the_files_own_line_ending():
    module = cst.parse_module("for x in xs:\r\n    opt.step()\r\n")
    edits = [Insert(_statement(module, "opt.step()"), parse_statements("opt.zero_grad()\n"))]
    assert apply_edits(module, edits).code == "for x in xs:\r\n    opt.step()\r\n    opt.zero_grad()\r\n"
