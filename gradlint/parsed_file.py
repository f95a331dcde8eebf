"""One file's state as it travels down the pipeline: its text, Python's tree, LibCST's module and the node tables.

:func:`gradlint.linter.parse` makes a :class:`ParsedFile`; the module index
(:class:`gradlint.module_index.ModuleIndex`) fills in each node's children
and parent with its one walk; the event builder, positions, the rules and
the fixes read everything from the object handed to them. Nothing is kept
beside it about "the module handled last": a file's data flows one way.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Hashable, Iterator
from typing import TypeVar

import libcst as cst

from gradlint.old_syntax import StandIn
from gradlint.python_nodes import FiledTree
from gradlint.syntax import TRIVIA, calls_in_evaluation_order, children, every_node, walk

T = TypeVar("T")

_UNREAD = object()  # Python's tree not asked for yet


@dataclasses.dataclass(eq=False)
class ParsedFile:
    """One parsed file. ``text`` is None only for a module built without its source (a test's, a fix's)."""

    module: cst.Module
    text: str | None = None
    # The same-length stand-in the module was parsed from instead of the text (:mod:`gradlint.old_syntax`): its
    # positions are the text's, its code is not. None for every file that uses no ``async``/``await`` as names.
    stand_in: StandIn | None = None
    python: dataclasses.InitVar[FiledTree | None] = None
    # Each node's parent (names and literals are children, never parents), as the module index's walk recorded it.
    parents: dict[cst.CSTNode, cst.CSTNode] | None = None
    _python_tree: object = dataclasses.field(default=_UNREAD, init=False, repr=False)
    # The children the module index read for each node, by id (the module holds every node: no id is reused).
    _children: dict[int, list[cst.CSTNode]] = dataclasses.field(default_factory=dict, init=False, repr=False)
    _values: dict[Hashable, object] = dataclasses.field(default_factory=dict, init=False, repr=False)

    def __post_init__(self, python: FiledTree | None) -> None:
        if python is not None:
            self._python_tree = python

    def python_nodes(self) -> FiledTree | None:
        """Python's tree of the source (of its stand-in, for a file read through one), its nodes filed by type on
        first ask: the one the parse made, else parsed now; None if Python cannot read it."""
        tree = self._python_tree
        if tree is _UNREAD:
            tree = self._python_tree = _python_parse(self.code)
        return tree  # type: ignore[return-value]

    def python_tree(self) -> ast.Module | None:
        """Python's tree of the source (:meth:`python_nodes`' tree)."""
        filed = self.python_nodes()
        return filed.tree if filed is not None else None

    @property
    def code(self) -> str:
        """The source text: the file's own, else the module's code."""
        return self.text if self.text is not None else self.module.code

    # -- the node tables the module index fills in

    def note_children(self, table: dict[int, list[cst.CSTNode]]) -> None:
        """Keep the children the module index read for each node (by id): later walks look them up."""
        self._children = table

    def children(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        """A node's children as the module index read them, else read now (a node built after parsing)."""
        found = self._children.get(id(node))
        return found if found is not None else children(node)

    def walk(self, node: cst.CSTNode, *, into_lambdas: bool = False) -> Iterator[cst.CSTNode]:
        """:func:`gradlint.syntax.walk` over this file's nodes."""
        return walk(node, into_lambdas=into_lambdas, children_of=self.children)

    def every_node(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """:func:`gradlint.syntax.every_node` over this file's nodes."""
        return every_node(node, self.children)

    def calls_in_evaluation_order(self, node: cst.CSTNode) -> list[cst.Call]:
        """:func:`gradlint.syntax.calls_in_evaluation_order` over this file's nodes."""
        return calls_in_evaluation_order(node, self.children)

    def parent_map(self) -> dict[cst.CSTNode, cst.CSTNode]:
        """Each node's parent: the module index's map, or walked now for a module no index has read."""
        if self.parents is None:
            table: dict[cst.CSTNode, cst.CSTNode] = {}
            stack: list[cst.CSTNode] = [self.module]
            while stack:
                node = stack.pop()
                for child in self.children(node):
                    table[child] = node
                    if type(child) not in TRIVIA:
                        stack.append(child)
            self.parents = table
        return self.parents

    # -- values computed once per file

    def once(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The value for ``key`` in this file, computed by ``compute()`` the first time it is asked.

        For questions a rule would otherwise answer again for every event
        (the framework settings, the assignments of a scope). Keys name
        their asker: a function, or a tuple that starts with one.
        """
        values = self._values
        if key not in values:
            values[key] = compute()
        return values[key]  # type: ignore[return-value]


def _python_parse(text: str) -> FiledTree | None:
    try:
        return FiledTree(ast.parse(text))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
