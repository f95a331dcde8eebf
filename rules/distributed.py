"""Rules about distributed data-parallel training (GL302)."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from gradlint.findings import Severity
from gradlint.model import NO_SYNC, Event, LoopModel, Root
from gradlint.objects import ObjKind, last_name
from gradlint.syntax import dotted_name, walk
from gradlint.queries import accumulation, steps_with_loops
from gradlint.rule import BACKWARD, STEP, Report, Rule


class AccumulationWithoutNoSync(Rule):
    """A ``DistributedDataParallel`` model accumulates gradients but all-reduces them on every micro-batch.

    **Why it matters.** DDP all-reduces the gradients at the end of every
    backward. While accumulating, only the last micro-batch's all-reduce is
    needed; the others send the whole gradient over the network for
    nothing. The result is right, but every micro-batch pays for a full
    all-reduce.

    **Fix.** Run the micro-batches that do not step inside ``model.no_sync()``
    (or set ``model.require_backward_grad_sync = False`` for them; accelerate's
    ``accelerator.accumulate(model)`` and Lightning/Fabric's
    ``no_backward_sync`` do it for you).

    **Stays quiet when**

    - the micro-batches run inside ``no_sync()`` /
      ``require_backward_grad_sync = False``, or a framework syncs
      (accelerate, Lightning, Fabric, a DeepSpeed engine);
    - no DDP model is reachable from the loop's code (the DDP wrapper belongs
      to another function), or the loop forwards through the module the DDP
      model wraps rather than the DDP model itself.

    **Bad**::

        model = DistributedDataParallel(model)
        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()

    **Good**::

        model = DistributedDataParallel(model)
        for i, (x, y) in enumerate(loader):
            boundary = (i + 1) % accum == 0
            with contextlib.nullcontext() if boundary else model.no_sync():
                (loss_fn(model(x), y) / accum).backward()
            if boundary:
                optimizer.step()
                optimizer.zero_grad()
    """

    code = "GL302"
    name = "accumulation-without-no-sync"
    summary = "a DDP model accumulates gradients without no_sync() on the micro-batches that do not step"
    severity = Severity.WARNING
    fix = None  # wrapping the non-stepping micro-batches in no_sync() restructures the loop: left to the author
    needs = ((BACKWARD, STEP, "DistributedDataParallel"),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        every_ddp = [name for name, info in model.objects.items() if info.kind is ObjKind.DDP_MODEL]
        if not every_ddp:
            return
        for root in model.roots:
            ddp = _ddp_models_seen_by(model, root, every_ddp)
            if not ddp:
                continue  # the DDP wrapper belongs to other code: this root's model is not DDP
            for step, loop in steps_with_loops(root):
                if NO_SYNC in root.kinds_in(loop):
                    continue
                acc = accumulation(root, step, loop)
                if acc is None:
                    continue
                if _forwards_around_ddp(model, acc.frame if acc.style == "micro_loop" else loop, ddp):
                    continue  # the micro-batches' forward is not the DDP model's: their backward all-reduces nothing
                for backward in acc.backwards:
                    if _synced_for_you(backward):
                        continue
                    yield Report(
                        backward.node,
                        f"the DDP model `{ddp[0]}` all-reduces the gradients of this backward on every micro-batch, "
                        f"but `{step.target}` only steps {_where(model, acc)}: run the micro-batches that do not step "
                        f"inside `{ddp[0]}.no_sync()` (or set `require_backward_grad_sync = False` for them)",
                    )
                    break


def _ddp_models_seen_by(model: LoopModel, root: Root, every_ddp: list[str]) -> list[str]:
    """The DDP models code in ``root`` can reach: named in its function, assigned at module level, or ``self.`` attributes of its class."""
    index = model.index
    if index is None:
        return every_ddp
    named = {dotted_name(n) for n in walk(root.node) if isinstance(n, (cst.Name, cst.Attribute))}
    method = isinstance(root.node, cst.FunctionDef) and _in_class(index, root.node)
    module_level = index.assignments.get(None, {})
    return [
        name for name in every_ddp
        if name in named or name in module_level or (method and name.startswith("self."))
    ]


def _in_class(index, function: cst.FunctionDef) -> bool:
    while function is not None:
        if index.class_of.get(function):
            return True
        function = index.parent_function.get(function)
    return False


def _forwards_around_ddp(model: LoopModel, loop, ddp: list[str]) -> bool:
    """Whether the loop calls a model other than the DDP ones (the module a DDP model wraps, or a model an optimizer
    trains), and never a DDP model: its backward all-reduces nothing."""
    other_models = {model.info(name).wraps for name in ddp} | {m for sources in model.all_param_sources().values() for m in sources}
    other_models -= {None} | {last_name(name) for name in ddp}
    called = {dotted_name(node.func) for node in walk(loop.node) if isinstance(node, cst.Call)} - {None}
    if {last_name(c) for c in called} & {last_name(name) for name in ddp}:
        return False
    return any(last_name(c) in other_models for c in called)


def _synced_for_you(backward: Event) -> bool:
    """A backward whose framework decides when to all-reduce (accelerate, Lightning, Fabric, DeepSpeed)."""
    return backward.framework is not None or backward.with_context("no_sync") or backward.with_context("accumulate")


def _where(model: LoopModel, acc) -> str:
    if acc.style == "guard":
        return f"under the accumulation guard at line {model.line(acc.frame.node)}"
    return f"after the micro-batch loop at line {model.line(acc.frame.node)}"
