"""Rules about distributed data-parallel training (GL302–GL307, GL309)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

import libcst as cst

from gradlint.events import EventKind
from gradlint.findings import Severity
from gradlint import frameworks
from gradlint.frameworks.framework import Wrap, literal_arguments
from gradlint.frameworks.settings import framework_settings
from gradlint.model import NO_SYNC, Event, Frame, FrameKind, LoopModel, Root
from gradlint.module_index import Unpacked
from gradlint.objects import ObjKind, last_name
from gradlint.parsed_file import ParsedFile
from gradlint.queries import (
    blocks_entering,
    with_holding,
    accumulation,
    accumulation_place,
    counter_and_offset,
    contradicting_settings,
    exclusive,
    frames_inside,
    function_holding,
    lies_in,
    param_sources,
    same_object,
    steps_with_loops,
)
from gradlint.rule import BACKWARD, STEP, Report, Rule
from gradlint.ruled_out import ruled_out
from gradlint.tokens import HANDS_AN_OPTIMIZER
from gradlint.syntax import (
    callee_name, children, dotted_name, keyword_arg, mentions, method_name, number, only_raises_not_implemented, positional_args, receiver,
    walk,
)


# Any call handed an argument named as an optimizer: one of another file of the run may backpropagate the loss it is
# handed too (the project index's ``backs:`` facts).


class AccumulationWithoutNoSync(Rule):
    """A data-parallel model accumulates gradients but all-reduces them on every micro-batch.

    **Why it matters.** ``DistributedDataParallel`` all-reduces the gradients
    at the end of every backward. While accumulating, only the last
    micro-batch's all-reduce is needed; the others send the whole gradient
    over the network for nothing. The result is right, but every micro-batch
    pays for a full all-reduce. The same holds for a model prepared by
    accelerate (``accelerator.prepare`` wraps it in DDP when the script runs
    on several processes, and ``accelerator.backward`` only divides the loss),
    a model set up by Lightning Fabric (its DDP and FSDP strategies), a model
    prepared by Ray Train (``ray.train.torch.prepare_model`` wraps it in DDP or
    FSDP when the run has several workers), and an FSDP2 model (``fully_shard``:
    every backward reduce-scatters). The wrap may be a project's own helper in
    another module (``model = smart_DDP(model)``, a function every ``return``
    of which is a ``DistributedDataParallel(...)``), or a caller in another
    module may hand the wrapped model in; the backward may be a helper's of
    another module handed the loss and the optimizer, which backpropagates on
    every call and steps only when a flag says so (MAE's
    ``loss_scaler(loss, optimizer, update_grad=(i + 1) % accum == 0)``,
    ``fixtures/crossfile/ddp_main_engine_loss_scaler/``).

    **Fix.** Run the micro-batches that do not step inside ``model.no_sync()``
    (or set ``model.require_backward_grad_sync = False`` for them); with
    accelerate, ``accelerator.no_sync(model)`` or ``accelerator.accumulate(model)``
    (with ``gradient_accumulation_steps``); with Fabric,
    ``fabric.no_backward_sync(model, enabled=...)``; with FSDP2,
    ``model.set_requires_gradient_sync(False)`` (FSDP2 then keeps unsharded
    gradients until the step: it trades memory for the communication).

    A script written for accelerate or Fabric is written to be launched on any
    number of processes (``accelerate launch``, ``fabric run``): the all-reduce
    is paid whenever it runs on more than one, so the rule reports it unless
    the script itself pins one device.

    **Stays quiet when**

    - the loop forwards only through the module the wrapper wraps
      (``self.model.module.train_step(batch)``): the wrapper's forward never
      runs and no backward all-reduces (GL309 reports that:
      ``fixtures/realworld/gl309_forward_through_module_under_accumulation__VL-T5.py``);
    - every wrap of the model lies where an earlier ``if ...: raise`` of its
      function has refused the settings it needs (``if args.local_rank != -1
      or args.n_gpu > 1: raise`` above ``if args.local_rank != -1: model =
      DDP(model)``:
      ``fixtures/realworld/ok_gl302_wrap_a_raise_rules_out__private-transformers.py``);
    - the micro-batches run inside ``no_sync()`` / ``no_backward_sync()`` /
      ``require_backward_grad_sync = False`` / ``set_requires_gradient_sync(flag)``
      (``fixtures/distributed/ok_fsdp2_requires_gradient_sync.py``), a
      ``no_sync`` held in a variable and entered later
      (``fixtures/realworld/gl302_no_sync_context_held_in_variable__accelerate.py``),
      or inside ``accelerator.accumulate()``, or the step's guard is
      ``accelerator.sync_gradients`` (accelerate decides); or the backward is
      one whose framework syncs by itself (a DeepSpeed engine, Lightning);
    - a ``with ...no_sync():`` block holds any call that may run the forward:
      DDP decides in the forward
      (``fixtures/realworld/gl302_no_sync_around_forward_only__improved-diffusion.py``);
      a block that holds the backward alone counts too, for a wrapper that reads
      the flag in the backward (FSDP), and for torch's DDP it changes nothing,
      which GL306 reports (one finding for one problem); only a block of nothing
      but data moves and logging covers nothing
      (``fixtures/distributed/gl302_no_sync_covers_nothing.py``), and a
      ``no_sync()`` in an inner loop of its own beside the accumulated
      micro-batches is another model's (``fixtures/distributed/ddp_reference_beside_sharded_optimizer.py``);
    - the loop reaches a prepared model only under ``torch.no_grad()`` (a
      reward model scoring the batch: no backward runs through it), and no
      other wrapped model it calls is known
      (``fixtures/realworld/ok_gl302_reward_model_scored_under_no_grad__HALOs.py``;
      called with gradients on:
      ``fixtures/realworld/gl302_reward_model_trained_with_gradients__HALOs.py``);
    - the backward runs in a ``with`` block of a context manager handed the
      wrapped model that may switch the all-reduce off: one of other code
      (``with misc.ddp_sync(ddp, last_round):``,
      ``fixtures/realworld/gl302_no_sync_in_other_module_context__edm.py``;
      also the contexts such a call makes for the loop to enter, ``for ctx in
      model_forward_contexts(accelerator, model, n): with ctx():``,
      ``fixtures/realworld/gl302_contexts_made_for_the_micro_batches__self-rewarding-lm.py``), or
      one of this module that calls ``no_sync`` (a context of this module that
      does not is no excuse: ``fixtures/distributed/accumulation_in_local_context_without_no_sync.py``);
    - the backward is followed by a step of the optimizer on its own path
      before the accumulated step (a batch retried and stepped at once: its
      gradients are applied, and its all-reduce is needed; the finding goes
      to the accumulated backward:
      ``fixtures/realworld/gl302_retried_batch_stepped_at_once__simpletransformers.py``);
    - the backward is another optimizer's update, cleared before it whenever
      it runs and stepped after it (a discriminator's ``optim_d.zero_grad();
      loss_disc.backward(); optim_d.step()`` beside a generator that
      accumulates; the finding goes to the generator's backward:
      ``fixtures/realworld/gl302_discriminator_update_beside_accumulating_generator__Advanced-RVC.py``);
    - the loop's function asserts that the accumulation count is 1 (``if
      args.distributed: assert args.accumsteps == 1``: the count of the
      guard, or one the micro-batches' loss is divided by), so no micro-batch
      goes without a step where the model is wrapped
      (``fixtures/realworld/ok_gl302_accumulation_asserted_off_under_ddp__P-tuning-v2.py``);
    - no wrapped model is reachable from the loop's code (the wrapper belongs
      to another function, and no caller hands it in), or the loop forwards
      through the module the DDP model wraps rather than the DDP model itself,
      or every wrap of the name runs under the opposite value of a setting
      the backward runs under (``if configs.only_eval: m = DDP(model) else: m
      = FSDP(model)``, trained under ``if not configs.only_eval:``:
      ``fixtures/realworld/gl302_ddp_only_on_the_side_that_never_trains__coconut.py``);
      a model prepared by accelerate or Fabric, or sharded with
      ``fully_shard``, counts only when the loop calls it, itself or in a
      function of the module it calls (a model prepared in a list,
      ``prepared = accelerator.prepare(*components)``, is
      ``prepared[i]``'s element ``i`` of the list literal:
      ``fixtures/realworld/gl302_prepared_through_list_no_sync__pytorch-accelerated.py``);
    - every ``Accelerator`` of the file is given an FSDP, DeepSpeed or
      Megatron-LM plugin (``fixtures/realworld/gl302_accelerator_with_fsdp_plugin__accelerate.py``),
      every ``Fabric`` asks for ``devices=1`` on one node, also when the model it
      set up is handed to another function (``fixtures/frameworks/fabric_accumulation_undivided.py``,
      ``fixtures/frameworks/ok_fabric_one_device_handed_to_fit.py``; ``num_nodes=4`` is four processes:
      ``fixtures/frameworks/gl302_fabric_one_device_on_several_nodes.py``), every Ray Train
      ``ScalingConfig`` of the module asks for one worker, or ``prepare_model`` is asked for no wrap
      (``parallel_strategy=None``; ``fixtures/frameworks/ok_ray_one_worker.py``),
      or the accumulation count is 1 unless read from a DeepSpeed config
      (``fixtures/realworld/gl302_count_from_deepspeed_config__accelerate.py``);
    - ``fully_shard`` is another library's, not torch's
      (``fixtures/realworld/gl302_other_library_fully_shard__Megatron-LM.py``);
    - a loop of the module calls a helper that holds the backward: the
      problem is reported once, at the loop's call when the helper only
      backpropagates, at the backward when the helper also steps (moving its
      call would move the step too;
      ``fixtures/distributed/gl302_step_helper_reported_once.py``), and the
      helper, also read as a function that runs once per micro-batch, adds no
      second finding; a loop that enters ``no_sync()`` around the call covers
      it (``fixtures/distributed/ok_gl302_step_helper_no_sync.py``), and so
      does a decorator of the module that runs what it is handed under the
      wrapped model's ``no_sync()``: it may be installed over the function
      holding the backward
      (``fixtures/realworld/gl103_subclass_overrides_reached_through_inherited_method__PyMarlin.py``).

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
    summary = "a data-parallel model accumulates gradients without no_sync() on the micro-batches that do not step"
    severity = Severity.WARNING
    fix = None  # wrapping the non-stepping micro-batches in no_sync() restructures the loop: left to the author
    # A wrap may be any of several spellings, or in another module (a caller passes the wrapped model in). The backward
    # may be a helper's of another module handed the loss and the optimizer (``loss_scaler(loss, optimizer, ...)``).
    needs = ((BACKWARD, STEP), (BACKWARD, HANDS_AN_OPTIMIZER))

    def check(self, model: LoopModel) -> Iterator[Report]:
        wrapped, scopes = _wrapped_models(model)
        if not wrapped and not model.wrapped_by_caller:
            return
        # The backwards a loop of the module judged through a call, in its micro-batches, of the helper that holds them
        # (reporting at the call, or silenced by a ``no_sync()`` around it): the helper's own root, read as one iteration
        # of a loop (after the module's other roots), would judge them again without what surrounds the call.
        judged_through_a_call: set[int] = set()
        for root in model.roots:
            handed = _handed_in(model, root)
            seen = {**_models_seen_by(model, root, wrapped, scopes), **handed}
            if not seen:
                continue  # the wrapper belongs to other code: this root's model is not data-parallel
            for step, loop in steps_with_loops(root):
                acc = accumulation(root, step, loop)
                if acc is None:
                    continue
                region = acc.frame if acc.style == "micro_loop" else loop
                found = _model_of(model, region, seen, root.node, param_sources(model, step.target or ""))
                if found is None:
                    continue  # the micro-batches' forward is not the wrapped model's: their backward all-reduces nothing
                name, by = found
                judged_through_a_call.update(
                    id(b.node) for b in acc.backwards if b.call_chain and lies_in(model, b.call_chain[0], region.node)
                )
                if _sync_switched_off(model, root, loop, acc):
                    continue
                if _asserted_single(model, loop, region, acc):
                    continue  # ``assert args.accumsteps == 1`` where the model is wrapped: no micro-batch goes without a step
                if _framework_accumulates(root, loop, acc):
                    continue
                if by.quiet_for_count is not None and by.quiet_for_count(model, acc.count):
                    continue  # above 1 only under another engine of the framework, which reduces at its own boundary
                # A backward on the step's own path first: of ``if amp: loss_scaler(...)`` / ``else: loss.backward()``,
                # each step's own branch is where its author adds ``no_sync``.
                for backward in sorted(acc.backwards, key=lambda b: exclusive(b, step)):
                    if not backward.call_chain and id(backward.node) in judged_through_a_call:
                        continue  # judged by the module's loop that calls the helper holding this backward
                    if acc.style == "guard" and backward.inside(acc.frame):
                        continue  # the stepping micro-batch's backward must all-reduce
                    if _synced_for_you(backward) or _in_context_handed(model, backward, name):
                        continue
                    if _no_sync_in_a_wrapper_of_its_call(model, backward, name):
                        continue  # a decorator installed over the backward's function enters no_sync for it
                    if _stepped_on_its_own_path(root, backward, step):
                        continue  # a retried batch's backward, stepped at once: its all-reduce is needed
                    if _another_optimizers_backward(root, backward, step, loop):
                        continue  # ``optim_d.zero_grad(); loss_disc.backward(); ... optim_d.step()``: a GAN's other update
                    sites = _wrap_sites(model, name)
                    if sites and all(contradicting_settings(model, site, backward.node) for site in sites):
                        continue  # ``if only_eval: model = DDP(model) else: model = FSDP(model)``, trained under ``not only_eval``
                    place = _in_loop(model, backward, region)
                    if place is not backward.node and any(call is place for call in step.call_chain):
                        place = backward.node  # the helper also steps: moving its call moves the step (report_site)
                    message = _message(model, name, by, step, acc)
                    if place is not backward.node:
                        message += f"; its backward is at line {model.line(backward.node)}, inside `{model.code(place.func)}`"
                    if name in handed:
                        message += f"; `{name}` is the wrapped model a caller hands `{root.node.name.value}`"
                    yield Report(place, message, event=backward, setting=acc.count)
                    break


def _stepped_on_its_own_path(root: Root, backward: Event, step: Event) -> bool:
    """Whether the optimizer steps after ``backward`` and before ``step`` on a path that runs both (``if loss >
    average: loss.backward(); optimizer.step()`` in a retry loop before the accumulated micro-batch): that backward's
    gradients are applied at once, not accumulated."""
    start, end = root.order(backward), root.order(step)
    return any(
        e.kind is EventKind.STEP and same_object(e.target, step.target) and not exclusive(e, backward)
        for e in root.events[start + 1:end]
    )


def _another_optimizers_backward(root: Root, backward: Event, step: Event, loop: Frame) -> bool:
    """Whether the backward belongs to another optimizer's update: that optimizer is cleared before it whenever it runs
    and stepped after it in the loop (``optim_d.zero_grad(); scaler.scale(loss_disc).backward(); ... optim_d.step()``,
    a discriminator's update beside a generator that accumulates). It is no micro-batch of ``step``'s window, and
    whether its own model's all-reduce is needed is that update's question."""
    at = root.order(backward)
    others = {
        z.target for z in root.events_of(EventKind.ZERO, loop)
        if z.target_kind is ObjKind.OPTIMIZER and z.target is not None and not same_object(z.target, step.target)
        and root.order(z) < at and not exclusive(z, backward) and all(backward.inside(f) for f in frames_inside(z, loop))
    }
    return any(
        s.target in others and root.order(s) > at and not exclusive(s, backward)
        for s in root.events_of(EventKind.STEP, loop)
    )


def _asserted_single(model: LoopModel, loop: Frame, region: Frame, acc) -> bool:
    """Whether the loop's function asserts that the accumulation count is 1 (``assert args.accumsteps == 1``, also
    ``<= 1`` or ``< 2``, under any test: ``if args.distributed:``): the count of the guard, or a count the micro-batch
    loop divides its loss by (``loss / args.accumsteps``). The module rules out accumulating where it asserts it."""
    function = function_holding(model, loop.node)
    if function is None:
        return False
    asserted = {
        model.code(test.left) for node in model.file.walk(function.body) if type(node) is cst.Assert
        for test in [node.test]
        if type(test) is cst.Comparison and len(test.comparisons) == 1 and type(test.comparisons[0].comparator) is cst.Integer
        and (type(test.comparisons[0].operator), test.comparisons[0].comparator.value) in _AT_MOST_ONE
    }
    if not asserted:
        return False
    if acc.count is not None and model.code(acc.count) in asserted:
        return True
    return any(
        type(node) is cst.BinaryOperation and type(node.operator) is cst.Divide and model.code(node.right) in asserted
        or type(node) is cst.AugAssign and type(node.operator) is cst.DivideAssign and model.code(node.value) in asserted
        for node in model.file.walk(region.node)
    )


# ``x == 1``, ``x <= 1``, ``x < 2``: what an assertion that no accumulation happens compares.
_AT_MOST_ONE = frozenset({(cst.Equal, "1"), (cst.LessThanEqual, "1"), (cst.LessThan, "2")})


# What a framework object's ``prepare`` is never handed as a model.
_NOT_MODELS = (ObjKind.OPTIMIZER, ObjKind.SCHEDULER, ObjKind.SCALER, ObjKind.PREPARER, ObjKind.ENGINE)
# The wrap of a data-parallel model whose wrap the module index did not note (the first wrapper class declared).
_SOME_WRAPPER = next(wrap for wrap in frameworks.WRAPS.values() if wrap.constructors)


def _wrapped_models(model: LoopModel) -> tuple[dict[str, Wrap], dict[str, set]]:
    """Every name that holds a data-parallel model and the framework wrap that made it (a wrapper class, a framework
    object's ``prepare``, a sharding function); and, for each name wrapped by an assignment of the module, the
    functions it is assigned in (None: at module level), so that a local of one function is not taken for the same
    name in another."""
    wrapped = {
        name: frameworks.WRAPS.get(info.wrapped_by or "", _SOME_WRAPPER)
        for name, info in model.objects.items() if info.kind is ObjKind.PARALLEL_MODEL
    }
    scopes: dict[str, set] = {}
    index = model.index
    if index is None:
        return wrapped, scopes
    settings = framework_settings(model)
    wrap_calls = _wrapper_constructions(model)
    returned = _returned_by_other_files(model)
    refused: dict[str, bool] = {}  # each name wrapped by an assignment -> whether every such wrap is ruled out
    for function, table in index.assignments.items():
        for name, values in table.items():
            for value in values:
                by = (
                    _constructed(value, wrap_calls) or _wrapped_by(model, function, value, wrap_calls)
                    or (returned.get(_plain_callee(value) or "") if type(value) is cst.Call else None)
                )
                if by is not None:
                    refused[name] = refused.get(name, True) and isinstance(value, cst.CSTNode) and ruled_out(model, value)
                    wrapped.setdefault(name, by)
                    scopes.setdefault(name, set()).add(function)
                    break
    for name in [n for n, never in refused.items() if never]:
        # ``if args.local_rank != -1 or args.n_gpu > 1: raise ...`` above ``if args.local_rank != -1: model = DDP(model)``
        wrapped.pop(name, None)
        scopes.pop(name, None)
    for key, calls in settings.wraps.items():
        wrap = frameworks.WRAPS[key]
        if wrap.function is None:
            continue
        for call in calls:
            args = positional_args(call)
            target = dotted_name(args[0].value) if args else None
            if target is not None:
                wrapped.setdefault(target, wrap)
    idle = {wrap.key for wrap in set(wrapped.values()) if wrap.reduces_nothing is not None and wrap.reduces_nothing(model)}
    if idle:  # ``ScalingConfig(num_workers=1)``, a DeepSpeed plugin the module requires: nothing is all-reduced as DDP does
        wrapped = {name: wrap for name, wrap in wrapped.items() if wrap.key not in idle}
    return wrapped, scopes


def _returned_by_other_files(model: LoopModel) -> dict[str, Wrap]:
    """The functions of other files of the run that return a wrapped model (``smart_DDP(model)`` returning
    ``DistributedDataParallel(...)``: the project index's ``returns:`` facts), and the wrap."""
    found = {}
    for fact in model.returned_wraps:
        function, key = fact.split(":", 1)
        wrap = frameworks.WRAPS.get(key)
        if wrap is not None:
            found[function] = wrap
    return found


def _plain_callee(call: cst.Call) -> str | None:
    """The name of a call's callee when it is a plain name (``smart_DDP(model)``): a function the module imports, not a
    method (the project index notes only calls of names imported so)."""
    return call.func.value if type(call.func) is cst.Name else None


def _wrap_sites(model: LoopModel, name: str) -> list[cst.CSTNode]:
    """The wrapper classes' constructions assigned to ``name`` anywhere in the module (``DDP(model, ...)``)."""
    return _wrap_sites_by_name(model).get(name, [])


def _wrap_sites_by_name(model: LoopModel) -> dict[str, list[cst.CSTNode]]:
    """Every name assigned a wrapper class's construction, with those constructions (read once)."""

    def read() -> dict[str, list[cst.CSTNode]]:
        if model.index is None:
            return {}
        wrap_calls = _wrapper_constructions(model)
        sites: dict[str, list[cst.CSTNode]] = {}
        for table in model.index.assignments.values():
            for name, values in table.items():
                for value in values:
                    if _constructed(value, wrap_calls) is not None:
                        sites.setdefault(name, []).append(value.value if isinstance(value, Unpacked) else value)
        return sites

    return model.file.once((_wrap_sites_by_name,), read)


def _wrapper_constructions(model: LoopModel) -> dict[int, Wrap]:
    """The wrap of each wrapper class's construction in the module (``DistributedDataParallel(model, ...)``), by the
    call's id."""
    settings = framework_settings(model)
    return {
        id(call): wrap for key, calls in settings.wraps.items() if (wrap := frameworks.WRAPS[key]).constructors for call in calls
    }


def _constructed(value, wrap_calls: dict[int, Wrap]) -> Wrap | None:
    """The wrap of a wrapper class's construction assigned (``DistributedDataParallel(model, ...)``), perhaps unpacked
    from a tuple."""
    value = value.value if isinstance(value, Unpacked) else value
    return wrap_calls.get(id(value))


def _wrapped_by(model: LoopModel, function, value, wrap_calls: dict[int, Wrap]) -> Wrap | None:
    """What wrapped the model an assigned value holds: a framework object's ``prepare`` (``accelerator.prepare(model,
    ...)``, ``fabric.setup(model)``), or a helper of the module that returns a wrapper class's construction."""
    position = 0
    if isinstance(value, Unpacked):
        value, position = value.value, value.position
    listed = _prepared_list_item(model, function, value) if type(value) is cst.Subscript else None
    if listed is not None:
        value, given = listed
    elif type(value) is not cst.Call:
        return None
    method = method_name(value)
    wrap = frameworks.PREPARE_METHODS.get(method) if method is not None else None
    if wrap is not None and model.info(dotted_name(receiver(value))).kind is ObjKind.PREPARER:
        if listed is None:
            args = positional_args(value)
            if position >= len(args) or any(a.star for a in args[: position + 1]):
                return None
            given = dotted_name(args[position].value)
        if given is None or model.info(given).kind in _NOT_MODELS:
            return None
        built = _constructors(model, dotted_name(receiver(value)))
        if wrap.quiet_when_built is not None and built and all(wrap.quiet_when_built(literal_arguments(call)) for call in built):
            return None  # ``Fabric(devices=1)``, ``Accelerator(fsdp_plugin=...)``: nothing all-reduces as DDP does
        return wrap
    helper = model.index.resolve_function(value, function) if listed is None else None
    if helper is not None and not isinstance(value, Unpacked):
        return _returns_wrapped(model, helper, wrap_calls)
    return None


def _prepared_list_item(model: LoopModel, function, value: cst.Subscript) -> tuple[cst.Call, str | None] | None:
    """``prepared[i]`` where, in the same function, ``prepared = accelerator.prepare(*components)`` and ``components``
    is a list literal (``[self.model, self.optimizer]``, perhaps appended to later): the call, and the name given at ``i``.

    ``prepare`` returns what it is given in the same order, so element ``i`` is what the literal holds at ``i``.
    """
    elements = value.slice
    if len(elements) != 1 or type(elements[0].slice) is not cst.Index or type(elements[0].slice.value) is not cst.Integer:
        return None
    position = int(number(elements[0].slice.value) or 0)
    table = model.index.assignments.get(function, {})
    calls = table.get(dotted_name(value.value) or "", [])
    if len(calls) != 1 or type(calls[0]) is not cst.Call:
        return None
    args = calls[0].args
    if len(args) != 1 or args[0].star != "*":
        return None
    literals = table.get(dotted_name(args[0].value) or "", [])
    if len(literals) != 1 or type(literals[0]) is not cst.List:
        return None
    items = literals[0].elements
    if position >= len(items) or any(type(item) is cst.StarredElement for item in items[: position + 1]):
        return None
    return calls[0], dotted_name(items[position].value)


def _constructors(model: LoopModel, name: str | None) -> list[cst.Call]:
    """The calls the module assigns to ``name`` (a framework object's constructor), in any function."""
    return [
        value for value in model.index.assigned_anywhere(name)
        if type(value) is cst.Call
    ]


def _returns_wrapped(model: LoopModel, helper: cst.FunctionDef, wrap_calls: dict[int, Wrap]) -> Wrap | None:
    """The wrap of a wrapper class's construction a helper of the module returns (directly or through a name)."""
    built = {}
    for name, values in model.index.assignments.get(helper, {}).items():
        wrap = next((wrap_calls[id(v)] for v in values if id(v) in wrap_calls), None)
        if wrap is not None:
            built[name] = wrap
    for node in model.file.walk(helper.body):
        if type(node) is cst.Return and node.value is not None:
            wrap = wrap_calls.get(id(node.value)) or built.get(dotted_name(node.value))
            if wrap is not None:
                return wrap
    return None


def _names_in(parsed: ParsedFile, scope: cst.CSTNode) -> frozenset[str]:
    """Every dotted name written under ``scope``, one walk per scope and file (the rule asks once per event)."""
    return parsed.once(
        (_names_in, id(scope)),
        lambda: frozenset(dotted_name(n) for n in parsed.walk(scope) if type(n) in (cst.Name, cst.Attribute)),
    )


class _NamesIn:
    """``name in`` the dotted names written under a scope, walked on the first question only."""

    def __init__(self, parsed: ParsedFile, scope: cst.CSTNode) -> None:
        self._file, self._scope = parsed, scope

    def __contains__(self, name: str) -> bool:
        return name in _names_in(self._file, self._scope)


def _models_seen_by(model: LoopModel, root: Root, wrapped: dict[str, Wrap], scopes: dict[str, set]) -> dict[str, Wrap]:
    """The wrapped models code in ``root`` can reach: ``self.`` attributes of its class, a name wrapped in its own
    function (or one it is nested in), or at module level and not a local of its function; a name wrapped where
    the module does not show (a DDP object) when its function names it."""
    index = model.index
    if index is None:
        return wrapped
    named = _NamesIn(model.file, root.node)
    method = type(root.node) is cst.FunctionDef and _in_class(index, root.node)
    module_level = index.assignments.get(None, {})
    function = root.node if type(root.node) is cst.FunctionDef else None
    enclosing = set()
    scope = function
    while scope is not None:
        enclosing.add(scope)
        scope = index.parent_function.get(scope)
    local = set(index.assignments.get(function, {})) | _parameters(function) if function is not None else set()
    seen = {}
    for name, by in wrapped.items():
        if method and name.startswith("self."):
            seen[name] = by
        elif name in scopes:
            where = scopes[name]
            if where & enclosing or (None in where and name not in local and name in named):
                seen[name] = by
            elif function is not None and _returned_by(index, function, name, where):
                seen[name] = by
        elif name in module_level or name in named:
            seen[name] = by
    return seen


def _returned_by(index, function: cst.FunctionDef, name: str, helpers: set) -> bool:
    """``ref_model, ... = make_models(...)``: ``function`` assigns ``name`` from a call of a function that wraps a
    model under the same name."""
    for value in index.assignments.get(function, {}).get(name, ()):
        value = value.value if isinstance(value, Unpacked) else value
        if type(value) is cst.Call and index.resolve_function(value, function) in helpers:
            return True
    return False


def _parameters(function: cst.FunctionDef) -> set[str]:
    params = function.params
    every = (*params.posonly_params, *params.params, *params.kwonly_params)
    extra = [p for p in (params.star_arg, params.star_kwarg) if type(p) is cst.Param]
    return {p.name.value for p in (*every, *extra)}


def _handed_in(model: LoopModel, root: Root) -> dict[str, Wrap]:
    """The parameters of ``root``'s function that a caller of the run hands a data-parallel model
    (``train_one_epoch(model, ...)`` after ``model = DistributedDataParallel(model)`` in another module)."""
    function = root.node
    if not model.wrapped_by_caller or type(function) is not cst.FunctionDef:
        return {}
    positional = [p.name.value for p in (*function.params.posonly_params, *function.params.params)]
    if positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    every = set(positional) | {p.name.value for p in function.params.kwonly_params}
    handed = {}
    for fact in model.wrapped_by_caller:
        name, argument, by = fact.rsplit(":", 2)
        if name != function.name.value:
            continue
        param = positional[int(argument)] if argument.isdigit() and int(argument) < len(positional) else argument
        wrap = frameworks.WRAPS.get(by)
        if param in every and wrap is not None:
            handed.setdefault(param, wrap)
    return handed


def _in_class(index, function: cst.FunctionDef) -> bool:
    return index.method_holding(function) is not None


def _model_of(
    model: LoopModel, region: Frame, seen: dict[str, Wrap], scope: cst.CSTNode, trained: frozenset[str] = frozenset(),
) -> tuple[str, Wrap] | None:
    """The wrapped model whose backward the micro-batches of ``region`` run, and what wrapped it; None when they forward
    through something else.

    Among wrappers the loop calls, the one the stepped optimizer trains (``trained``) is named first: a GAN's
    generator loss runs through both DDP models, but the generator is the one that accumulates.

    A wrapper object (a DDP model) counts unless the loop calls only a model other than the wrapper objects (the
    module one wraps, or a model an optimizer trains); a model prepared by a framework object, or sharded, only when
    the loop calls it, itself or in a function of the module it calls (``self.calculate_train_batch_loss(batch)``).
    """
    home = function_holding(model, region.node)
    called = _called_names(model, region.node, scope if type(scope) is cst.FunctionDef else None)
    called_last = {last_name(c) for c in called | _bound_to(model, called, home)}
    trained_last = {last_name(t) for t in trained}
    mentioned = {dotted_name(n) for n in model.file.walk(region.node) if type(n) in (cst.Name, cst.Attribute)}
    mentioned |= _bound_to(model, mentioned, home)
    wrappers = sorted(
        (name for name, by in seen.items() if by.wrapper_object and not _only_through_module(name, called)),
        # then a model the loop names itself before one only its helpers reach
        key=lambda name: (last_name(name) not in called_last, last_name(name) not in trained_last, name not in mentioned),
    )
    if wrappers and not _forwards_around(model, called_last, wrappers):
        return wrappers[0], seen[wrappers[0]]  # the one the loop calls, if it calls one
    for name, by in seen.items():
        if not by.wrapper_object and last_name(name) in called_last:
            return name, by
    return None


def _only_through_module(wrapper: str, called: set[str]) -> bool:
    """Whether the loop calls the module the wrapper wraps (``self.model.module.train_step(batch)``) and never the
    wrapper itself (``self.model(batch)``; ``self.model.train_step(batch)`` is no call of the wrapper, which has no such
    method, but of the unwrapped model on a run without it): the wrapper's forward never runs, so its backward
    all-reduces nothing (GL309 reports the bypass)."""
    through = any(c.startswith(f"{wrapper}.module.") for c in called)
    return through and not any(c in (wrapper, f"{wrapper}.forward") for c in called)


def _bound_to(model: LoopModel, names: set[str], function: cst.FunctionDef | None) -> set[str]:
    """The models the function binds names to (``model = self.encoder``, then ``model(x)``): the wrapped model runs
    under its local name."""
    table = model.index.assignments.get(function, {}) if model.index is not None and function is not None else {}
    return {
        target for name in names for value in table.get(name, [])
        if type(value) in (cst.Name, cst.Attribute) and (target := dotted_name(value)) is not None
    }


def _called_names(model: LoopModel, node: cst.CSTNode, function: cst.FunctionDef | None) -> set[str]:
    """The dotted names ``node`` calls, and those the functions of the module it calls call, to any depth; not what
    they call under ``torch.no_grad()``, where no backward can reach (a reward model scoring the batch)."""
    called: set[str] = set()
    pending = [(node, function)]
    visited: set[int] = set()
    while pending:
        node, function = pending.pop()
        for call in _calls_with_gradients(model, node):
            name = dotted_name(call.func)
            if name is not None:
                called.add(name)
            helper = model.index.resolve_function(call, function) if model.index is not None else None
            if helper is not None and id(helper) not in visited:
                visited.add(id(helper))
                pending.append((helper.body, helper))
    return called


def _calls_with_gradients(model: LoopModel, node: cst.CSTNode) -> Iterator[cst.Call]:
    """The calls under ``node`` that do not sit in a ``with torch.no_grad():`` (or ``inference_mode``) block."""
    stack = [node]
    while stack:
        node = stack.pop()
        if _switches_gradients_off(node):
            continue
        if type(node) is cst.Call:
            yield node
        stack.extend(model.file.children(node))


def _forwards_around(model: LoopModel, called_last: set[str], wrappers: list[str]) -> bool:
    """Whether the loop calls a model other than the wrapper objects (the module one wraps, or a model an optimizer
    trains), and never a wrapper object: its backward all-reduces nothing."""
    other_models = {model.info(name).wraps for name in wrappers} | {m for sources in model.all_param_sources().values() for m in sources}
    other_models -= {None} | {last_name(name) for name in wrappers}
    if called_last & {last_name(name) for name in wrappers}:
        return False
    return bool(called_last & other_models)


def _sync_switched_off(model: LoopModel, root: Root, loop: Frame, acc) -> bool:
    """Whether the loop switches the all-reduce off where it may cover the accumulated micro-batches: not in an inner
    loop of its own that holds none of them (another model's micro-batches), and not in a block that covers nothing
    (see :func:`_covers`)."""
    first = acc.backwards[0]
    for event in root.events_of(NO_SYNC, loop):
        if any(not first.inside(f) for f in event.loops):
            continue  # an inner loop of its own, beside the micro-batches
        if _covers(model, root, event):
            return True
    return False


def _covers(model: LoopModel, root: Root, event: Event) -> bool:
    """Whether a ``no_sync()`` may cover a micro-batch: its ``with`` block holds a backward, or any call that may run a
    forward (DDP decides in the forward). Only a block of nothing but data moves and logging covers nothing. One
    entered otherwise (an ``ExitStack``, a context held in a variable) and the attribute and method forms
    (``require_backward_grad_sync = flag``) always count."""
    block = with_holding(model, event.node)
    if block is None:
        return True
    if any(f.node is block for backward in root.events_of(EventKind.BACKWARD) for f in backward.frames):
        return True
    for node in walk(block.body):
        if type(node) is cst.Call and callee_name(node) not in _NOT_A_FORWARD:
            return True
    return False


# Calls that move, inspect or log data: a ``no_sync()`` block of nothing else runs no forward.
_NOT_A_FORWARD = frozenset({
    "cuda", "to", "cpu", "pin_memory", "contiguous", "detach", "item", "float", "half", "bfloat16", "long",
    "print", "len", "range", "zip", "enumerate", "isinstance", "format", "log", "debug", "info", "warning",
})


def _framework_accumulates(root: Root, loop: Frame, acc) -> bool:
    """A framework decides the micro-batches: the loop runs its accumulation context (``accelerator.accumulate()``)
    or steps on its sync flag (``sync_gradients``)."""
    guard = acc.frame.node if acc.style == "guard" and type(acc.frame.node) is cst.If else None
    if guard is not None and any(type(n) is cst.Attribute and n.attr.value in frameworks.SYNC_STEP_FLAGS for n in walk(guard.test)):
        return True
    return any(event.with_context("accumulate") for event in root.events_in(loop))


def _no_sync_in_a_wrapper_of_its_call(model: LoopModel, backward: Event, name: str) -> bool:
    """Whether the module enters the wrapped model's ``no_sync()`` in a function nested in another (a decorator's
    wrapper, ``def new_fw_bw(*args, **kwargs): ... with self.trainer_backend.model.no_sync(): fwbw(...)``) that calls
    a function it was handed: the wrapper may be installed over the function holding the backward, where the loop
    cannot see it (PyMarlin's DDP backend decorates its single-process backend's ``_forward_backward`` so)."""
    return last_name(name) in _models_synced_by_decorators(model)


def _models_synced_by_decorators(model: LoopModel) -> frozenset[str]:
    """The last names of the models whose ``no_sync()`` a decorator's wrapper of the module enters (read once)."""

    def read() -> frozenset[str]:
        found: set[str] = set()
        if model.index is None:
            return frozenset()
        for node in model.file.every_node(model.module):
            if type(node) is not cst.Call or callee_name(node) not in frameworks.MODEL_NO_SYNC or type(node.func) is not cst.Attribute:
                continue
            wrapper = function_holding(model, node)
            outer = function_holding(model, wrapper) if wrapper is not None else None
            if wrapper is None or outer is None:
                continue
            handed = {p.name.value for p in outer.params.params}
            if any(type(n) is cst.Call and type(n.func) is cst.Name and n.func.value in handed for n in walk(wrapper)):
                found.add(last_name(dotted_name(node.func.value) or ""))
        return frozenset(found)

    return model.file.once((_models_synced_by_decorators,), read)


def _in_context_handed(model: LoopModel, backward: Event, name: str) -> bool:
    """Whether the backward runs in a ``with`` block of a context manager handed the wrapped model that may switch its
    all-reduce off: ``with misc.ddp_sync(ddp, round_idx == rounds - 1):`` (NVlabs' loops enter ``ddp.no_sync()``
    there), also one of the contexts a call handed the model makes for the loop (``for ctx in
    model_forward_contexts(accelerator, model, n): with ctx():``). One defined in this module counts when it calls
    ``no_sync``; one of other code always may."""
    parents = model.parents
    if parents is None:
        return False
    blocks = []
    for node in (*backward.call_chain, backward.node):
        current = parents.get(node)
        while current is not None and type(current) is not cst.FunctionDef:
            if type(current) is cst.With:
                blocks.append(current)
            current = parents.get(current)
    for block in blocks:
        for item in block.items:
            call = item.item
            if type(call) is cst.Call and type(call.func) is cst.Name:
                # ``for forward_context in model_forward_contexts(accelerator, model, n): with forward_context():``
                made = _iterated_from(parents, block, call.func.value)
                if made is not None and type(made) is cst.Call and _hands(made, name):
                    if model.index is None or model.index.resolve_function(made, None) is None:
                        return True
            if type(call) is not cst.Call or not _hands(call, name):
                continue
            helper = model.index.resolve_function(call, None) if model.index is not None else None
            if helper is None:
                return True
            if any(type(n) is cst.Call and callee_name(n) in frameworks.MODEL_NO_SYNC for n in walk(helper)):
                return True
    return False


def _hands(call: cst.Call, name: str) -> bool:
    """Whether ``call`` is handed the model named ``name`` (by its last name: ``self.model`` or ``model``)."""
    return any(last_name(dotted_name(a.value) or "") == last_name(name) for a in call.args)


def _iterated_from(parents: dict, node: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """What an enclosing ``for`` loop whose target is ``name`` iterates, or None."""
    current = parents.get(node)
    while current is not None and type(current) is not cst.FunctionDef:
        if type(current) is cst.For and type(current.target) is cst.Name and current.target.value == name:
            return current.iter
        current = parents.get(current)
    return None


def _synced_for_you(backward: Event) -> bool:
    """A backward whose framework decides when to all-reduce, or that runs inside ``no_sync()`` / ``accumulate()``."""
    return (
        not frameworks.all_reduces_as_plain(backward)
        or backward.with_context("no_sync")
        or backward.with_context("accumulate")
    )


def _message(model: LoopModel, name: str, by: Wrap, step: Event, acc) -> str:
    """GL302's message in the words of the framework that wrapped ``name``: how to skip its all-reduce."""
    where = f"`{step.target}` only steps {accumulation_place(model, acc)}"
    return frameworks.wrap_in_words(model, name, by).message(name, where)


# Casts that change every floating-point parameter's dtype, and the dtype each gives.
_CASTS = {"half": "float16", "bfloat16": "bfloat16", "double": "float64", "float": "float32"}
_DTYPES = {
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
    "float64": "float64", "double": "float64", "float32": "float32", "float": "float32",
}


@dataclasses.dataclass
class _Site:
    """A call of interest in one function, in program order, with the loops and branches around it."""

    order: int
    call: cst.Call
    loops: tuple[cst.CSTNode, ...]
    branches: tuple[cst.If, ...]


@dataclasses.dataclass
class _Wrap:
    site: _Site
    target: str | None  # the name the DDP model is assigned to
    wrapped: str | None  # the module it wraps


class DdpModelChangedAfterWrap(Rule):
    """A ``DistributedDataParallel`` model is moved to another device or cast after wrapping, or wrapped again and again in the loop.

    **Why it matters.** DDP's documentation says never to change a model's
    parameters after wrapping it: the constructor registers the all-reduce
    hooks on each parameter's gradient accumulator. Moving a parameter to
    another device or casting it to another dtype replaces its data, and
    autograd then gives it a new gradient accumulator
    (``VariableHooks::set_data`` resets it when the device or dtype
    changes): the hooks stay on the old one. ``model.cpu()`` then
    ``model.cuda()``, or ``model.double()`` then ``model.float()``, leaves a
    model that trains but never all-reduces again; each replica drifts on
    its own data, silently. (Measured with torch 2.13 and gloo: after
    ``.double()`` / ``.float()`` on a wrapped model two ranks' parameters
    differ after three steps; without it they are identical.) Wrapping the
    model inside the training loop nests a DDP in a DDP on every pass, or
    leaves the iterations before the wrap unsynchronised.

    **Fix.** Move and cast the model before wrapping it, and wrap it once,
    before the training loop. To evaluate on the CPU, copy the module
    (``copy.deepcopy(model.module).cpu()``) instead of moving it.

    **Bad**::

        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model.cuda(rank), device_ids=[rank])
        for epoch in range(epochs):
            for x, y in loader:
                loss_fn(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
            model.cpu()
            evaluate(model.module, val_loader)
            model.cuda(rank)

    **Good**::

        import copy

        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model.cuda(rank), device_ids=[rank])
        for epoch in range(epochs):
            for x, y in loader:
                loss_fn(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
            evaluate(copy.deepcopy(model.module).cpu(), val_loader)

    **Stays quiet when** the move may keep the device (``.cuda()``,
    ``.to(device)``: only ``.cpu()`` of a model that was visibly put on a GPU
    before wrapping, or given ``device_ids``, is a sure change); the cast is to
    the dtype the model was already cast to before wrapping (``.float()``
    counts only after an earlier cast to another dtype); nothing trains after
    the change (no backward follows it, in the same function or a helper it
    calls, nor runs in a loop around it); the model is wrapped under a
    condition that may hold once (``if epoch == start_epoch:``, ``is None``)
    or wraps ``model.module`` again (re-wrapping after changing the model is
    what DDP asks for).
    """

    code = "GL303"
    name = "ddp-model-changed-after-wrap"
    summary = "a DDP model is moved to another device or cast after wrapping, or wrapped inside the training loop"
    severity = Severity.ERROR
    fix = None  # where to move, cast or wrap depends on the whole script
    # A wrapper class that hooks the parameters' gradient accumulators when it wraps: its name, and a backward.
    needs = tuple((token, BACKWARD) for wrap in frameworks.HOOKED_WRAPS for token in wrap.tokens)

    def check(self, model: LoopModel) -> Iterator[Report]:
        settings = framework_settings(model)
        calls = [call for wrap in frameworks.HOOKED_WRAPS for call in settings.wrap_calls(wrap.key)]
        if not calls:
            return
        hooked = {id(call): wrap for wrap in frameworks.HOOKED_WRAPS for call in settings.wrap_calls(wrap.key)}
        roots = {id(root.node): root for root in model.roots}
        for scope in _scopes_of(model, calls):
            sites = _Sites(model.file, scope, set(hooked))
            if not sites.wraps:
                continue
            trains = _Training(roots.get(id(scope)), sites)
            yield from self._changes(model, sites, trains, hooked)
            yield from self._wraps_in_loop(model, sites, trains)

    def _changes(self, model: LoopModel, sites: "_Sites", trains: "_Training", hooked: dict[int, Wrap]) -> Iterator[Report]:
        for wrap in sites.wraps:
            names = _names_after(wrap)
            before = [s for s in sites.moves if s.order < wrap.site.order and dotted_name(receiver(s.call)) in _names_before(wrap)]
            on_gpu = _on_gpu(wrap.site.call, before)
            casts_before = {_dtype_of(s.call) for s in before} - {None}
            for site in sites.moves:
                if site.order <= wrap.site.order or dotted_name(receiver(site.call)) not in names:
                    continue
                change = _change(site.call, on_gpu, casts_before)
                if change is None or not trains.after(site):
                    continue
                short = hooked[id(wrap.site.call)].short
                yield Report(
                    site.call,
                    f"`{model.code(site.call)}` {change} the {short} model wrapped at line {model.line(wrap.site.call)}: "
                    f"its parameters get new gradient accumulators and {short}'s all-reduce hooks stay on the old ones, so "
                    f"its gradients are no longer all-reduced; move or cast the model before wrapping it",
                )

    def _wraps_in_loop(self, model: LoopModel, sites: "_Sites", trains: "_Training") -> Iterator[Report]:
        for wrap in sites.wraps:
            site = wrap.site
            loop = next((l for l in reversed(site.loops) if trains.in_loop(l)), None)
            if loop is None or wrap.target is None or wrap.target != wrap.wrapped:
                continue  # ``ddp = DDP(model)`` or ``model = DDP(model.module)``: a fresh wrap of the plain module
            inside = [b for b in site.branches if _within(b, loop)]
            if not inside:
                reason = "wraps the already wrapped model again on every iteration"
            elif any(_repeats(b.test) for b in inside):
                reason = "runs on several iterations: each wraps the already wrapped model again"
            elif all(_once_after_start(b.test) for b in inside):
                reason = "runs on one later iteration only: the iterations before it train without synchronising"
            else:
                continue
            yield Report(
                site.call,
                f"`{model.code(site.call)}` inside the training loop at line {model.line(loop)} {reason}; wrap the "
                f"model once, before the loop",
            )


def _scopes_of(model: LoopModel, calls: Iterable[cst.Call]) -> list[cst.CSTNode]:
    """The functions (or the module) whose own code makes these calls, each once, in the order of the calls.

    A call at class level belongs to no function's code, and a call with no
    recorded parent to none either: :class:`_Sites` reads neither.
    """
    if model.index is None:
        return [model.module, *(n for n in walk_all(model.module) if type(n) is cst.FunctionDef)]
    parents = model.index.parents
    scopes: dict[int, cst.CSTNode] = {}
    for call in calls:
        node = parents.get(call)
        while node is not None and type(node) not in _SCOPES:
            node = parents.get(node)
        if node is not None and type(node) is not cst.ClassDef:
            scopes.setdefault(id(node), node)
    return list(scopes.values())


_SCOPES = frozenset({cst.Module, cst.FunctionDef, cst.ClassDef})


def walk_all(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every statement-level node, nested functions and classes included (expressions are not entered)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if not isinstance(current, cst.BaseExpression):
            stack.extend(reversed(children(current)))


class _Sites:
    """The wraps, moves and casts of one function, in program order, with their loops and branches."""

    def __init__(self, parsed: ParsedFile, scope: cst.CSTNode, wrap_calls: set[int]) -> None:
        self._calls_in_order = parsed.calls_in_evaluation_order
        self.wraps: list[_Wrap] = []
        self.moves: list[_Site] = []
        self.order_of: dict[int, int] = {}
        self._wrap_calls = wrap_calls
        self._count = 0
        self._block(scope.body if type(scope) is cst.Module else _suite(scope.body), (), ())

    def _block(self, statements, loops, branches) -> None:
        for statement in statements:
            if type(statement) in (cst.FunctionDef, cst.ClassDef):
                continue
            if isinstance(statement, cst.BaseSmallStatement):  # a one-line suite: ``if last: model.cpu()``
                self._small(statement, loops, branches)
            elif type(statement) is cst.SimpleStatementLine:
                for small in statement.body:
                    self._small(small, loops, branches)
            elif type(statement) is cst.If:
                self._expression(statement.test, loops, branches)
                self._block(_suite(statement.body), loops, branches + (statement,))
                orelse = statement.orelse
                if type(orelse) is cst.If:
                    self._block([orelse], loops, branches + (statement,))
                elif orelse is not None:
                    self._block(_suite(orelse.body), loops, branches + (statement,))
            elif type(statement) in (cst.For, cst.While):
                self._expression(statement.iter if type(statement) is cst.For else statement.test, loops, branches)
                self._block(_suite(statement.body), loops + (statement,), branches)
                if statement.orelse is not None:
                    self._block(_suite(statement.orelse.body), loops, branches)
            elif type(statement) is cst.With:
                for item in statement.items:
                    self._expression(item.item, loops, branches)
                self._block(_suite(statement.body), loops, branches)
            elif type(statement) is cst.Try:
                self._block(_suite(statement.body), loops, branches)
                for handler in statement.handlers:
                    self._block(_suite(handler.body), loops, branches)
                for part in (statement.orelse, statement.finalbody):
                    if part is not None:
                        self._block(_suite(part.body), loops, branches)

    def _small(self, small: cst.BaseSmallStatement, loops, branches) -> None:
        self._expression(small, loops, branches)
        if type(small) is cst.Assign and type(small.value) is cst.Call and id(small.value) in self._wrap_calls:
            wrap = next(w for w in reversed(self.wraps) if w.site.call is small.value)
            wrap.target = dotted_name(small.targets[-1].target)

    def _expression(self, node: cst.CSTNode, loops, branches) -> None:
        for call in self._calls_in_order(node):
            self._count += 1
            self.order_of[id(call)] = self._count
            site = _Site(self._count, call, loops, branches)
            if id(call) in self._wrap_calls:
                args = positional_args(call)
                self.wraps.append(_Wrap(site, None, dotted_name(_unmoved(args[0].value)) if args else None))
            elif type(call.func) is cst.Attribute and call.func.attr.value in ("cpu", "cuda", "to", *_CASTS):
                self.moves.append(site)


def _suite(suite: cst.BaseSuite) -> Sequence[cst.CSTNode]:
    """The statements of an indented block, or the small statements of a one-line suite."""
    return suite.body


class _Training:
    """Where a function trains: the backwards it runs (its own and its helpers'), by order and by loop."""

    def __init__(self, root: Root | None, sites: _Sites) -> None:
        self._orders: list[int] = []
        self._loops: set[int] = set()
        if root is None:
            return
        for event in root.events_of(EventKind.BACKWARD):
            anchor = event.call_chain[0] if event.call_chain else event.node
            order = sites.order_of.get(id(anchor))
            if order is None:
                continue
            self._orders.append(order)
            self._loops.update(id(f.node) for f in event.loops)

    def after(self, site: _Site) -> bool:
        """Whether a backward runs after ``site``: later in the function, or in a loop around it."""
        return any(o > site.order for o in self._orders) or any(id(loop) in self._loops for loop in site.loops)

    def in_loop(self, loop: cst.CSTNode) -> bool:
        return id(loop) in self._loops


def _names_after(wrap: _Wrap) -> set[str]:
    """The names that reach the wrapped parameters after wrapping: the DDP model, its ``.module``, the module itself."""
    names = {n for n in (wrap.target, wrap.wrapped) if n}
    if wrap.target:
        names.add(f"{wrap.target}.module")
    return names


def _names_before(wrap: _Wrap) -> set[str]:
    return {wrap.wrapped} if wrap.wrapped else set()


def _unmoved(node: cst.BaseExpression) -> cst.BaseExpression:
    """``model`` for ``model.cuda(rank)`` / ``model.to(device)``: the module a wrap is given."""
    while type(node) is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value in ("cuda", "to", *_CASTS):
        node = node.func.value
    return node


def _on_gpu(wrap: cst.Call, before: list[_Site]) -> bool:
    """Whether the wrapped model visibly lives on a GPU: ``device_ids``, or ``.cuda()`` / ``.to("cuda...")`` before wrapping."""
    if keyword_arg(wrap, "device_ids") is not None or len(positional_args(wrap)) >= 2:
        return True
    args = positional_args(wrap)
    moved = [args[0].value] if args else []
    moved += [s.call for s in before]
    for node in moved:
        while type(node) is cst.Call and type(node.func) is cst.Attribute:
            if node.func.attr.value == "cuda" or (node.func.attr.value == "to" and _names_cuda(node)):
                return True
            node = node.func.value
    return False


def _names_cuda(call: cst.Call) -> bool:
    """``.to("cuda")``, ``.to(f"cuda:{rank}")``, ``.to(torch.device("cuda", rank))``."""
    for arg in call.args:
        for node in walk(arg.value):
            if type(node) in (cst.SimpleString, cst.FormattedStringText) and "cuda" in node.value:
                return True
    return False


def _dtype_of(call: cst.Call) -> str | None:
    """The dtype a cast gives: ``.half()`` → float16, ``.to(torch.bfloat16)`` → bfloat16."""
    method = call.func.attr.value if type(call.func) is cst.Attribute else None
    if method in _CASTS and not call.args:
        return _CASTS[method]
    if method == "to":
        arg = keyword_arg(call, "dtype") or next(iter(positional_args(call)), None)
        name = dotted_name(arg.value) if arg is not None else None
        if name is not None and name.startswith("torch."):
            return _DTYPES.get(name.rsplit(".", 1)[-1])
    return None


def _change(call: cst.Call, on_gpu: bool, casts_before: set[str]) -> str | None:
    """What a move or cast after wrapping surely changes, in words; None when it may change nothing."""
    method = call.func.attr.value
    if method == "cpu":
        return "moves to the CPU" if on_gpu else None
    dtype = _dtype_of(call)
    if dtype is None or dtype in casts_before:
        return None
    if dtype == "float32" and not casts_before:
        return None  # most models are float32 already
    return f"casts to {dtype}"


def _within(branch: cst.If, loop: cst.CSTNode) -> bool:
    """Whether an ``if`` lies inside ``loop``'s body."""
    return any(n is branch for n in walk_all(loop.body))


def _repeats(test: cst.BaseExpression) -> bool:
    """A test that holds on several iterations: ``>``, ``>=``, ``%``, ``!=``."""
    for node in walk(test):
        if type(node) is cst.BinaryOperation and type(node.operator) is cst.Modulo:
            return True
        if type(node) is cst.Comparison and any(
            type(c.operator) in (cst.GreaterThan, cst.GreaterThanEqual, cst.NotEqual) for c in node.comparisons
        ):
            return True
    return False


def _once_after_start(test: cst.BaseExpression) -> bool:
    """``epoch == 3``: a test that holds once, on an iteration that is visibly not the first."""
    if type(test) is not cst.Comparison or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    value = number(target.comparator)
    return type(target.operator) is cst.Equal and value is not None and value > 0


class GradSyncSetAfterForward(Rule):
    """``require_backward_grad_sync`` is set between a DDP model's forward and its backward: it comes one micro-batch late.

    **Why it matters.** ``DistributedDataParallel`` decides in its forward
    whether the coming backward all-reduces: ``_post_forward`` calls
    ``reducer.prepare_for_backward`` only when ``require_backward_grad_sync``
    is true, and the reducer's gradient hooks do nothing when it was not
    called. Setting the flag after the forward changes nothing for this
    backward; it applies to the next micro-batch. With
    ``model.require_backward_grad_sync = (micro_step == accum - 1)`` written
    after the forward, the first micro-batch of each step all-reduces (the flag
    was left true) and the last one does not: each rank steps on gradients it
    did not share, and the replicas drift apart. (Measured with torch 2.13 and
    gloo on two ranks: set before the forward, the accumulated gradients are
    identical on both ranks; set after it, they differ.)

    **Fix.** Set the flag before the forward of the micro-batch it is meant
    for (or run the micro-batches that do not step inside ``model.no_sync()``,
    forward included).

    **Bad**::

        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[rank])
        for micro_step in range(accum):
            logits, loss = model(x, y)
            model.require_backward_grad_sync = micro_step == accum - 1
            (loss / accum).backward()
        optimizer.step()

    **Good**::

        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[rank])
        for micro_step in range(accum):
            model.require_backward_grad_sync = micro_step == accum - 1
            logits, loss = model(x, y)
            (loss / accum).backward()
        optimizer.step()

    **Stays quiet when** the flag is set before the forward
    (``fixtures/distributed/ok_ddp_require_backward_grad_sync.py``); it is set
    after the backward of its micro-batch, for the next one; the model is
    called again between the flag and the backward, or the flag was also set
    before the forward in the same iteration
    (``fixtures/distributed/ok_grad_sync_set_before_training_forward.py``);
    the only forward before it runs under ``torch.no_grad()`` or
    ``torch.inference_mode()`` (no backward follows it); the loop calls the
    reducer's ``prepare_for_backward`` itself, which is what applies the flag
    after a forward; or the forward is not a call of the object whose flag is
    set (``model.module(x)`` bypasses DDP). A flag set to a literal ``True``
    is not weighed.
    """

    code = "GL304"
    name = "grad-sync-set-after-forward"
    summary = "require_backward_grad_sync is set after the DDP forward it is meant for: it applies to the next one"
    severity = Severity.ERROR
    fix = None  # moving the assignment above the forward is simple, but which forward is meant is the author's call
    needs = tuple((attribute, BACKWARD) for attribute in frameworks.SYNC_FLAGS)

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            for flag in root.events_of(NO_SYNC):
                yield from self._late(model, root, flag)

    def _late(self, model: LoopModel, root: Root, flag: Event) -> Iterator[Report]:
        node = flag.node
        if not (type(node) is cst.Assign and type(node.targets[-1].target) is cst.Attribute):
            return
        target = node.targets[-1].target
        declared = frameworks.SYNC_FLAGS.get(target.attr.value)
        if declared is None or not flag.loops:
            return
        owner = dotted_name(target.value)
        loop = flag.loops[-1]
        at = model.position(_in_loop(model, flag, loop))[:2]
        backward = next(
            (b for b in root.events_of(EventKind.BACKWARD, loop) if root.order(b) > root.order(flag)), None
        )
        if owner is None or backward is None:
            return
        before_backward = model.position(_in_loop(model, backward, loop))[:2]
        forwards = list(_training_forwards(loop.node, owner))
        earlier = sorted((f for f in forwards if model.position(f)[:2] < at), key=lambda f: model.position(f)[:2])
        if not earlier or any(at < model.position(f)[:2] < before_backward for f in forwards):
            return  # no forward before the flag, or the model is called again after it
        if any(model.position(_in_loop(model, e, loop))[:2] < model.position(earlier[-1])[:2] for e in root.events_of(NO_SYNC, loop)
               if e is not flag and _sets_flag_of(e, owner)):
            return  # the flag was set before the forward as well
        if any(type(n) is cst.Call and callee_name(n) == declared.applied_by for n in walk(loop.node)):
            return  # ``model.reducer.prepare_for_backward([])`` after the flag: the loop makes the wrapper apply it now
        forward = earlier[-1]
        yield Report(
            node,
            f"`{model.code(target)}` is set after the forward `{model.code(forward)}` at line {model.line(forward)} "
            f"and before the backward at line {model.line(_in_loop(model, backward, loop))}: {declared.reader} reads the flag in the forward "
            f"(only then does it prepare the all-reduce), so this setting applies to the next micro-batch, and this one "
            f"all-reduces or not as the previous micro-batch's setting said; set it before the forward",
        )


def _in_loop(model: LoopModel, event: Event, loop: Frame) -> cst.CSTNode:
    """Where an event sits in the code of ``loop`` (the loop of the micro-batches), where ``no_sync`` belongs: the
    helper call it was inlined through there (``self.backward_step(loss)``), or its own node when the loop holds it
    directly (a caller's loop around the function that holds the micro-batches adds no finding of its own)."""
    return next((call for call in event.call_chain if lies_in(model, call, loop.node)), event.node)


def _anchor(event: Event) -> cst.CSTNode:
    """Where an event sits in the function being read: the helper call it was inlined through, or its own node."""
    return event.call_chain[0] if event.call_chain else event.node


def _sets_flag_of(event: Event, owner: str) -> bool:
    """Whether a NO_SYNC event is an assignment of ``owner.require_backward_grad_sync``."""
    node = event.node
    if type(node) is not cst.Assign:
        return False
    target = node.targets[-1].target
    return type(target) is cst.Attribute and dotted_name(target.value) == owner


# ``with`` items under which a forward records no graph: DDP prepares no all-reduce for it.
_NO_GRAD = frozenset({"no_grad", "inference_mode"})


def _switches_gradients_off(node: cst.CSTNode) -> bool:
    """``with torch.no_grad():`` (or ``inference_mode``): nothing run in its block records a graph."""
    return type(node) is cst.With and any(
        type(item.item) is cst.Call and callee_name(item.item) in _NO_GRAD for item in node.items
    )


def _training_forwards(loop: cst.CSTNode, owner: str) -> Iterator[cst.Call]:
    """The calls ``owner(...)`` in a loop's body that run with gradients on (not under ``torch.no_grad()``)."""
    stack = [loop.body]
    while stack:
        node = stack.pop()
        if type(node) in (cst.FunctionDef, cst.ClassDef, cst.Lambda):
            continue
        if _switches_gradients_off(node):
            continue
        if type(node) is cst.Call and dotted_name(node.func) == owner:
            yield node
        stack.extend(children(node))


class NoSyncOnSteppingMicroBatch(Rule):
    """The micro-batch that steps runs under ``no_sync()``: its gradients are never all-reduced.

    **Why it matters.** Under gradient accumulation, ``no_sync()`` belongs
    on the micro-batches that do *not* step: DDP keeps their gradients
    local, and the backward of the stepping micro-batch all-reduces the
    whole accumulated sum. Choose ``no_sync`` with a test one micro-batch
    off the step's (``batch_idx % accum != 0`` beside a step under
    ``(batch_idx + 1) % accum == 0``) and the first micro-batch of each
    window all-reduces while the stepping one does not: every rank steps on
    its own gradients, the replicas drift apart, and nothing raises.

    The same when a batch is split into micro-steps by an inner loop and
    the step follows that loop: ``no_sync()`` chosen for the last
    micro-step (``model.no_sync() if i == len(chunks) - 1 else
    nullcontext()``, also through a flag the inner loop assigns, ``last =
    use_ddp and i == len(chunks) - 1``) keeps the gradients of the backward
    right before the step local, while the earlier micro-steps all-reduce.

    **Fix.** Test the no_sync choice with the step's own test:
    ``model.no_sync if (batch_idx + 1) % accum != 0 else nullcontext``, or
    compute the boundary once and use it for both (for micro-steps: no_sync
    on every one but the last).

    **Stays quiet when**

    - the no_sync test and the step's test pick different micro-batches,
      read on the same counter and count (``fixtures/realworld/gl305_no_sync_until_last_micro_batch__FunASR.py``);
    - either test is not a plain ``(counter + a) % count == b`` comparison,
      or the two read different counters or counts (names compared by their
      last part: ``accum_grad`` and ``self.accum_grad`` are one count);
    - the choice of ``no_sync`` is not entered around the loop's backward, or
      it is entered around the backward alone of a DDP model (its forward
      already decided to all-reduce: the ``no_sync()`` changes nothing, GL306).

    **Bad**::

        for batch_idx, batch in enumerate(loader):
            ctx = model.no_sync if batch_idx % accum != 0 else nullcontext
            with ctx():
                (loss_fn(model(batch)) / accum).backward()
            if (batch_idx + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()

    **Good**::

        for batch_idx, batch in enumerate(loader):
            boundary = (batch_idx + 1) % accum == 0
            ctx = nullcontext if boundary else model.no_sync
            with ctx():
                (loss_fn(model(batch)) / accum).backward()
            if boundary:
                optimizer.step()
                optimizer.zero_grad()
    """

    code = "GL305"
    name = "no-sync-on-stepping-micro-batch"
    summary = "no_sync() covers the micro-batch that steps, so the step's gradients are never all-reduced"
    needs = tuple((method, BACKWARD, STEP) for method in sorted(frameworks.MODEL_NO_SYNC))

    def check(self, model: LoopModel) -> Iterator[Report]:
        wrapped: dict[str, Wrap] | None = None
        for root in model.roots:
            for step, loop in steps_with_loops(root):
                stepping = _stepping_residue(step, loop)
                if stepping is None:
                    continue
                for choice in root.events_of(NO_SYNC, loop):
                    chosen = _no_sync_residues(model, choice, loop)
                    if chosen is None or not _entered_around_backward(model, root, choice, loop):
                        continue
                    if wrapped is None:
                        wrapped = _wrapped_models(model)[0]
                    seen = {**wrapped, **_handed_in(model, root)}
                    if _after_forward(model, root, choice, seen, root.events_of(NO_SYNC)) is not None:
                        continue  # the no_sync() changes nothing (GL306): the stepping micro-batch all-reduces anyway
                    covers, (counter, count, residue) = chosen
                    if (counter, count) != stepping[:2]:
                        continue
                    if covers == (residue == stepping[2]) and (covers or abs(residue - stepping[2]) == 1):
                        yield Report(
                            choice.node,
                            f"`{model.code(choice.node)}` puts the micro-batch that steps ({_which(counter, count, stepping[2])}, "
                            f"the step at line {model.line(_anchor(step))}) under no_sync: its backward does not all-reduce, "
                            f"so each rank steps on its own gradients and the replicas drift apart; choose no_sync with "
                            f"the step's own test",
                        )
                        break
        yield from _no_sync_on_last_micro_step(model)


# ``(counter + a) % count == b`` read as (counter, count, b - a): the counter's residue the comparison picks.
_Residue = tuple[str, str, int]


def _modular(test: cst.BaseExpression) -> tuple[bool, _Residue] | None:
    """``(i + a) % n == b`` → (True, (i, n, b - a)); ``!=`` → (False, ...): whether the test holds on that residue
    only, or everywhere but on it. Names are compared by their last part. None for any other test."""
    while type(test) is cst.UnaryOperation and type(test.operator) is cst.Not:
        inner = _modular(test.expression)
        return None if inner is None else (not inner[0], inner[1])
    if type(test) is cst.BinaryOperation and type(test.operator) is cst.Modulo:
        test = cst.Comparison(test, [cst.ComparisonTarget(cst.NotEqual(), cst.Integer("0"))])  # ``if i % n:``
    if type(test) is not cst.Comparison or len(test.comparisons) != 1:
        return None
    operator, right = test.comparisons[0].operator, test.comparisons[0].comparator
    if type(operator) not in (cst.Equal, cst.NotEqual) or type(right) is not cst.Integer:
        return None
    left = test.left
    if type(left) is not cst.BinaryOperation or type(left.operator) is not cst.Modulo:
        return None
    count = dotted_name(left.right)
    counter, offset = counter_and_offset(left.left)
    if count is None or counter is None:
        return None
    return type(operator) is cst.Equal, (last_name(counter), last_name(count), int(right.value) - offset)


def _which(counter: str, count: str, residue: int) -> str:
    """How a message names the micro-batches of one residue."""
    if residue == -1:
        return f"the last of every `{count}` by `{counter}`"
    if residue == 0:
        return f"the first of every `{count}` by `{counter}`"
    return f"`{counter}` ≡ {residue} mod `{count}`"


def _stepping_residue(step: Event, loop: Frame) -> _Residue | None:
    """The residue every step of this optimizer runs on, from the innermost branch around it inside the loop whose test
    is a modular comparison (alone, or one term of an ``and``/``or``); None when there is none."""
    for frame in reversed(frames_inside(step, loop)):
        if frame.kind is not FrameKind.BRANCH or type(frame.node) is not cst.If or frame.branch not in ("if", "else"):
            continue
        for term in _terms(frame.node.test):
            read = _modular(term)
            if read is None:
                continue
            holds, residue = read
            if holds == (frame.branch == "if"):
                return residue
            return None
    return None


def _terms(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The terms of a chain of ``and`` and ``or``, mixed (``a and b or c``), or the test itself: a modular comparison
    that is any one of them decides the residue (:func:`_stepping_residue`)."""
    if type(test) is cst.BooleanOperation:
        return _terms(test.left) + _terms(test.right)
    return [test]


def _no_sync_residues(model: LoopModel, choice: Event, loop: Frame) -> tuple[bool, _Residue] | None:
    """Where a no_sync applies: (True, r) only on residue r, (False, r) everywhere but on r; None when not read.

    ``ctx = model.no_sync if test else other`` (or the other way round), ``with model.no_sync() if test else ...``,
    or a ``with model.no_sync():`` in a branch of ``if test:`` inside the loop.
    """
    node, parents = choice.node, model.parents or {}
    if type(node) is cst.Assign:
        node = node.value
    while node is not None and not isinstance(node, (cst.IfExp, cst.BaseSmallStatement, cst.BaseCompoundStatement)):
        node = parents.get(node)
    if type(node) is cst.Assign:
        node = node.value
    if type(node) is cst.IfExp:
        read = _modular(node.test)
        if read is None:
            return None
        in_body = _no_sync_in_body(node)
        if in_body is None:
            return None
        return (read[0], read[1]) if in_body else (not read[0], read[1])
    for frame in reversed(frames_inside(choice, loop)):
        if frame.kind is FrameKind.BRANCH and type(frame.node) is cst.If and frame.branch in ("if", "else"):
            read = _modular(frame.node.test)
            if read is None:
                return None
            return (read[0], read[1]) if frame.branch == "if" else (not read[0], read[1])
    return None


def _mentions_no_sync(node: cst.CSTNode) -> bool:
    return type(node) is cst.Attribute and node.attr.value in frameworks.NO_SYNC


def _entered_around_backward(model: LoopModel, root: Root, choice: Event, loop: Frame) -> bool:
    """Whether a backward of the loop runs inside the chosen context: in a ``with`` of the loop whose item is the
    no_sync choice itself, or calls the name the choice is assigned to (``with my_context():``)."""
    assigned = _assigned_to(model, choice)
    blocks = [
        node for node in model.file.walk(loop.node) if type(node) is cst.With and any(
            lies_in(model, choice.node, item)
            or (assigned is not None and type(item.item) is cst.Call and dotted_name(item.item.func) == assigned)
            or (assigned is not None and type(item.item) in (cst.Name, cst.Attribute) and dotted_name(item.item) == assigned)
            for item in node.items
        )
    ]
    return any(
        lies_in(model, place, block)
        for backward in root.events_of(EventKind.BACKWARD, loop)
        for place in (*backward.call_chain, backward.node)
        for block in blocks
    )


def _assigned_to(model: LoopModel, choice: Event) -> str | None:
    """The name a no_sync choice is assigned to: ``ctx = model.no_sync`` (the event is the assignment), or
    ``sync_context = model.no_sync() if test else nullcontext()`` (the event is the call inside the value)."""
    node, parents = choice.node, model.parents or {}
    while node is not None and type(node) is not cst.Assign:
        if isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            return None
        node = parents.get(node)
    if node is None or len(node.targets) != 1:
        return None
    return dotted_name(node.targets[0].target)


def _no_sync_on_last_micro_step(model: LoopModel) -> Iterator[Report]:
    """A no_sync chosen only for the last iteration of an inner loop of micro-steps (``no_sync() if i ==
    len(chunks) - 1 else nullcontext()``) whose step runs after that inner loop: the backward right before the step
    keeps its gradients local. Read on ``for i, x in enumerate(seq)`` and ``for i in range(n)`` loops, a test
    ``i == len(seq) - 1`` (or ``i + 1 == n``, ``i >= n - 1``), alone or one term of an ``and``, or a flag the
    inner loop assigns once from one."""
    reported: set[int] = set()
    wrapped: dict[str, Wrap] | None = None
    for root in model.roots:
        for step, loop in steps_with_loops(root):
            for choice in root.events_of(NO_SYNC, loop):
                if id(choice.node) in reported or choice.call_chain:
                    continue  # an inlined choice is reported from the function that makes it
                inner = next((f for f in frames_inside(choice, loop) if f.kind is FrameKind.LOOP), None)
                if inner is None or step.inside(inner) or not root.events_of(EventKind.BACKWARD, inner):
                    continue
                if any(root.order(e) > root.order(step) for e in root.events_in(inner)):
                    continue  # the step does not follow the inner loop
                if not _chosen_for_last_iteration(model, choice, inner):
                    continue
                if not _entered_around_backward(model, root, choice, inner):
                    continue
                if wrapped is None:
                    wrapped = _wrapped_models(model)[0]
                seen = {**wrapped, **_handed_in(model, root)}
                if _after_forward(model, root, choice, seen, root.events_of(NO_SYNC)) is not None:
                    continue  # the no_sync() changes nothing (GL306)
                reported.add(id(choice.node))
                yield Report(
                    choice.node,
                    f"`{model.code(choice.node)}` is chosen for the last micro-step of the loop at line "
                    f"{model.line(inner.node)}, whose backward is the one right before the step at line "
                    f"{model.line(_anchor(step))}: that backward does not all-reduce, so each rank steps on its own "
                    f"gradients and the replicas drift apart, while every earlier micro-step all-reduces; choose "
                    f"no_sync for every micro-step but the last",
                )


def _no_sync_in_body(choice: cst.IfExp) -> bool | None:
    """``no_sync() if test else nullcontext()``: True when the body picks no_sync, False the ``else``, None both or neither."""
    in_body = any(_mentions_no_sync(n) for n in walk(choice.body))
    in_else = any(_mentions_no_sync(n) for n in walk(choice.orelse))
    return None if in_body == in_else else in_body


def _chosen_for_last_iteration(model: LoopModel, choice: Event, inner: Frame) -> bool:
    """Whether the no_sync choice applies on the last iteration of ``inner`` only (the test picks it)."""
    node, parents = choice.node, model.parents or {}
    while node is not None and type(node) is not cst.IfExp:
        if isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            return _branch_for_last_iteration(model, choice, inner)
        node = parents.get(node)
    if node is None:
        return False
    in_body = _no_sync_in_body(node)
    if in_body is None:
        return False
    read = _last_iteration_test(model, node.test, inner)
    return read == "last" if in_body else read == "not_last" and not _is_chain(model, node.test, inner)


def _branch_for_last_iteration(model: LoopModel, choice: Event, inner: Frame) -> bool:
    """``if i == len(seq) - 1: with model.no_sync(): ...`` inside the inner loop."""
    for frame in reversed(frames_inside(choice, inner)):
        if frame.kind is FrameKind.BRANCH and type(frame.node) is cst.If and frame.branch in ("if", "else"):
            read = _last_iteration_test(model, frame.node.test, inner)
            if frame.branch == "if":
                return read == "last"
            return read == "not_last" and not _is_chain(model, frame.node.test, inner)
    return False


def _is_chain(model: LoopModel, test: cst.BaseExpression, inner: Frame) -> bool:
    return type(_flag_value(model, test, inner)) is cst.BooleanOperation


def _flag_value(model: LoopModel, test: cst.BaseExpression, inner: Frame) -> cst.BaseExpression:
    """A flag the inner loop's body assigns once (``last = i == len(seq) - 1``) read as its value; else the test."""
    name = dotted_name(test) if type(test) in (cst.Name, cst.Attribute) else None
    if name is None or type(inner.node) not in (cst.For, cst.While):
        return test
    values = [
        statement.value
        for line in inner.node.body.body if type(line) is cst.SimpleStatementLine
        for statement in line.body
        if type(statement) is cst.Assign and len(statement.targets) == 1 and dotted_name(statement.targets[0].target) == name
    ]
    return values[0] if len(values) == 1 else test


def _last_iteration_test(model: LoopModel, test: cst.BaseExpression, inner: Frame) -> str | None:
    """``"last"`` when the test holds only on the inner loop's last iteration, ``"not_last"`` when it never holds
    there, None when not read. An ``and`` with a term of either kind is of that kind."""
    test = _flag_value(model, test, inner)
    if type(test) is cst.BooleanOperation:
        if type(test.operator) is not cst.And:
            return None
        reads = {_last_iteration_test(model, term, inner) for term in (test.left, test.right)}
        return "last" if "last" in reads and "not_last" not in reads else "not_last" if "not_last" in reads and "last" not in reads else None
    if type(test) is cst.UnaryOperation and type(test.operator) is cst.Not:
        inner_read = _last_iteration_term(model, test.expression, inner)
        return {"last": "not_last", "not_last": "last"}.get(inner_read) if inner_read else None
    return _last_iteration_term(model, test, inner)


def _last_iteration_term(model: LoopModel, term: cst.BaseExpression, inner: Frame) -> str | None:
    """``i == len(seq) - 1`` (``"last"``) or ``i != len(seq) - 1``, ``i < len(seq) - 1`` (``"not_last"``) on the
    inner loop's counter and length."""
    loop = inner.node
    if type(loop) is not cst.For or type(term) is not cst.Comparison or len(term.comparisons) != 1:
        return None
    counter_and_length = _counter_and_length(model, loop)
    if counter_and_length is None:
        return None
    counter, length = counter_and_length
    operator, right = term.comparisons[0].operator, term.comparisons[0].comparator
    left_name, left_offset = counter_and_offset(term.left)
    if left_name != counter:
        return None
    if type(right) is cst.BinaryOperation and type(right.operator) is cst.Subtract and type(right.right) is cst.Integer:
        bound, right_offset = model.code(right.left), int(right.right.value)
    else:
        bound, right_offset = model.code(right), 0
    if bound != length or left_offset + right_offset != 1:
        return None
    kind = type(operator)
    if kind in (cst.Equal, cst.GreaterThanEqual):
        return "last"
    if kind in (cst.NotEqual, cst.LessThan):
        return "not_last"
    return None


def _counter_and_length(model: LoopModel, loop: cst.For) -> tuple[str, str] | None:
    """``for i, x in enumerate(seq)`` → (i, ``len(seq)``); ``for i in range(n)`` → (i, ``n``)."""
    iterator = loop.iter
    if type(iterator) is not cst.Call or not iterator.args:
        return None
    called = dotted_name(iterator.func)
    if called == "enumerate" and len(iterator.args) == 1 and type(loop.target) is cst.Tuple and loop.target.elements:
        counter = dotted_name(loop.target.elements[0].value)
        return (counter, f"len({model.code(iterator.args[0].value)})") if counter else None
    if called == "range" and len(iterator.args) == 1 and type(loop.target) is cst.Name:
        return loop.target.value, model.code(iterator.args[0].value)
    return None


class NoSyncAfterForward(Rule):
    """``no_sync()`` holds only the backward: the DDP forward before it has already armed the all-reduce.

    **Why it matters.** ``DistributedDataParallel`` decides in its forward
    whether the coming backward all-reduces: ``_post_forward`` arms the
    reducer (``prepare_for_backward``) only while
    ``require_backward_grad_sync`` is true, and ``no_sync()`` does nothing
    but set that flag to False for its block and restore it on exit. A
    ``with model.no_sync():`` entered after the forward, around
    ``loss.backward()`` alone, comes too late: the forward already ran with
    the flag on, so the backward all-reduces anyway. Every micro-batch pays a
    full all-reduce that the ``no_sync()`` was written to save, and nothing
    says so (DDP's own docstring: "The forward pass should be included inside
    the context manager, or else gradients will still be synchronized").
    Wrappers that read the flag in the backward (FSDP's ``no_sync()``,
    fairscale's ``ShardedDataParallel``) skip the reduction either way: the
    rule only reports a model wrapped in torch's DDP.

    **Fix.** Enter ``no_sync()`` before the forward, so that its block holds
    the forward and the backward of the micro-batches that do not step.

    **Stays quiet when**

    - the ``no_sync()`` block holds any call that may run a forward (a call of
      the model, or of any function that is not a backward, a loss scaler, an
      optimizer's or a scaler's method, a data move or logging), followed into
      the module's own helpers (``fixtures/distributed/ok_ddp_no_sync_around_forward.py``);
      a helper whose body only raises ``NotImplementedError`` is its
      subclasses' to override, and may run a forward
      (``fixtures/realworld/ok_gl306_gl307_abstract_loss_and_clip_per_strategy__CogKit.py``);
    - the model is not known to be wrapped in torch's DDP (a wrapper of another
      library, FSDP: ``fixtures/distributed/ok_gl306_fsdp_no_sync_around_backward.py``,
      a model whose wrap the module does not show; Ray Train's ``prepare_model``
      counts as DDP unless asked for FSDP:
      ``fixtures/frameworks/ok_gl306_ray_fsdp_no_sync_around_backward.py``; a
      project's helper of another file that returns ``DistributedDataParallel(...)``
      counts as DDP: ``fixtures/crossfile/no_sync_around_backward_in_task/``), or
      the module asks for DDP's Python reducer (``optimize_ddp = "python_reducer"``,
      which reads the flag in the backward);
    - another ``no_sync()`` or ``require_backward_grad_sync = ...`` of the same
      code may cover the forward, or the code forwards through the wrapped
      module (``model.module(x)``), bypassing DDP;
    - the ``no_sync()`` is entered in a way the rule does not follow (an
      ``ExitStack``, a context handed to other code).

    **Bad**::

        model = DistributedDataParallel(model)
        for i, (x, y) in enumerate(loader):
            loss = loss_fn(model(x), y) / accum
            if (i + 1) % accum != 0:
                with model.no_sync():
                    loss.backward()
            else:
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()

    **Good**::

        model = DistributedDataParallel(model)
        for i, (x, y) in enumerate(loader):
            boundary = (i + 1) % accum == 0
            with contextlib.nullcontext() if boundary else model.no_sync():
                loss = loss_fn(model(x), y) / accum
                loss.backward()
            if boundary:
                optimizer.step()
                optimizer.zero_grad()
    """

    code = "GL306"
    name = "no-sync-after-forward"
    summary = "no_sync() holds only the backward: the DDP forward before it already armed the all-reduce"
    severity = Severity.WARNING
    fix = None  # the forward must move into the block: the block's extent is the author's call
    needs = tuple((method, BACKWARD) for method in sorted(frameworks.MODEL_NO_SYNC))

    def check(self, model: LoopModel) -> Iterator[Report]:
        wrapped, _ = _wrapped_models(model)
        reported: set[int] = set()  # the blocks reported: one finding for the ``no_sync()`` calls one ``with`` enters
        for root in model.roots:
            seen = {**wrapped, **_handed_in(model, root)}
            switches = root.events_of(NO_SYNC)
            for event in switches:
                found = _after_forward(model, root, event, seen, switches)
                if found is None or id(found[1]) in reported:
                    continue
                call = event.node
                wrap, block = found
                backward = next(
                    (b for b in root.events_of(EventKind.BACKWARD) if any(lies_in(model, n, block) for n in (*b.call_chain, b.node))),
                    None,
                )
                if backward is None:
                    continue
                reported.add(id(block))
                at = next(n for n in (*backward.call_chain, backward.node) if lies_in(model, n, block))
                entered = f", entered by the `with` at line {model.line(block)}," if model.line(block) != model.line(call) else ""
                yield Report(
                    call,
                    f"`{model.code(call)}`{entered} holds only the backward at line {model.line(at)}, not the forward that built its loss: "
                    f"{wrap.short or 'the wrapper'} decides in the forward whether the coming backward all-reduces ({wrap.forward_decides}), "
                    f"so this backward still all-reduces; `no_sync()` must be entered before the forward and hold the forward and "
                    f"the backward of the micro-batches that do not step",
                )


def _after_forward(
    model: LoopModel, root: Root, event: Event, seen: dict[str, Wrap], switches: list[Event]
) -> tuple[Wrap, cst.With] | None:
    """When a ``no_sync()`` call certainly changes nothing: the model's wrapper decides in the forward, and the
    ``with`` block that enters the call holds a backward and no call that may run a forward, with no other switch of
    the code that may cover the forward; the wrap and the block. None otherwise."""
    call = event.node
    if type(call) is not cst.Call or method_name(call) not in frameworks.MODEL_NO_SYNC:
        return None
    owner = event.target
    wrap = _wrap_named(seen, owner)
    if wrap is None or not _arms_in_forward(model, owner, wrap):
        return None
    if model.text is not None and "python_reducer" in model.text:
        return None  # DDP's Python reducer reads the flag in its backward hooks
    block = _entered_block(model, call)
    if block is None or not _backward_only(model, block, root):
        return None
    if any(other is not event and not _backward_only_switch(model, other, root) for other in switches):
        return None  # another switch of the same code may cover the forward
    if _forwards_around_wrapper(model, root, owner):
        return None
    return wrap, block


def _wrap_named(seen: dict[str, Wrap], owner: str | None) -> Wrap | None:
    """The wrap of the model a ``no_sync()`` is called on: by its name, or by the last part of it."""
    if owner is None:
        return None
    if owner in seen:
        return seen[owner]
    matches = {wrap for name, wrap in seen.items() if last_name(name) == last_name(owner)}
    return matches.pop() if len(matches) == 1 else None


def _arms_in_forward(model: LoopModel, owner: str, wrap: Wrap) -> bool:
    """Whether the model ``owner`` names is one whose wrapper decides in its forward whether the backward all-reduces:
    its wrap says so for some wrapping call the module assigns to it (a model wrapped in DDP on one path and in a
    wrapper of another library on another is DDP on the first), or, for a wrap the module does not show (a model
    handed in, a helper of another file), for the wrap itself whatever its arguments."""
    if wrap.arms_in_forward is None:
        return False
    if model.index is None:
        return wrap.arms_in_forward({})
    calls = [
        value for value in model.index.assigned_anywhere(owner)
        if type(value) is cst.Call and not isinstance(value, Unpacked)
    ]
    settings = framework_settings(model)
    wrap_calls = {id(c) for c in settings.wrap_calls(wrap.key)}
    wrapping = [call for call in calls if id(call) in wrap_calls]
    if not wrapping:
        return wrap.arms_in_forward({})
    return any(wrap.arms_in_forward(literal_arguments(call)) for call in wrapping)


def _entered_block(model: LoopModel, call: cst.Call) -> cst.With | None:
    """The one ``with`` block a ``no_sync()`` call is entered by (:func:`gradlint.queries.blocks_entering`)."""
    blocks = blocks_entering(model, call)
    return blocks[0] if len(blocks) == 1 else None


# Calls that run no forward of a model: backpropagating, loss scaling, the optimizer's and scaler's own methods,
# reductions of the loss, data moves and logging.
_RUNS_NO_FORWARD = frozenset({
    "backward", "scale", "step", "zero_grad", "unscale_", "update", "clip_grad_norm_", "clip_grad_value_",
    "mean", "sum", "div", "mul", "div_", "mul_", "append",
}) | _NOT_A_FORWARD


def _backward_only(model: LoopModel, block: cst.With, root: Root) -> bool:
    """Whether a ``with`` block holds a backward and no call that may run a forward (the module's own helpers it
    calls are read too)."""
    if not any(lies_in(model, n, block) for b in root.events_of(EventKind.BACKWARD) for n in (*b.call_chain, b.node)):
        return False
    quiet = _RUNS_NO_FORWARD | frameworks.BACKWARD_METHODS | frameworks.LOSS_SCALERS
    pending: list[tuple[cst.CSTNode, cst.FunctionDef | None]] = [(block.body, function_holding(model, block))]
    visited: set[int] = set()
    while pending:
        node, function = pending.pop()
        for call in model.file.walk(node):
            if type(call) is not cst.Call:
                continue
            helper = model.index.resolve_function(call, function) if model.index is not None else None
            if helper is not None and only_raises_not_implemented(helper):
                return False  # ``self.compute_loss(batch)`` of a base class: each subclass's override may run a forward
            if helper is not None:
                if id(helper) not in visited:
                    visited.add(id(helper))
                    pending.append((helper.body, helper))
                continue
            if callee_name(call) not in quiet:
                return False
    return True


def _backward_only_switch(model: LoopModel, event: Event, root: Root) -> bool:
    """Whether another switch of the code is a ``no_sync()`` call entered around a backward only as well (so it covers
    no forward either): the same question for each ``no_sync()`` of one ``with`` (ClassyVision enters two)."""
    call = event.node
    if type(call) is not cst.Call or method_name(call) not in frameworks.MODEL_NO_SYNC:
        if type(call) is cst.Assign and _holds_no_sync_of_call(call):
            return True  # ``ctx = model.no_sync() if ... else ...``: the call in it is judged itself
        return False
    block = _entered_block(model, call)
    return block is not None and _backward_only(model, block, root)


def _holds_no_sync_of_call(assign: cst.Assign) -> bool:
    """``ctx = model.no_sync() if ... else ...``: an assignment whose value calls ``no_sync`` (that call is an event too)."""
    return any(type(n) is cst.Call and callee_name(n) in frameworks.MODEL_NO_SYNC for n in walk(assign.value))


def _forwards_around_wrapper(model: LoopModel, root: Root, owner: str) -> bool:
    """Whether the code calls the module the wrapper wraps (``model.module(x)``): its backward is no DDP's."""
    function = root.node if type(root.node) is cst.FunctionDef else None
    return f"{owner}.module" in _called_names(model, root.node, function)


def _wrappers_clip_on_the_other_branch(model: LoopModel, call: cst.Call, owner: str, sharded) -> bool:
    """Whether the plain clip sits in one branch of an ``if`` whose other branch clips with the wrapper's own method on
    the same model (``if strategy != "DDP": model.clip_grad_norm_(...) else: torch.nn.utils.clip_grad_norm_(...)``),
    or after an ``if`` that clips so and returns (``if self.fsdp: return self.policy.clip_grad_norm_(...)``, then the
    plain clip): the code picks the clip by how the model is wrapped."""
    parents = model.parents or {}

    def wrappers_clip(node: cst.CSTNode) -> bool:
        return any(
            type(n) is cst.Call and method_name(n) == sharded.clip_method and type(n.func) is cst.Attribute
            and dotted_name(n.func.value) == owner
            for n in walk(node)
        )

    child, current = call, parents.get(call)
    while current is not None and type(current) is not cst.FunctionDef:
        if type(current) is cst.If and child is not current.test:
            other = current.orelse if child is current.body else current.body
            if other is not None and wrappers_clip(other):
                return True
        if type(current) is cst.IndentedBlock and child in current.body:
            earlier = current.body[: current.body.index(child)]
            if any(type(s) is cst.If and s.orelse is None and _ends_in_return(s.body) and wrappers_clip(s.body) for s in earlier):
                return True
        child, current = current, parents.get(current)
    return False


def _ends_in_return(block: cst.BaseSuite) -> bool:
    """Whether a suite's last statement is a ``return``."""
    last = block.body[-1] if block.body else None
    if type(last) is cst.SimpleStatementLine:
        last = last.body[-1] if last.body else None
    return type(last) is cst.Return


def _class_tokens(sharded) -> tuple[str, ...]:
    """The prefilter tokens of a sharded wrapper: its class names (``FullyShardedDataParallel``)."""
    return tuple(sorted({name.rsplit(".", 1)[-1] for name in sharded.constructors}))


class NormClippedOnShards(Rule):
    """A plain norm-clipping function is handed the parameters of a model whose ranks each hold a shard of every gradient.

    **Why it matters.** FSDP (``FullyShardedDataParallel``) with a sharded
    strategy (``FULL_SHARD``, its default, ``SHARD_GRAD_OP``, the hybrid
    ones) leaves each rank only its own shard of every gradient after the
    backward. ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)``
    then measures the norm of this rank's shard alone and scales each shard
    by its own factor: the update is no longer a clipped gradient, it
    differs from rank to rank in scale, and the norm it returns (and logs)
    is not the model's. FSDP's own ``model.clip_grad_norm_(max_norm)``
    reduces the norm over the ranks first. The wrap is read where the model
    is assigned, or in the module's helper that returns it (``self.model =
    do_fsdp(self.model)``, a helper that returns the model unwrapped on one
    GPU and ``FullyShardedDataParallel(model)`` otherwise).

    **Fix.** Call the wrapper's method: ``model.clip_grad_norm_(max_norm)``.

    **Stays quiet when**

    - the plain clip sits in one branch of an ``if`` whose other branch clips
      the same model with the wrapper's own ``clip_grad_norm_`` (the code picks
      the clip by strategy:
      ``fixtures/realworld/ok_gl306_gl307_abstract_loss_and_clip_per_strategy__CogKit.py``),
      or after an ``if`` that clips so and returns (``if self.fsdp: return
      self.policy.clip_grad_norm_(...)``:
      ``fixtures/realworld/ok_gl307_wrapper_clip_returned_first__HALOs.py``);
    - the model was wrapped with ``sharding_strategy=ShardingStrategy.NO_SHARD``
      (or a variable assigned nothing else): whole gradients on every rank;
    - the model was sharded with FSDP2's ``fully_shard``: its gradients are
      ``DTensor``s, whose norm ``clip_grad_norm_`` reduces over the ranks;
    - the clip is the wrapper's own method, or clips by value (element by
      element, the same on a shard as on the whole);
    - the model is wrapped in a subclass that overrides the method holding
      the clip (``FSDPTrainer(BasicTrainer)`` wraps ``self.policy`` and
      clips with ``self.policy.clip_grad_norm_``): the base class's clip
      never runs on the shards.

    **Bad**::

        model = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD)
        for batch in loader:
            model(**batch).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()

    **Good**::

        model = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD)
        for batch in loader:
            model(**batch).loss.backward()
            model.clip_grad_norm_(1.0)
            optimizer.step()
            optimizer.zero_grad()
    """

    code = "GL307"
    name = "norm-clipped-on-shards"
    summary = "a plain clip_grad_norm_ over a sharded model's parameters: each rank clips its shard by its own norm"
    severity = Severity.ERROR
    fix = None
    needs = tuple(("clip_grad_norm", token) for sharded in frameworks.SHARDED_GRADS for token in _class_tokens(sharded))

    def check(self, model: LoopModel) -> Iterator[Report]:
        index = model.index
        if index is None:
            return
        reported: set[int] = set()
        for root in model.roots:
            for clip in root.events_of(EventKind.CLIP):
                call = clip.node
                if type(call) is not cst.Call or id(call) in reported:
                    continue
                qualified = index.qualified_names(call.func)
                for sharded in frameworks.SHARDED_GRADS:
                    if not qualified & sharded.norm_clips:
                        continue
                    owner = _parameters_owner(call)
                    found = _sharded_wrap(model, call, owner, sharded) if owner is not None else None
                    if found is None or _wrappers_clip_on_the_other_branch(model, call, owner, sharded):
                        continue
                    reported.add(id(call))
                    wrap, strategy = found
                    yield Report(
                        call,
                        f"`{owner}` is wrapped by {sharded.short} at line {model.line(wrap)} ({strategy}), so each rank "
                        f"holds only a shard of every gradient: `{model.code(call.func)}` takes this rank's norm and "
                        f"clips each shard by its own factor; call `{owner}.{sharded.clip_method}(...)`, which reduces "
                        f"the norm over the ranks",
                        event=clip,
                    )
                    break


def _parameters_owner(call: cst.Call) -> str | None:
    """``model`` for a clip handed ``model.parameters()`` (first argument or ``parameters=``)."""
    args = positional_args(call)
    arg = args[0] if args else keyword_arg(call, "parameters")
    value = arg.value if arg is not None else None
    if type(value) is not cst.Call or method_name(value) != "parameters" or value.args:
        return None
    return dotted_name(value.func.value)


def _sharded_wrap(model: LoopModel, clip: cst.Call, owner: str, sharded) -> tuple[cst.Call, str] | None:
    """``(wrapping call, the strategy in words)`` for the wrap of ``owner`` that shards its gradients, or None when
    no wrap of it by ``sharded`` is seen or every one keeps whole gradients."""
    index = model.index
    function = function_holding(model, clip)
    if "." in owner:
        values = index.assigned_anywhere(owner)
    else:
        values = [*index.assignments.get(function, {}).get(owner, ()), *index.assignments.get(None, {}).get(owner, ())]
    for value in values:
        if type(value) is not cst.Call:
            continue
        wrapping = function_holding(model, value)
        if owner.startswith("self.") and not _same_instance_runs(model, wrapping, function):
            continue
        for wrap in _constructions(model, value, wrapping, sharded):
            strategy = _strategy(model, wrap, sharded)
            if strategy is not None:
                return wrap, strategy
    return None


def _constructions(model: LoopModel, value: cst.Call, function: cst.FunctionDef | None, sharded) -> list[cst.Call]:
    """The wrapper constructions an assigned call stands for: itself, or those a helper of the module it calls
    returns (``def do_fsdp(m): if world_size == 1: return m; return FullyShardedDataParallel(m, ...)``): the wrapped
    path is the one that shards, whatever the other returns hand back."""
    index = model.index
    if index.qualified_names(value.func) & sharded.constructors:
        return [value]
    helper = index.resolve_function(value, function)
    if helper is None:
        return []
    found = []
    for returned in index.returned(helper):
        candidates = [returned] if type(returned) is cst.Call else [
            v for v in index.assignments.get(helper, {}).get(dotted_name(returned) or "", ()) if type(v) is cst.Call
        ]
        found.extend(c for c in candidates if index.qualified_names(c.func) & sharded.constructors)
    return found


def _same_instance_runs(model: LoopModel, wrapping: cst.FunctionDef | None, clipping: cst.FunctionDef | None) -> bool:
    """Whether an instance whose ``self.x`` is wrapped in ``wrapping`` runs the clip in ``clipping``.

    A trainer class wraps its model with FSDP and overrides the base class's
    ``clip_gradient`` with the wrapper's own method (``class FSDPTrainer(BasicTrainer)``): the base's
    ``torch.nn.utils.clip_grad_norm_`` never runs on the wrapped model. Where a class is unknown, it may.
    """
    index = model.index
    wrap_method, clip_method = index.method_holding(wrapping), index.method_holding(clipping)
    wrap_class = index.class_of.get(wrap_method) if wrap_method is not None else None
    clip_class = index.class_of.get(clip_method) if clip_method is not None else None
    if wrap_class is None or clip_class is None or wrap_class == clip_class or index.inherits(clip_class, wrap_class):
        return True
    return index.method_of(wrap_class, clip_method.name.value) is clip_method


def _strategy(model: LoopModel, wrap: cst.Call, sharded) -> str | None:
    """How the wrap's strategy shards, in words, or None when it keeps whole gradients for sure."""
    arg = keyword_arg(wrap, sharded.strategy_keyword)
    spread = next((a for a in wrap.args if a.star == "**"), None)
    if arg is None and spread is not None:
        arg = _keyword_in_spread_dict(model, wrap, spread.value, sharded.strategy_keyword)
        if arg is None:
            return (
                f"`{sharded.strategy_keyword}` not given unless in `**{model.code(spread.value)}`: sharded unless it is "
                + " or ".join(sorted(sharded.unsharded))
            )
    if arg is None:
        return f"`{sharded.strategy_keyword}` not given: `{sharded.default}`"
    named = dotted_name(arg.value)
    if named is None:
        return f"`{sharded.strategy_keyword}={model.code(arg.value)}`, a setting: sharded unless it is " + " or ".join(sorted(sharded.unsharded))
    if last_name(named) in sharded.unsharded:
        return None
    if "." in named:
        return f"`{sharded.strategy_keyword}={named}`"
    values = model.index.assignments.get(function_holding(model, wrap), {}).get(named, []) or model.index.assigned_anywhere(named)
    names = [dotted_name(v) if isinstance(v, cst.BaseExpression) else None for v in values]
    if names and all(n is not None and last_name(n) in sharded.unsharded for n in names):
        return None
    return f"`{sharded.strategy_keyword}={named}`, a setting: sharded unless it is " + " or ".join(sorted(sharded.unsharded))


def _keyword_in_spread_dict(model: LoopModel, wrap: cst.Call, spread: cst.BaseExpression, keyword: str) -> cst.Arg | None:
    """The ``keyword=`` argument of the ``dict(...)`` a wrap spreads (``FSDP(m, **shared_fsdp_kwargs)`` with
    ``shared_fsdp_kwargs = dict(sharding_strategy=..., ...)`` in the same function), or None when it is not seen."""
    name = dotted_name(spread)
    values = model.index.assignments.get(function_holding(model, wrap), {}).get(name, []) if name is not None else []
    if len(values) != 1 or type(values[0]) is not cst.Call or dotted_name(values[0].func) != "dict":
        return None
    return keyword_arg(values[0], keyword)


class ForwardAroundWrapper(Rule):
    """A data-parallel model is trained through the module it wraps: its own forward never runs, nothing is all-reduced.

    **Why it matters.** ``DistributedDataParallel`` all-reduces the gradients
    of a backward only when its own forward prepared the reducer for it
    (``_post_forward`` calls ``reducer.prepare_for_backward``; the reducer's
    gradient hooks return at once while it expects none). A training step
    whose loss is computed through ``model.module.encode(...)``, through a
    helper that returns the wrapped module (``self._get_model().compute_loss(batch)``
    with ``_get_model`` returning ``self.model.module``:
    ``fixtures/realworld/gl309_loss_through_unwrap_helper__OpenTSLM.py``), or through
    the object the wrapper was built from, never runs that forward: each
    process steps its own replica on its own shard of the data, and the
    replicas drift apart with no error. A model prepared by accelerate is the
    same (``accelerator.prepare`` wraps it in DDP when the script runs on
    several processes): forwarding through ``pipeline.unet`` while
    ``prepare`` was handed ``trainable_layers = pipeline.unet`` trains the
    unwrapped object.

    **Fix.** Call the wrapper itself (``model(x)``); when training needs
    several methods of the module, give it a ``forward`` that runs them and
    call the wrapper.

    **Stays quiet when**

    - the wrapper is called anywhere in the iteration that backpropagates (or in
      a function of the module the iteration calls), or named there other than
      through one of its attributes or as the model of a framework's
      ``accumulate()`` / ``no_sync()`` (handed to a helper, which may call it:
      ``fixtures/distributed/ok_gl309_wrapper_handed_to_helper.py``; handed only
      to ``accumulate()``, it runs nothing:
      ``fixtures/distributed/gl309_prepared_model_handed_only_to_accumulate.py``);
    - the backpropagated loss is not computed, in the same iteration, from
      what a forward around the wrapper returned, other than through
      ``.detach()`` (a forward under ``no_grad`` for evaluation,
      ``model.module.state_dict()``, a detached teacher's target:
      ``fixtures/distributed/ok_gl309_detached_teacher_module.py``), or the
      backward is a helper's (the code does not show which object produced its loss);
    - the optimizer stepped is known to train other parameters than the wrapped
      model's, or its parameters are unknown and the iteration calls another
      data-parallel model (it may train that one alone);
    - the iteration calls a collective (``all_reduce``) or anything whose name
      holds ``reduce``, ``sync`` or ``average`` and that names gradients,
      parameters or the model (``average_gradients(net)``:
      ``fixtures/distributed/ok_gl309_gradients_averaged_by_hand.py``; not
      ``accelerator.reduce(metrics)``);
    - the wrap is not one read as reducing only after its own forward: torch's
      DDP and accelerate's ``prepare`` are (apex's ``DistributedDataParallel``,
      Fabric, Ray Train and ``fully_shard`` are not read so here);
    - one process only is certain, or the framework does not wrap in DDP
      (``Accelerator`` given an FSDP, DeepSpeed or Megatron-LM plugin,
      ``Fabric(devices=1)``, as GL302:
      ``fixtures/distributed/ok_gl309_accelerator_with_fsdp_plugin.py``).

    **Bad**::

        model = DistributedDataParallel(model, device_ids=[rank])
        for batch in loader:
            out = model.module.decode(model.module.encode(batch["x"]))
            loss_fn(out, batch["y"]).backward()
            optimizer.step()
            optimizer.zero_grad()

    **Good**::

        model = DistributedDataParallel(model, device_ids=[rank])
        for batch in loader:
            out = model(batch["x"])  # the module's forward runs encode and decode
            loss_fn(out, batch["y"]).backward()
            optimizer.step()
            optimizer.zero_grad()
    """

    code = "GL309"
    name = "forward-around-data-parallel-wrapper"
    summary = "a data-parallel model's loss comes from the module it wraps: its gradients are never all-reduced"
    severity = Severity.ERROR
    fix = None  # calling the wrapper may need a forward the module lacks: left to the author
    needs = ((BACKWARD, STEP),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        wrapped, scopes = _wrapped_models(model)
        if not wrapped and not model.wrapped_by_caller:
            return
        reported: set[int] = set()
        for root in model.roots:
            handed = _handed_in(model, root)
            # Only a name the module assigns a wrap to (or a caller hands one): not a name the object table took for an
            # alias of one (``raw_model = model.module``).
            seen = {name: by for name, by in _models_seen_by(model, root, wrapped, scopes).items() if name in scopes}
            seen.update(handed)
            if not seen:
                continue
            function = root.node if type(root.node) is cst.FunctionDef else None
            for step, loop in steps_with_loops(root):
                called = {last_name(c) for c in _called_names(model, loop.node, function)}
                for name, by in seen.items():
                    others_called = any(last_name(other) in called for other in seen if other != name)
                    if not by.around_forward or not _trains(model, step, name, others_called):
                        continue  # a wrap not read as skipping its reduction when forwarded around, or not this optimizer's
                    found = _forward_around(model, root, loop, name, function)
                    if found is None or id(found[0]) in reported:
                        continue
                    forward, backward = found
                    reported.add(id(forward))
                    yield Report(
                        forward,
                        f"`{model.code(forward.func)}` forwards around `{name}`, and the loss the backward at line "
                        f"{model.line(backward.node)} backpropagates comes from it while `{name}` itself is never called in "
                        f"this iteration: {by.around_forward}; call `{name}(...)` (give the module a `forward` that runs what "
                        f"the step needs)",
                        event=backward,
                    )


# Calls of a module that run no forward whose output becomes a loss (state, modes, moves).
_NOT_A_FORWARD_METHOD = frozenset({
    "parameters", "named_parameters", "state_dict", "load_state_dict", "train", "eval", "to", "cuda", "cpu",
    "zero_grad", "requires_grad_", "buffers", "named_buffers", "modules", "named_modules", "children", "apply",
})


def _trains(model: LoopModel, step: Event, name: str, others_called: bool) -> bool:
    """Whether the optimizer ``step`` steps may train ``name``'s parameters: known sources must name the wrapper or
    the module it wraps; unknown ones count unless the iteration calls another data-parallel model (a student beside a
    teacher forwarded through ``teacher.module``: the optimizer may train the other one alone)."""
    info = model.info(step.target) if step.target else None
    sources = info.param_sources if info is not None else frozenset()
    if not sources:
        return not others_called
    names = {last_name(name), last_name(model.info(name).wraps or name)} | {last_name(o) for o in _origins(model, name)}
    return bool({last_name(s) for s in sources} & names)


def _origins(model: LoopModel, name: str) -> set[str]:
    """The objects ``name``'s wrapper was built from: the module a wrapper class was handed
    (``ddp = DistributedDataParallel(model)``), and what the name held before a framework prepared it
    (``trainable_layers = pipeline.unet`` then ``trainable_layers, opt = accelerator.prepare(trainable_layers, opt)``).
    Read once per name and module: every step asks it, and each answer walks every value the module assigns to
    each origin (asked per step, a module of many loops cost the square of its size)."""
    return model.file.once((_origins, name), lambda: _read_origins(model, name))


def _read_origins(model: LoopModel, name: str) -> set[str]:
    found = set()
    wraps = model.info(name).wraps
    if wraps:
        found.add(wraps)
    if model.index is not None:
        settings = framework_settings(model)
        constructions = {id(call) for key, calls in settings.wraps.items() if frameworks.WRAPS[key].constructors for call in calls}
        for value in model.index.assigned_anywhere(name):
            if isinstance(value, Unpacked):
                continue
            if type(value) in (cst.Name, cst.Attribute):
                held = dotted_name(value)
                if held is not None:
                    found.add(held)
            elif id(value) in constructions:
                args = positional_args(value)
                held = dotted_name(args[0].value) if args else None
                if held is not None:
                    found.add(held)
    found.discard(name)
    if model.index is not None:  # ``model = ddp_model`` later: calling the origin calls the wrapper
        found = {
            origin for origin in found
            if not any(mentions(value.value if isinstance(value, Unpacked) else value, {name}) for value in model.index.assigned_anywhere(origin))
        }
    return found


def _forward_around(
    model: LoopModel, root: Root, loop: Frame, name: str, function: cst.FunctionDef | None
) -> tuple[cst.Call, Event] | None:
    """A call in ``loop`` that forwards around the wrapper ``name`` (``name.module.<method>(...)`` or the object the
    wrapper was built from) whose result becomes the loss of a backward of the loop, while the loop never calls
    ``name`` nor hands it anywhere; with that backward. None when any of it is not shown."""
    origins = _origins(model, name)
    module = f"{name}.module"
    forwards: list[cst.Call] = []
    pending: list[tuple[cst.CSTNode, cst.FunctionDef | None]] = [(loop.node, function)]
    visited: set[int] = set()
    while pending:
        node, scope = pending.pop()
        for sub in model.file.walk(node):
            if type(sub) in (cst.Name, cst.Attribute) and dotted_name(sub) == name:
                parent = (model.parents or {}).get(sub)
                if not (type(parent) is cst.Attribute and parent.value is sub) and not _handed_to_context(model, parent):
                    return None  # called, or handed on: the wrapper may run
            if type(sub) is not cst.Call:
                continue
            callee = dotted_name(sub.func)
            last = callee_name(sub) or ""
            if _reduces_by_hand(model, sub, name, origins):
                return None  # gradients or parameters reduced by hand
            if callee is not None and (callee in origins or (callee.startswith(module + ".") and last not in _NOT_A_FORWARD_METHOD) or callee == module):
                forwards.append(sub)
            helper = model.index.resolve_function(sub, scope) if model.index is not None else None
            if helper is not None and not sub.args and _unwraps(model, helper, name):
                visited.add(id(helper))  # ``self._get_model()`` is ``self.model.module``: its body hands nothing on
                forward = _forward_of_unwrapped(model, sub)
                if forward is not None:
                    forwards.append(forward)
                continue
            if helper is not None and id(helper) not in visited:
                visited.add(id(helper))
                pending.append((helper.body, helper))
    forwards = [call for call in forwards if lies_in(model, call, loop.node) and not _under_no_grad(model, call, loop.node)]
    if not forwards:
        return None
    derived = _derived_from(model, loop.node, forwards)
    for backward in root.events_of(EventKind.BACKWARD, loop):
        if backward.call_chain or backward.loss is None:
            continue
        if mentions(backward.loss, derived) or any(lies_in(model, call, backward.loss) for call in forwards):
            return forwards[0], backward
    return None


def _unwraps(model: LoopModel, helper: cst.FunctionDef, name: str) -> bool:
    """Whether ``helper`` hands back the module the wrapper ``name`` wraps: every value it returns is ``name.module``
    or ``name`` itself (the fallback with one process), at least one is ``name.module`` (``def _get_model(self): if
    hasattr(self.model, "module"): return self.model.module; return self.model``, or the same as one ``... if ...
    else ...``)."""
    values: list[cst.BaseExpression] = []
    for value in model.index.returned(helper):
        values.extend((value.body, value.orelse) if type(value) is cst.IfExp else (value,))
    spelled = {dotted_name(v) if type(v) in (cst.Name, cst.Attribute) else None for v in values}
    return f"{name}.module" in spelled and spelled <= {name, f"{name}.module"}


def _forward_of_unwrapped(model: LoopModel, call: cst.Call) -> cst.Call | None:
    """The forward run on what an unwrapping helper's ``call`` returns: ``helper()(x)``, or ``helper().method(x)``
    for a method that runs the module (not ``parameters()``, ``train()``...); None for anything else."""
    parent = (model.parents or {}).get(call)
    if type(parent) is cst.Call and parent.func is call:
        return parent
    outer = (model.parents or {}).get(parent) if type(parent) is cst.Attribute and parent.value is call else None
    if type(outer) is cst.Call and outer.func is parent and parent.attr.value not in _NOT_A_FORWARD_METHOD:
        return outer
    return None


def _reduces_by_hand(model: LoopModel, call: cst.Call, name: str, origins: set[str]) -> bool:
    """Whether a call may reduce gradients or parameters over the processes: a collective (``all_reduce``), or a call
    whose name holds ``reduce``, ``sync`` or ``average`` and that names gradients, parameters or the model
    (``average_gradients(model)``; not ``accelerator.reduce(metrics)``)."""
    last = (callee_name(call) or "").lower()
    if any(word in last for word in ("all_reduce", "allreduce", "reduce_scatter", "all_gather")):
        return True
    if not any(word in last for word in ("reduce", "sync", "average")):
        return False
    if any(word in last for word in ("grad", "param", "model")):
        return True
    handed = " ".join(model.code(arg.value) for arg in call.args)
    return "grad" in handed or "param" in handed or any(n in handed for n in (name, *origins))


def _handed_to_context(model: LoopModel, parent: cst.CSTNode | None) -> bool:
    """Whether a name is an argument of a framework's ``no_sync`` or ``accumulate`` context (``accumulate(model)``),
    which runs no forward of it."""
    call = (model.parents or {}).get(parent) if type(parent) is cst.Arg else None
    return type(call) is cst.Call and callee_name(call) in frameworks.CONTEXTS


def _under_no_grad(model: LoopModel, node: cst.CSTNode, stop: cst.CSTNode) -> bool:
    """Whether ``node`` runs in a ``with torch.no_grad()`` / ``inference_mode()`` block inside ``stop``."""
    table = model.parents or {}
    node = table.get(node)
    while node is not None and node is not stop:
        if _switches_gradients_off(node):
            return True
        node = table.get(node)
    return False


# Methods whose result carries no gradient of the tensor they are called on.
_DETACHING = frozenset({"detach", "item", "tolist", "numpy"})


def _detached(model: LoopModel, node: cst.CSTNode, stop: cst.CSTNode) -> bool:
    """Whether ``node`` reaches ``stop`` only through a ``.detach()`` (``.item()``) of something it is part of."""
    table = model.parents or {}
    while node is not None and node is not stop:
        parent = table.get(node)
        if type(parent) is cst.Attribute and parent.value is node and parent.attr.value in _DETACHING:
            return True
        node = parent
    return False


def _derived_from(model: LoopModel, body: cst.CSTNode, forwards: list[cst.Call]) -> set[str]:
    """The names assigned in ``body``, in any order and to a fixed point, from the result of one of ``forwards`` or
    from a name so assigned."""
    ids = {id(call) for call in forwards}
    assigns = [n for n in model.file.walk(body) if type(n) in (cst.Assign, cst.AugAssign, cst.AnnAssign)]
    derived: set[str] = set()
    changed = True
    while changed:
        changed = False
        for assign in assigns:
            value = assign.value
            if value is None:
                continue
            if not any(
                (id(n) in ids or (type(n) in (cst.Name, cst.Attribute) and dotted_name(n) in derived))
                and not _detached(model, n, value)
                for n in walk(value)
            ):
                continue
            targets = [t.target for t in assign.targets] if type(assign) is cst.Assign else [assign.target]
            for target in targets:
                for n in walk(target):
                    held = dotted_name(n) if type(n) in (cst.Name, cst.Attribute) else None
                    if held is not None and held not in derived:
                        derived.add(held)
                        changed = True
    return derived
