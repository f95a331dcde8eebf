"""Reading Python's own tree of a file: its nodes by type, and each node's children.

The prefilter and the project index both ask the whole tree for its calls
and imports (the project index also for its functions and assignments). One
breadth-first walk, in the order ``ast.walk`` yields nodes, files them by
type, once per :class:`FiledTree` (the tree and its table travel together
from the prefilter to the project index). Walks of parts of a tree take a node's children
from :func:`child_nodes`, a list built without ``ast.iter_child_nodes``'
two generators and without the leaves no check reads.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator

# Fields whose nodes are leaves no check reads: an expression's load or store context, an operator.
_LEAF_FIELDS = frozenset({"ctx", "op", "ops"})
_CODE_FIELDS: dict[type, tuple[str, ...]] = {}  # each node type's fields less those


class FiledTree:
    """Python's tree of one file, and its nodes filed by type (:func:`nodes_by_type`) on the first ask."""

    __slots__ = ("tree", "_by_type")

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self._by_type: dict[type, list[ast.AST]] | None = None

    @classmethod
    def of(cls, tree: ast.Module | FiledTree | None) -> FiledTree | None:
        """``tree`` filed (or as it is, when it is filed already); None for None."""
        return tree if tree is None or type(tree) is FiledTree else cls(tree)

    def by_type(self) -> dict[type, list[ast.AST]]:
        """Every node of the tree filed by exact type (computed once)."""
        if self._by_type is None:
            self._by_type = nodes_by_type(self.tree)
        return self._by_type


def nodes_by_type(tree: ast.AST) -> dict[type, list[ast.AST]]:
    """Every node of ``tree`` (itself included) filed by exact type, each list in ``ast.walk``'s order; contexts
    and operators are left out (:data:`_LEAF_FIELDS`)."""
    table: dict[type, list[ast.AST]] = {}
    pending = deque([tree])
    take, extend, node_type = pending.popleft, pending.extend, ast.AST
    code_fields = _CODE_FIELDS
    while pending:
        node = take()
        kind = type(node)
        found = table.get(kind)
        if found is None:
            table[kind] = [node]
        else:
            found.append(node)
        for name in code_fields.get(kind) or _code_fields(kind):
            value = getattr(node, name, None)
            if type(value) is list:
                extend([item for item in value if isinstance(item, node_type)])
            elif isinstance(value, node_type):
                pending.append(value)
    return table


def _code_fields(kind: type) -> tuple[str, ...]:
    """The fields of a node type that may hold code, noted in :data:`_CODE_FIELDS`."""
    fields = _CODE_FIELDS[kind] = tuple(name for name in kind._fields if name not in _LEAF_FIELDS)
    return fields


def child_nodes(node: ast.AST) -> list[ast.AST]:
    """The children of ``node`` in ``ast.iter_child_nodes``' order, less contexts and operators (:data:`_LEAF_FIELDS`)."""
    kind = type(node)
    children: list[ast.AST] = []
    for name in _CODE_FIELDS.get(kind) or _code_fields(kind):
        value = getattr(node, name, None)
        if type(value) is list:
            children.extend([item for item in value if isinstance(item, ast.AST)])
        elif isinstance(value, ast.AST):
            children.append(value)
    return children


def walk(node: ast.AST) -> list[ast.AST]:
    """``node`` and every node below it, less contexts and operators: ``ast.walk`` as a list, for a part of a tree."""
    found = [node]
    for item in found:  # the list grows as it is read: breadth first, as ast.walk
        found.extend(child_nodes(item))
    return found


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a module's or a function's own body: the functions, classes and lambdas defined in it left out."""
    stack = list(getattr(scope, "body", []))
    while stack:
        node = stack.pop()
        if isinstance(node, _SCOPES):
            continue
        yield node
        stack.extend(child_nodes(node))


def last_name(node: ast.AST) -> str | None:
    """``x`` for ``x`` and ``a.b.x``; None for any other expression."""
    if type(node) is ast.Name:
        return node.id
    if type(node) is ast.Attribute:
        return node.attr
    return None
