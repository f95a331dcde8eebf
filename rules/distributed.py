"""Rules about distributed data-parallel training (GL302)."""

from __future__ import annotations

from collections.abc import Iterator

from gradlint.findings import Severity
from gradlint.model import NO_SYNC, Event, LoopModel
from gradlint.objects import ObjKind
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
        ddp = [name for name, info in model.objects.items() if info.kind is ObjKind.DDP_MODEL]
        if not ddp:
            return
        for root in model.roots:
            for step, loop in steps_with_loops(root):
                if NO_SYNC in root.kinds_in(loop):
                    continue
                acc = accumulation(root, step, loop)
                if acc is None:
                    continue
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


def _synced_for_you(backward: Event) -> bool:
    """A backward whose framework decides when to all-reduce (accelerate, Lightning, Fabric, DeepSpeed)."""
    return backward.framework is not None or backward.with_context("no_sync") or backward.with_context("accumulate")


def _where(model: LoopModel, acc) -> str:
    if acc.style == "guard":
        return f"under the accumulation guard at line {model.line(acc.frame.node)}"
    return f"after the micro-batch loop at line {model.line(acc.frame.node)}"
