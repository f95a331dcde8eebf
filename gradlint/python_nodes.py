"""The nodes of Python's own tree of a file, by type, read in one walk shared by the prefilter and the project index.

Both ask the whole tree for its calls and imports (the project index also for
its functions and assignments). One breadth-first walk, in the order
``ast.walk`` yields nodes, files them by type for the tree read last.
"""

from __future__ import annotations

import ast
from collections import deque

# The tree read last and its nodes by type: one file is read at a time, by the prefilter then the project index.
_last: tuple[ast.AST, dict[type, list[ast.AST]]] | None = None


def nodes_by_type(tree: ast.AST) -> dict[type, list[ast.AST]]:
    """Every node of ``tree`` (itself included) filed by exact type, each list in ``ast.walk``'s order."""
    global _last
    last = _last  # one read: another thread may replace it meanwhile
    if last is not None and last[0] is tree:
        return last[1]
    table: dict[type, list[ast.AST]] = {}
    pending = deque([tree])
    take, extend, node_type = pending.popleft, pending.extend, ast.AST
    while pending:
        node = take()
        kind = type(node)
        found = table.get(kind)
        if found is None:
            table[kind] = [node]
        else:
            found.append(node)
        for name in node._fields:
            value = getattr(node, name, None)
            if type(value) is list:
                extend([item for item in value if isinstance(item, node_type)])
            elif isinstance(value, node_type):
                pending.append(value)
    _last = (tree, table)
    return table
