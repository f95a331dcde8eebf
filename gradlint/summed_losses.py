"""Models whose ``forward`` returns a loss summed over samples or tokens, read from Python's tree of their own file.

A training loop that backpropagates ``loss`` from ``_, loss, metrics = model(x, y)`` cannot see how the model's
``forward`` reduced it. When the model is built from a class of another file of the run (``from valle import VALLE``;
``model = VALLE(...)``), that file tells: a ``forward(self, ..., reduction="sum")`` whose returned ``total_loss`` is
made only of criteria called with ``reduction=reduction`` (or ``reduction="sum"``) sums over tokens, so gradients
accumulated from it over micro-batches are a deliberate sum too (GL004 stays quiet).

:func:`summing_forwards` notes ``Class:position`` for each such class, ``position`` being the loss's place in the
returned tuple (``-1`` when ``forward`` returns the loss alone). Only what is certain counts: every ``return`` gives
one element named as a loss at the same place, every assignment to it in ``forward`` is a sum (criteria reducing by
``"sum"``, literals, factors, the name itself divided by a literal), and any other call, a mean, or a division of the
sum by anything but a literal (``total / num_tokens`` is a mean) makes the class unknown, and nothing is noted.
"""

from __future__ import annotations

import ast
import re

from gradlint.python_nodes import FiledTree

# A criterion that reduces by the mean unless told otherwise: ``F.cross_entropy``, ``nn.functional.mse_loss``, ``nll_loss``.
_CRITERION = re.compile(r"(_loss|Loss|cross_entropy|kl_div|_with_logits|nll)$")
_MEANS = frozenset({"mean", "nanmean", "average"})


def may_sum(text: str) -> bool:
    """Whether ``text`` can define a forward that sums its loss (a cheap test before reading the tree)."""
    return "def forward" in text and "reduction" in text and ("'sum'" in text or '"sum"' in text)


def summing_forwards(tree: FiledTree) -> frozenset[str]:
    """``Class:position`` for each class of the file whose ``forward`` returns a loss summed over samples or tokens."""
    found = set()
    for node in tree.by_type().get(ast.ClassDef, ()):
        forward = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "forward"), None)
        if forward is None:
            continue
        position = _summed_loss_position(forward)
        if position is not None:
            found.add(f"{node.name}:{position}")
    return frozenset(found)


def _summed_loss_position(forward: ast.FunctionDef) -> int | None:
    """Where ``forward`` returns its summed loss, or None when it does not certainly return one."""
    summing = _parameters_defaulting_to_sum(forward)
    own = list(_own_nodes(forward))
    positions, names = set(), set()
    for node in own:
        if isinstance(node, ast.Return):
            if node.value is None:
                return None
            at = _loss_positions(node.value)
            if len(at) != 1:
                return None
            position, name = at[0]
            positions.add(position)
            names.add(name)
    if len(positions) != 1:
        return None
    evidence = False
    for name in names:
        values = [_value_assigned(node, name) for node in own]
        values = [v for v in values if v is not _NOT_ASSIGNED]
        if not values or None in values:
            return None  # never assigned here, or bound in a way not read (unpacked, a loop's target)
        for value in values:
            verdict = _sums(value, name, summing)
            if verdict is None:
                return None
            evidence = evidence or verdict
    return positions.pop() if evidence else None


def _parameters_defaulting_to_sum(function: ast.FunctionDef) -> set[str]:
    args = function.args
    positional = args.posonlyargs + args.args
    pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    return {a.arg for a, d in pairs if isinstance(d, ast.Constant) and d.value == "sum"}


def _loss_positions(value: ast.expr) -> list[tuple[int, str]]:
    """The places of a returned value that hold a name said to be a loss: ``return out, total_loss, metrics``."""
    if isinstance(value, ast.Name):
        return [(-1, value.id)] if "loss" in value.id.lower() else []
    if isinstance(value, ast.Tuple):
        return [(i, e.id) for i, e in enumerate(value.elts) if isinstance(e, ast.Name) and "loss" in e.id.lower()]
    return []


_NOT_ASSIGNED = ast.Pass()


def _value_assigned(node: ast.AST, name: str) -> ast.expr | ast.Pass | None:
    """What ``node`` assigns to ``name``: the value, None when it binds it otherwise (unpacked, a loop's target), or
    ``_NOT_ASSIGNED``."""
    if isinstance(node, ast.Assign):
        if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
        if any(isinstance(n, ast.Name) and n.id == name for t in node.targets for n in ast.walk(t)):
            return None
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name) and node.target.id == name:
        return node.value if node.value is not None else _NOT_ASSIGNED
    elif isinstance(node, (ast.For, ast.AsyncFor, ast.withitem, ast.NamedExpr)):
        target = node.optional_vars if isinstance(node, ast.withitem) else node.target
        if target is not None and any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target)):
            return None
    return _NOT_ASSIGNED


def _sums(value: ast.expr, name: str, summing: set[str]) -> bool | None:
    """Whether one value assigned to the loss is a sum: True with a summing criterion in it, False with none (a
    literal, the name itself scaled by a literal), None when it is not certainly a sum (another call, a mean, the sum
    divided by something not a literal)."""
    evidence = False
    stack: list[ast.AST] = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if not _CRITERION.search(callee) or not _reduces_by_sum(node, summing):
                return None
            evidence = True
            continue  # what the criterion is handed (``logits.view(-1, V)``) does not change how it reduces
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv)):
            holds_sum = any(
                isinstance(n, ast.Call) or (isinstance(n, ast.Name) and n.id == name) for n in ast.walk(node.left)
            )
            if holds_sum and not isinstance(node.right, ast.Constant):
                return None
        elif isinstance(node, ast.Attribute) and node.attr in _MEANS:
            return None
        stack.extend(ast.iter_child_nodes(node))
    return evidence


def _reduces_by_sum(call: ast.Call, summing: set[str]) -> bool:
    for keyword in call.keywords:
        if keyword.arg == "reduction":
            given = keyword.value
            return (isinstance(given, ast.Constant) and given.value == "sum") or (isinstance(given, ast.Name) and given.id in summing)
    return False


def _own_nodes(function: ast.FunctionDef) -> list[ast.AST]:
    """The nodes of a function's own body, nested functions, classes and lambdas left out."""
    found, stack = [], list(function.body)
    while stack:
        node = stack.pop()
        found.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found
