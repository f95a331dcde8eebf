"""Whether gradients read in a loop are this iteration's own (GL024)."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from gradlint.events import EventKind
from gradlint.findings import Severity
from gradlint.model import GRAD_DIVIDE, HANDOFF, LoopModel
from gradlint.queries import header_says_micro_batches, innermost_loop, lies_in
from gradlint.rule import BACKWARD, Report, Rule
from gradlint.syntax import callee_name, dotted_name

# Calls whose result iterates over a module's or an optimizer's parameters.
_PARAMETER_ITERATORS = frozenset({"parameters", "named_parameters"})


class GradientReadWithoutClear(Rule):
    """A loop backpropagates and reads the parameters' gradients on every iteration, and nothing clears them.

    **Why it matters.** ``backward()`` adds into ``.grad``. A loop that
    backpropagates one loss per iteration (one per condition, task, client
    or sample) and reads the parameters' gradients after each backward, to
    weigh the losses by their gradient norms, to rank weights for pruning,
    to estimate a Fisher diagonal, reads the running sum: the second
    iteration's gradients include the first's, and the first includes
    whatever the last training step left. The weights, masks or scores
    computed from them are wrong, and nothing fails.

    **Fix.** Clear before each backward (``model.zero_grad()``), or take the
    gradients without touching ``.grad``:
    ``torch.autograd.grad(loss, params, retain_graph=True)``.

    **Stays quiet when** the loop clears (``zero_grad()``, ``p.grad =
    None``), steps, divides the gradients in place or hands an optimizer to
    code the module cannot see; the gradients read are not those of
    parameters iterated from ``parameters()`` / ``named_parameters()`` (an
    input's gradient, ``x_adv.grad``, belongs to a fresh tensor each
    iteration), or their module is bound anew in the loop (a fresh copy each
    iteration); the loop's header says it runs the micro-batches of one
    accumulation (``for micro_step in range(accum)``: the running sum is
    meant); the read only tests whether a gradient exists (``p.grad is
    None``); or the read comes before the loop's backward.

    **Bad**::

        losses_norm = {}
        for condition, loss in losses.items():
            loss.backward(retain_graph=True)
            grads = torch.cat([p.grad.flatten() for p in model.parameters()])
            losses_norm[condition] = grads.norm()

    **Good**::

        losses_norm = {}
        params = [p for p in model.parameters() if p.requires_grad]
        for condition, loss in losses.items():
            grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            losses_norm[condition] = torch.cat([g.flatten() for g in grads if g is not None]).norm()
    """

    code = "GL024"
    name = "gradient-read-without-clear"
    summary = "a loop backpropagates and reads the parameters' gradients each iteration, and nothing clears them"
    severity = Severity.ERROR
    fix = None  # clear first, or autograd.grad: the author's call
    needs = ((BACKWARD, ".grad", "parameters"),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        reported: set[int] = set()
        for root in model.roots:
            for backward in root.events_of(EventKind.BACKWARD):
                if backward.framework is not None or not backward.loops or backward.call_chain:
                    continue
                loop = innermost_loop(backward)
                if loop is None or type(loop.node) not in (cst.For, cst.While) or header_says_micro_batches(model, loop.node):
                    continue
                kinds = {e.kind for e in root.events_in(loop)}
                if kinds & {EventKind.ZERO, EventKind.STEP, HANDOFF, GRAD_DIVIDE}:
                    continue
                read = _parameter_gradient_read_after(model, loop.node, backward.node)
                if read is None or id(read) in reported:
                    continue
                reported.add(id(read))
                yield Report(
                    read,
                    f"`{model.code(read)}` is read after the backward at line {model.line(backward.node)} on every "
                    f"iteration of the loop at line {model.line(loop.node)}, but nothing clears the gradients in it: "
                    f"each read holds the sum of every earlier iteration's gradients (and whatever was there before the "
                    f"loop); clear before each backward, or take them with `torch.autograd.grad(...)`",
                    event=backward,
                )


def _parameter_gradient_read_after(model: LoopModel, loop: cst.CSTNode, backward: cst.CSTNode) -> cst.Attribute | None:
    """The first ``p.grad`` in the loop's own code, after the backward, where ``p`` is bound by a ``for`` or a
    comprehension over ``....parameters()`` / ``named_parameters()``; not in a test of whether it exists."""
    after = model.position(backward)[:2]
    parents = model.parents or {}
    for node in model.file.walk(loop):
        if type(node) is not cst.Attribute or node.attr.value != "grad" or type(node.value) is not cst.Name:
            continue
        if model.position(node)[:2] <= after or not lies_in(model, node, loop):
            continue
        if _tests_existence(parents, node) or _written(parents, node):
            continue
        owner = _parameters_owner(parents, node, node.value.value)
        if owner is None:
            continue
        parts = owner.split(".")
        if not any(_rebound_in(model, loop, ".".join(parts[:i])) for i in range(1, len(parts) + 1)):
            return node
    return None


def _rebound_in(model: LoopModel, loop: cst.CSTNode, name: str) -> bool:
    """Whether the loop's body binds ``name`` (``m = rpc.rpc_sync(...)``, ``cm = ddp(cm)``; the caller asks for
    each prefix of ``attention.indexer``): a fresh module each iteration, whose gradients start empty."""
    for node in model.file.walk(loop.body):
        if type(node) is cst.Assign and any(_names(t.target, name) for t in node.targets):
            return True
        if type(node) in (cst.AnnAssign, cst.AugAssign) and _names(node.target, name):
            return True
    return False


def _names(target: cst.BaseExpression, name: str) -> bool:
    if type(target) in (cst.Tuple, cst.List):
        return any(_names(e.value, name) for e in target.elements)
    return dotted_name(target) == name


def _tests_existence(parents: dict, node: cst.CSTNode) -> bool:
    """``p.grad is None`` / ``is not None``."""
    parent = parents.get(node)
    return type(parent) is cst.Comparison and any(
        type(c.operator) in (cst.Is, cst.IsNot) and type(c.comparator) is cst.Name and c.comparator.value == "None"
        for c in parent.comparisons
    )


def _written(parents: dict, node: cst.CSTNode) -> bool:
    """``p.grad = ...`` / ``p.grad += ...``: a write, not a read."""
    parent = parents.get(node)
    if type(parent) is cst.AssignTarget:
        return True
    return type(parent) is cst.AugAssign and parent.target is node


def _parameters_owner(parents: dict, node: cst.CSTNode, name: str) -> str | None:
    """The module whose parameters an enclosing ``for`` or comprehension binds ``name`` from (``m`` for ``p in
    m.cpu().parameters()``; ``named_parameters()`` binds it as the second element), or None."""
    current = parents.get(node)
    while current is not None:
        clauses = []
        if type(current) in (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp):
            clause = current.for_in
            while clause is not None:
                clauses.append(clause)
                clause = clause.inner_for_in
        elif type(current) is cst.For:
            clauses.append(current)
        for clause in clauses:
            owner = _owner_binding(clause.target, clause.iter, name)
            if owner is not None:
                return owner
        current = parents.get(current)
    return None


def _owner_binding(target: cst.BaseExpression, iterated: cst.BaseExpression, name: str) -> str | None:
    if type(iterated) is not cst.Call or callee_name(iterated) not in _PARAMETER_ITERATORS:
        return None
    bound = target.value if type(target) is cst.Name else (
        dotted_name(target.elements[1].value) if type(target) is cst.Tuple and len(target.elements) == 2 else None
    )
    if bound != name or type(iterated.func) is not cst.Attribute:
        return None
    owner = iterated.func.value
    while type(owner) is cst.Call and type(owner.func) is cst.Attribute:  # ``m.cpu().parameters()``: ``m``
        owner = owner.func.value
    return dotted_name(owner) or ""
