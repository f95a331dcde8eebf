"""Source positions of nodes, computed one top-level statement at a time.

LibCST's ``PositionProvider`` regenerates the whole module while recording a
position for every node, which costs far more than parsing it. A finding
needs the positions of a few nodes only, so :class:`Positions` finds the
top-level statement that holds a node, resolves the positions of that
statement alone, and shifts them by the lines that come before it (counted
on the plain code of the earlier statements, which is cheap).
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import CodeRange, CodePosition, MetadataWrapper, PositionProvider

from gradlint.syntax import children


class Positions:
    """``positions[node]`` is the node's :class:`CodeRange`, as ``PositionProvider`` would give it."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self._statement_of: dict[int, int] = {}  # id(node) -> index of its top-level statement
        self._walked = 0  # top-level statements indexed so far
        self._line_offsets: list[int] = []  # lines before each top-level statement, as far as computed
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
        offset = self._offset(index)
        return CodeRange(
            CodePosition(code_range.start.line + offset, code_range.start.column),
            CodePosition(code_range.end.line + offset, code_range.end.column),
        )

    def _find(self, node: cst.CSTNode) -> int | None:
        """The index of the top-level statement that holds ``node``; None for the module, its header or footer."""
        found = self._statement_of.get(id(node))
        body = self.module.body
        while found is None and self._walked < len(body):
            index = self._walked
            stack: list[cst.CSTNode] = [body[index]]
            while stack:
                current = stack.pop()
                self._statement_of[id(current)] = index
                stack.extend(children(current))
            self._walked += 1
            found = self._statement_of.get(id(node))
        return found

    def _offset(self, index: int) -> int:
        """How many lines come before top-level statement ``index`` (its leading blank lines and comments are its own)."""
        offsets = self._line_offsets
        if not offsets:
            offsets.append(sum(self.module.code_for_node(line).count("\n") for line in self.module.header))
        while len(offsets) <= index:
            previous = len(offsets) - 1
            offsets.append(offsets[previous] + self.module.code_for_node(self.module.body[previous]).count("\n"))
        return offsets[index]

    def _resolve(self, index: int) -> dict[cst.CSTNode, CodeRange]:
        """The positions of one top-level statement's nodes, as if it were a module of its own."""
        module = self.module
        alone = module.with_changes(header=(), body=(module.body[index],), footer=(), has_trailing_newline=True)
        return MetadataWrapper(alone, unsafe_skip_copy=True).resolve(PositionProvider)

    def _whole_module(self) -> dict[cst.CSTNode, CodeRange]:
        if self._whole is None:
            self._whole = MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(PositionProvider)
        return self._whole
