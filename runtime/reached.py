"""Which lines of a script ran, at almost no cost: a marker call compiled in front of each watched line.

``sys.settrace`` would answer the same question, but in CPython 3.11 it puts
every frame of the process (torch's Python code included) on the slow tracing
path: about 3x the step time of a small model. Only the lines of static
findings need an answer, so only those get a marker: the script is parsed,
``__gradlint_reached__(line)`` is inserted before the innermost statement that
contains each watched line (with that statement's line number, so tracebacks
are unchanged), and the result is compiled under the script's own file name.
"""

from __future__ import annotations

import ast
from typing import Iterable

MARKER = "__gradlint_reached__"


def _statement_lists(node: ast.AST) -> Iterable[list[ast.stmt]]:
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        value = getattr(node, field, None)
        if isinstance(value, list) and value and all(isinstance(v, ast.stmt) for v in value):
            yield value
        elif isinstance(value, list):
            for item in value:  # except handlers and match cases hold the statements
                if isinstance(item, (ast.excepthandler, ast.match_case)):
                    yield item.body


def _place(statements: list[ast.stmt], line: int, inserts: dict[int, list[tuple[int, int]]]) -> bool:
    """Find the innermost statement containing ``line``; remember (list id, index) -> line."""
    for index, stmt in enumerate(statements):
        end = getattr(stmt, "end_lineno", stmt.lineno) or stmt.lineno
        first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", []))])
        if not first <= line <= end:
            continue
        for inner in _statement_lists(stmt):
            if _place(inner, line, inserts):
                return True
        inserts.setdefault(id(statements), []).append((index, line))
        return True
    return False


def _all_lists(tree: ast.AST) -> dict[int, list[ast.stmt]]:
    found = {}
    for node in ast.walk(tree):
        for statements in _statement_lists(node):
            found[id(statements)] = statements
    return found


def compile_watching(source: bytes, filename: str, lines: Iterable[int]) -> object:
    """Compile ``source`` with a call ``__gradlint_reached__(line)`` in front of each watched line."""
    tree = ast.parse(source, filename)
    inserts: dict[int, list[tuple[int, int]]] = {}
    for line in sorted(set(lines)):
        _place(tree.body, line, inserts)
    lists = _all_lists(tree)
    for key, places in inserts.items():
        statements = lists[key]
        for index, line in sorted(places, reverse=True):
            anchor = statements[index]
            call = ast.Expr(ast.Call(ast.Name(MARKER, ast.Load()), [ast.Constant(line)], []))
            ast.copy_location(call, anchor)
            ast.fix_missing_locations(call)
            for node in ast.walk(call):
                node.lineno, node.end_lineno = anchor.lineno, anchor.lineno
                node.col_offset, node.end_col_offset = anchor.col_offset, anchor.col_offset
            statements.insert(index, call)
    return compile(tree, filename, "exec", dont_inherit=True)
