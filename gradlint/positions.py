"""Source positions of nodes, computed one top-level statement at a time, only for the statements that report.

LibCST's ``PositionProvider`` regenerates the whole module while recording a
position for every node, which costs far more than parsing it. A finding
needs the positions of a few nodes only, so :class:`Positions` finds the
top-level statement that holds a node, generates the code of that statement
alone while recording positions, and shifts them by the line the statement
starts on. Those start lines come from Python's own parser (several times
faster than LibCST's, and run only for a module that reports); when it cannot
read the source, the lines of the earlier statements are counted on their code.
"""

from __future__ import annotations

import ast

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, PositionProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState

from gradlint.syntax import TRIVIA, children

# The first-token line of each top-level statement as Python's parser saw it,
# for the module parsed last: ``gradlint.linter.parse`` runs that parser anyway
# (to refuse code nested too deeply for LibCST) and leaves the lines here.
_last_token_lines: tuple[cst.Module, list[int]] | None = None


def remember_token_lines(module: cst.Module, tree: ast.Module) -> None:
    """Keep the lines Python's parser found for the top-level statements of ``module`` (parsed from the same text)."""
    global _last_token_lines
    _last_token_lines = (module, _first_token_lines(tree))


def _first_token_lines(tree: ast.Module) -> list[int]:
    """The line of each top-level statement's first token: its first decorator's, if it has any."""
    return [statement.decorator_list[0].lineno if getattr(statement, "decorator_list", None) else statement.lineno for statement in tree.body]


class Positions:
    """``positions[node]`` is the node's :class:`CodeRange`, as ``PositionProvider`` would give it."""

    def __init__(self, module: cst.Module, text: str | None = None, parents: dict[cst.CSTNode, cst.CSTNode] | None = None) -> None:
        self.module = module
        self.text = text
        self._parents = parents  # each node's parent, when the module index recorded them
        self._statement_of: dict[int, int] = {}  # id(node) -> index of its top-level statement
        self._walked = 0  # top-level statements indexed so far
        self._index_of: dict[int, int] | None = None  # id(top-level statement) -> its index
        self._line_offsets: list[int] | None = None  # lines before each top-level statement
        self._ranges: dict[int, dict[cst.CSTNode, CodeRange]] = {}
        self._whole: dict[cst.CSTNode, CodeRange] | None = None
        # Lines are counted on "\n"; an old Mac "\r" file goes through LibCST whole.
        self._by_statement = module.default_newline in ("\n", "\r\n")

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        index = self._find(node) if self._by_statement else None
        if index is None:
            return self._whole_module()[node]
        ranges = self._ranges.get(index)
        if ranges is None:
            ranges = self._ranges[index] = self._resolve(index)
        code_range = ranges[node]
        offset = self._offsets()[index]
        return CodeRange(
            CodePosition(code_range.start.line + offset, code_range.start.column),
            CodePosition(code_range.end.line + offset, code_range.end.column),
        )

    def _find(self, node: cst.CSTNode) -> int | None:
        """The index of the top-level statement that holds ``node``; None for the module, its header or footer."""
        if self._parents is not None:
            return self._climb(node)
        found = self._statement_of.get(id(node))
        body = self.module.body
        statement_of = self._statement_of
        while found is None and self._walked < len(body):
            index = self._walked
            stack: list[cst.CSTNode] = [body[index]]
            while stack:
                current = stack.pop()
                statement_of[id(current)] = index
                if type(current) not in TRIVIA:  # names and literals are indexed, their whitespace is never reported
                    stack.extend(children(current))
            self._walked += 1
            found = statement_of.get(id(node))
        return found

    def _climb(self, node: cst.CSTNode) -> int | None:
        """The top-level statement of ``node`` found through the parent map: a few steps per node."""
        if self._index_of is None:
            self._index_of = {id(statement): i for i, statement in enumerate(self.module.body)}
        parents, module = self._parents, self.module
        parent = parents.get(node)
        while parent is not None and parent is not module:
            node, parent = parent, parents.get(parent)
        return self._index_of.get(id(node)) if parent is module else None

    def _offsets(self) -> list[int]:
        """How many lines come before each top-level statement (its leading blank lines and comments are its own)."""
        if self._line_offsets is None:
            starts = _statement_starts(self.module, self.text)
            if starts is not None:
                self._line_offsets = [line - 1 for line in starts]
            else:
                module = self.module
                offsets = [sum(module.code_for_node(line).count("\n") for line in module.header)]
                for statement in module.body[:-1]:
                    offsets.append(offsets[-1] + module.code_for_node(statement).count("\n"))
                self._line_offsets = offsets
        return self._line_offsets

    def _resolve(self, index: int) -> dict[cst.CSTNode, CodeRange]:
        """The positions of one top-level statement's nodes, as if it were a module of its own."""
        module = self.module
        alone = module.with_changes(header=(), body=(module.body[index],), footer=(), has_trailing_newline=True)
        return _positions_of(alone)

    def _whole_module(self) -> dict[cst.CSTNode, CodeRange]:
        if self._whole is None:
            self._whole = _positions_of(self.module)
        return self._whole


def _positions_of(module: cst.Module) -> dict[cst.CSTNode, CodeRange]:
    """What ``PositionProvider`` computes for ``module``, without the metadata wrapper's visit of every node."""
    provider = PositionProvider()
    state = PositionProvidingCodegenState(default_indent=module.default_indent, default_newline=module.default_newline, provider=provider)
    module._codegen(state)
    return provider._computed


def _statement_starts(module: cst.Module, text: str | None) -> list[int] | None:
    """The 1-based line each top-level statement's code starts on (leading blank lines and comments included).

    Read from Python's parser: the line of each statement's first token, less
    the lines LibCST keeps in front of it. None without the source, when
    Python cannot read it (LibCST reads newer syntax) or when its statements
    do not pair up with LibCST's.
    """
    if text is None or "\r" in text.replace("\r\n", ""):
        return None  # a lone carriage return is a line break to Python, not to the line count of LibCST's code
    last = _last_token_lines  # one read: another thread may replace it meanwhile
    token_lines = last[1] if last is not None and last[0] is module else None
    if token_lines is None:
        try:
            token_lines = _first_token_lines(ast.parse(text))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
    starts: list[int] = []
    position = 0
    for statement in module.body:
        count = len(statement.body) if isinstance(statement, cst.SimpleStatementLine) else 1
        if position + count > len(token_lines):
            return None
        token_line = token_lines[position]
        position += count
        leading = len(statement.leading_lines)
        decorators = getattr(statement, "decorators", ())
        if decorators:
            leading += len(decorators[0].leading_lines)
        starts.append(token_line - leading)
    if position != len(token_lines):
        return None
    return starts
