"""Building the loop model of one parsed module: module index, then events and gradient-release set-ups."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import libcst as cst

from gradlint import frameworks
from gradlint.event_builder import EventBuilder
from gradlint.events import EventKind
from gradlint.model import Event, Frame, FrameKind, LoopModel, Root
from gradlint.module_index import ModuleIndex
from gradlint.parsed_file import ParsedFile
from gradlint.project_index import BackwardHelper, Context, alone_in_its_run, scan_calls
from gradlint.release_setups import find_release
from gradlint.syntax import walk


def build_model(parsed: ParsedFile | cst.Module, context: Iterable[str] | None = None) -> LoopModel:
    """Build the loop model of one parsed file (a bare module stands for a file whose text the caller does not have).

    ``context`` is what the other files of the run say about this one's
    functions (:meth:`gradlint.project_index.ProjectIndex.context_of`): the
    per-batch bodies, each read as one iteration of a loop, and the functions
    a caller unscales gradients around. None: the module alone is the run.
    """
    if type(parsed) is cst.Module:
        parsed = ParsedFile(parsed)
    if context is None:
        context = alone_in_its_run(scan_calls(parsed.code, parsed.python_nodes()))
    known = Context.of(context)
    per_batch = known.per_batch
    index = ModuleIndex(parsed)
    helpers = {fact.split(":", 1)[0]: BackwardHelper.decode(fact.split(":", 1)[1]) for fact in known.backward_helpers}
    builder = EventBuilder(
        index, steps_handed=known.steps_handed, wrapper_classes=known.wraps_optimizer, backward_helpers=helpers,
        grad_readers=known.grad_readers,
    )
    roots = [Root("<module>", parsed.module, builder.root_events(None))]
    iterations = []  # after the others: an event also inlined into a loop of the module is reported from there
    manual = frameworks.per_batch_functions(index)  # a LightningModule's ``training_step`` under manual optimization
    for function in index.functions:
        events = builder.root_events(function)
        caller = manual.get(function) or (_per_batch_caller(function) if function.name.value in per_batch else None)
        if caller is None and _guards_its_own_step(events):
            caller = _micro_batch_caller(function)
        if caller is not None and events:
            events = _as_iteration(events, Frame(FrameKind.LOOP, function, called_by=caller))
            iterations.append(Root(index.qualname[function], function, events))
        else:
            roots.append(Root(index.qualname[function], function, events))
    roots = [r for r in roots + iterations if r.events]
    return LoopModel(
        file=parsed,
        objects=index.objects,
        roots=roots,
        uses_cuda_graphs=index.uses_cuda_graphs,
        release=find_release(index, known.release_helpers),
        index=index,
        called_in_loop=known.called_in_loop,
        unscaled_by_caller=known.unscaled_by_caller,
        wrapped_by_caller=known.wrapped_by_caller,
        returned_wraps=known.returns_wrap,
        summing_models=known.sums_loss,
        keeps_handed=known.keeps_handed,
        handed_scaler=known.handed_scaler,
        clamp_hooks=known.clamp_hooks,
        scaled_dispatch=known.scaled_dispatch,
        ships_at_one=known.ships_at_one,
        device_args=known.device_args,
    )


def _per_batch_caller(function: cst.FunctionDef) -> str:
    return "every loop of the run that calls it does no other gradient work: it is the whole iteration"


def _guards_its_own_step(events: list[Event]) -> bool:
    """Whether a function with no loop of its own backpropagates and then steps under an accumulation guard.

    ``def step(self, loss, step, global_step)`` that runs ``backward()`` and
    steps only ``if (global_step + 1) % self.grad_accum == 0:`` is written to
    be called once per micro-batch: the guard means nothing otherwise. Only a
    guard that tests a remainder counts.
    """
    if any(e.loops for e in events if e.kind is EventKind.BACKWARD):
        return False  # a loop of its own (loops over optimizers or parameters hold no backward)
    for at, step in enumerate(events):
        if step.kind is not EventKind.STEP or step.framework is not None:
            continue
        guards = [f for f in step.frames if f.kind is FrameKind.BRANCH and f.accumulation and _tests_modulo(f.node)]
        if guards and any(
            e.kind is EventKind.BACKWARD and not any(e.inside(g) for g in guards) for e in events[:at]
        ):
            return True
    return False


def _tests_modulo(node: cst.CSTNode) -> bool:
    """Whether an ``if`` tests a remainder (``(step + 1) % accum == 0``): a flag such as ``if take_step:`` says
    nothing about how often the function runs."""
    return type(node) is cst.If and any(
        type(n) is cst.BinaryOperation and type(n.operator) is cst.Modulo for n in walk(node.test)
    )


def _micro_batch_caller(function: cst.FunctionDef) -> str:
    return f"`{function.name.value}` backpropagates and steps under an accumulation guard: it runs once per micro-batch"


def _as_iteration(events: list[Event], loop: Frame) -> list[Event]:
    """A function's events as one iteration of ``loop`` (its caller's loop, or the framework's).

    A backward of a loss the function was handed (``def backward_step(self, loss)``)
    is taken as normalised: the caller may have divided it, and this root does not show.
    """
    function = loop.node
    params = {p.name.value for p in (*function.params.posonly_params, *function.params.params, *function.params.kwonly_params)}
    iteration = []
    for e in events:
        changes: dict = {"frames": (loop,) + e.frames}
        if e.kind is EventKind.BACKWARD and not e.call_chain and type(e.loss) is cst.Name and e.loss.value in params:
            changes["normalised"] = True
        iteration.append(dataclasses.replace(e, **changes))
    return iteration
