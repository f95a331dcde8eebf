"""Edits to a parsed module, and the one transformer that applies them.

A fix is a handful of edits keyed by the *original* nodes of the module the
loop model was built from: replace an expression, remove a statement,
insert statements before or after one. Applying them is a single LibCST
pass, so everything the edits do not touch (formatting, comments, blank
lines) comes out byte for byte as it went in.

A *statement* here is either a small statement (``opt.step()``, ``loss =
f(x)``: what events sit in) or a compound one (a ``for`` loop). Inserting
after a small statement that has its own line adds lines; inserting after
one that shares a line (``loss.backward(); opt.step()``) or sits in a
one-line suite (``if last: opt.step()``) adds small statements right there,
so the new code runs exactly where it was meant to.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence

import libcst as cst

Statement = cst.BaseSmallStatement | cst.BaseCompoundStatement


class CannotApply(Exception):
    """The edits do not fit the code as it is (the fix is skipped, the file left as it was)."""


@dataclasses.dataclass(frozen=True, eq=False)
class Replace:
    """Replace ``node`` by what ``make`` returns for it (``make`` receives the node after inner edits)."""

    node: cst.CSTNode
    make: Callable[[cst.CSTNode], cst.CSTNode]


@dataclasses.dataclass(frozen=True, eq=False)
class Insert:
    """Insert ``statements`` right after (or before) the statement ``anchor``."""

    anchor: Statement
    statements: tuple[cst.BaseStatement, ...]
    before: bool = False


@dataclasses.dataclass(frozen=True, eq=False)
class Remove:
    """Remove the statement ``node`` (a block left empty gets ``pass``)."""

    node: Statement


@dataclasses.dataclass(frozen=True, eq=False)
class AddImport:
    """``from module import names`` (``import module`` when ``names`` is empty) after the leading imports, once."""

    module: str
    names: tuple[str, ...]


Edit = Replace | Insert | Remove | AddImport


@dataclasses.dataclass(frozen=True, eq=False)
class Fix:
    """How to repair one finding: a description and the edits, built from the model when asked.

    ``build`` returns None when the code does not have the shape the fix
    expects; the finding is then reported as usual and nothing is changed.
    """

    description: str
    build: Callable[[], Sequence[Edit] | None]

    def edits(self) -> list[Edit] | None:
        """The edits of this fix on the module it was reported on, or None when it does not apply."""
        return self._built

    @functools.cached_property
    def _built(self) -> list[Edit] | None:
        # Built once: the linter asks whether a fix applies, the fixer then applies it.
        edits = self.build()
        return list(edits) if edits else None


def anchors(edit: Edit) -> list[cst.CSTNode]:
    """The original nodes an edit changes or writes next to (what two fixes must not share)."""
    if isinstance(edit, Replace):
        return [edit.node]
    if isinstance(edit, Insert):
        return [edit.anchor]
    if isinstance(edit, Remove):
        return [edit.node]
    return []


def apply_edits(module: cst.Module, edits: Iterable[Edit]) -> cst.Module:
    """The module with every edit applied; raises :class:`CannotApply` when one does not fit."""
    return module.visit(_EditTransformer(list(edits)))


def as_line(statement: Statement) -> cst.BaseStatement:
    """A statement ready to be inserted elsewhere: a small statement gets its own line."""
    if isinstance(statement, cst.BaseSmallStatement):
        return cst.SimpleStatementLine(body=[statement.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)])
    return statement


def without_blank_lines(statement: cst.BaseStatement) -> cst.BaseStatement:
    """A statement moved elsewhere keeps the comments above it but not the blank lines."""
    leading = [line for line in statement.leading_lines if line.comment is not None]
    return statement.with_changes(leading_lines=leading)


def parse_statements(code: str) -> tuple[cst.BaseStatement, ...]:
    """Statements from source text, one per line of ``code``."""
    return tuple(cst.parse_module(code).body)


class _EditTransformer(cst.CSTTransformer):
    def __init__(self, edits: list[Edit]) -> None:
        super().__init__()
        self.replace: dict[cst.CSTNode, list[Callable]] = {}
        self.after: dict[cst.CSTNode, list[cst.BaseStatement]] = {}
        self.before: dict[cst.CSTNode, list[cst.BaseStatement]] = {}
        self.removed: set[cst.CSTNode] = set()
        self.imports: list[AddImport] = []
        for edit in edits:
            if isinstance(edit, Replace):
                self.replace.setdefault(edit.node, []).append(edit.make)
            elif isinstance(edit, Insert):
                table = self.before if edit.before else self.after
                table.setdefault(edit.anchor, []).extend(edit.statements)
            elif isinstance(edit, Remove):
                self.removed.add(edit.node)
            else:
                self.imports.append(edit)
        self.touched = set(self.after) | set(self.before) | self.removed

    def on_leave(self, original_node, updated_node):
        for make in self.replace.get(original_node, ()):
            updated_node = make(updated_node)
        if type(original_node) in (cst.SimpleStatementLine, cst.SimpleStatementSuite):
            if len(original_node.body) > 1 or type(original_node) is cst.SimpleStatementSuite:
                if any(s in self.touched for s in original_node.body):
                    updated_node = self._small_statements(original_node, updated_node)
        elif type(original_node) in (cst.Module, cst.IndentedBlock):
            updated_node = self._block(original_node, updated_node)
            if type(original_node) is cst.Module and self.imports:
                updated_node = _add_imports(updated_node, self.imports)
        return updated_node

    def _small_statements(self, original, updated):
        """Edits inside a line of several small statements, or a one-line suite."""
        body: list[cst.BaseSmallStatement] = []
        for old, new in zip(original.body, updated.body):
            body.extend(self._flatten(self.before.get(old, ())))
            if old not in self.removed:
                body.append(new)
            body.extend(self._flatten(self.after.get(old, ())))
        if not body:
            if type(original) is cst.SimpleStatementSuite:
                body = [cst.Pass()]
            else:
                return updated  # the whole line goes: the enclosing block drops it
        last = len(body) - 1
        body = [
            s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT if i == last else cst.Semicolon(whitespace_after=cst.SimpleWhitespace(" ")))
            for i, s in enumerate(body)
        ]
        return updated.with_changes(body=body)

    @staticmethod
    def _flatten(statements: Iterable[cst.BaseStatement]) -> list[cst.BaseSmallStatement]:
        small: list[cst.BaseSmallStatement] = []
        for statement in statements:
            if type(statement) is not cst.SimpleStatementLine:
                raise CannotApply("a compound statement cannot be inserted into a one-line statement")
            small.extend(statement.body)
        return small

    def _key(self, statement: cst.BaseStatement) -> cst.CSTNode:
        """A line of one small statement is edited through that statement."""
        if type(statement) is cst.SimpleStatementLine and len(statement.body) == 1:
            return statement.body[0]
        return statement

    def _gone(self, statement: cst.BaseStatement) -> bool:
        if type(statement) is cst.SimpleStatementLine:
            return all(s in self.removed for s in statement.body)
        return statement in self.removed

    def _block(self, original, updated):
        """Insertions and removals among the statements of a module or an indented block."""
        if not any(self._key(s) in self.touched or self._gone(s) for s in original.body):
            return updated
        body: list[cst.BaseStatement] = []
        carried_blank: list[cst.EmptyLine] = []
        removed_first = False
        for position, (old, new) in enumerate(zip(original.body, updated.body)):
            key = self._key(old)
            body.extend(self.before.get(key, ()))
            if self._gone(old):
                # The blank lines that separated the removed statement go to the next one.
                carried_blank = [line for line in old.leading_lines if line.comment is None]
                removed_first = removed_first or position == 0
                continue
            if carried_blank and not any(line.comment is None for line in new.leading_lines):
                new = new.with_changes(leading_lines=[*carried_blank, *new.leading_lines])
            elif removed_first and not body and type(original) is cst.IndentedBlock:
                new = new.with_changes(leading_lines=[line for line in new.leading_lines if line.comment is not None])
            carried_blank, removed_first = [], False
            body.append(new)
            body.extend(self.after.get(key, ()))
        if not body and type(original) is cst.IndentedBlock:
            body = [cst.SimpleStatementLine(body=[cst.Pass()])]
        return updated.with_changes(body=body)


def _add_imports(module: cst.Module, imports: list[AddImport]) -> cst.Module:
    """Put each ``from m import a, b`` after the leading docstring and imports, once."""
    body = list(module.body)
    insert_at = 0
    for index, statement in enumerate(body):
        if _is_docstring(statement) and index == 0:
            insert_at = 1
        elif type(statement) is cst.SimpleStatementLine and all(type(s) in (cst.Import, cst.ImportFrom) for s in statement.body):
            insert_at = index + 1
        else:
            break
    present = _imported_names(module)
    new_lines = []
    for item in imports:
        if not item.names:
            if (item.module, None) not in present:
                present.add((item.module, None))
                new_lines.extend(parse_statements(f"import {item.module}\n"))
            continue
        names = [n for n in item.names if (item.module, n) not in present]
        if names:
            present.update((item.module, n) for n in names)
            new_lines.extend(parse_statements(f"from {item.module} import {', '.join(names)}\n"))
    return module.with_changes(body=[*body[:insert_at], *new_lines, *body[insert_at:]])


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return (
        type(statement) is cst.SimpleStatementLine
        and len(statement.body) == 1
        and type(statement.body[0]) is cst.Expr
        and type(statement.body[0].value) in (cst.SimpleString, cst.ConcatenatedString)
    )


def _imported_names(module: cst.Module) -> set[tuple[str, str | None]]:
    """``(module, name)`` for every top-level ``from module import name``, ``(module, None)`` for ``import module``."""
    found: set[tuple[str, str | None]] = set()
    for statement in module.body:
        if type(statement) is not cst.SimpleStatementLine:
            continue
        for small in statement.body:
            if type(small) is cst.Import:
                found.update((module.code_for_node(a.name), None) for a in small.names if a.asname is None)
            if type(small) is cst.ImportFrom and small.module is not None and type(small.names) is not cst.ImportStar:
                source = module.code_for_node(small.module)
                for alias in small.names:
                    if alias.asname is None:
                        found.add((source, module.code_for_node(alias.name)))
    return found
