"""Rules about clearing gradients: when ``zero_grad()`` runs, and whether it runs at all (GL001–GL005)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from gradlint.events import EventKind
from gradlint.findings import FixKind, Severity
from gradlint.fixes import clearing as fixes
from gradlint import frameworks
from gradlint.reach import calls_computing_loss, owners_of_construction, parameter_owners, reaching_call, requires_grad_switched_off
from gradlint.frameworks.framework import AccumulateContext
from gradlint.frameworks.settings import counts_more_than_one, framework_settings
from gradlint.module_index import Unpacked
from gradlint.model import GRAD_DIVIDE, HANDOFF, Event, Frame, FrameKind, LoopModel, Root
from gradlint.objects import ObjKind, kind_from_name, last_name
from gradlint.optimizer_updates import stepped_update_scale, too_large
from gradlint.queries import (
    contradicting_settings,
    branch_sides,
    closure_of,
    Accumulation,
    accumulation,
    accumulation_side,
    accumulation_place,
    clears,
    clears_between_backward_and_step,
    discards_update,
    masks_by_value,
    names_in,
    ends_with_break,
    probe_events,
    exclusive,
    frames_inside,
    function_holding,
    handoff_may_clear,
    header_says_micro_batches,
    in_other_branch,
    innermost_loop,
    local_of_its_own,
    leaves_before,
    counter_and_offset,
    lies_in,
    loop_phrase,
    param_sources,
    rebuilt_in,
    runs_once,
    same_object,
    single_branch_guards,
    split_by_setting,
    calls_unseen_inherited_method,
    steps_after_loops,
    steps_with_loops,
    walks_every_parameter,
)
from gradlint.counters import loop_index
from gradlint.event_builder import running_division
from gradlint.rule import BACKWARD, STEP, Report, Rule, Settled, Spelled, call_of
from gradlint.rules.network_in_no_optimizer import (
    construction_of, freezes_itself, holds_only_named_networks, only_called_moved_and_gathered, related, unmoved,
)
from gradlint.rules.parameter_groups import _optimizer_constructions
from gradlint.rules.parameters import _is_requires_grad, _layer_built as _layer_built_by
from gradlint.syntax import (
    bind_arguments, bool_literal, boolean_terms, callee_name, dotted_name, is_grad, keyword_arg, leaves_block, method_name, number,
    only_raises_not_implemented,
    positional_args, receiver, scales_down, terminal, walk, with_arguments,
)


class MissingZeroGrad(Rule):
    """A training loop steps an optimizer but never clears that optimizer's gradients.

    **Why it matters.** ``backward()`` adds to ``.grad``; it never replaces it.
    Without a clear, every step applies the sum of all gradients since the
    start of training, and the loss usually diverges without any error.
    Each optimizer is checked on its own: in a GAN, clearing the
    discriminator does not clear the generator.

    **Fix.** Call ``optimizer.zero_grad()`` once per step, right after
    ``optimizer.step()`` (or at the top of the loop).

    Also flagged: one optimizer stepped twice in one iteration with another
    backward between and no clear (``loss_a.backward(); opt.step();
    loss_b.backward(); opt.step()``): the second step applies the first
    backward's gradients again (not when the loop writes saved weights back
    between the steps, ``model.set_params(old_weights)``: the first step
    was a look-ahead it undoes,
    ``fixtures/realworld/ok_gl001_weights_restored_between_steps__PyContinual.py``); the same for two steps side by side after
    one backward (``loss.backward(); opt.step(); opt.step()``: two updates
    per batch; also in a function's own code outside any loop, every call:
    ``scaler.step(opt); scaler.update(); opt.step()`` in an agent's update
    method, ``fixtures/realworld/gl001_scaler_step_then_optimizer_step__sac-td3-cudagraphs.py``),
    also a leftover step after an ``if`` on a setting whose
    every branch steps already (``if amp: scaler.step(opt) else:
    opt.step()`` then ``opt.step()``:
    ``fixtures/realworld/gl001_leftover_step_after_amp_branches__TTS.py``). And a backward before the training loop (a
    check, gradients printed at start) whose gradients the loop's first step
    applies: the loop clears only after stepping and nothing clears between.
    A clear of another network counts for nothing: a helper handed a
    one-element list (``self.reset_grad([self.Encoder])``, whose ``for net
    in net_list: net.zero_grad()`` clears the encoder alone) before the
    discriminator's step, with the encoder held by another optimizer (built
    over a local, ``params = list(self.Encoder.parameters()) + ...``):
    ``fixtures/realworld/gl001_helper_clears_the_wrong_network__voice_conversion.py``.

    Also flagged: a loop whose only clears run on its first iteration
    (``if i == 0:`` of its ``enumerate`` index), only in one phase of the
    loop (``if it < switch_point:``, the loop's own index, or a counter its
    body increments on every iteration, ordered against a bound, while the
    step runs on every iteration:
    ``fixtures/realworld/gl001_clear_only_in_first_phase__GenerativeEscherMeshes.py``,
    ``gl001_generator_cleared_only_after_discriminator_warmup__UnivNet-pytorch.py``;
    an optimizer rebuilt under an ``if`` does not start clean on every
    iteration, and a scheduler built over it, ``StepLR(optimizer, ...)``,
    clears nothing), only when a scheduler is
    set (``if self.scheduler: ...; self.zero_grad()``, reported at that
    clear), or only where ``it % n == 1`` with ``n`` a count of the run
    (never true when ``n`` is 1: reported at that clear)
    (``fixtures/realworld/gl001_clear_only_with_scheduler__tez.py``,
    ``gl001_clear_when_remainder_is_one__simple-nmt.py``), or only with
    accumulation on (``if update_interval > 1: opt.zero_grad()`` after a step
    that also runs with an interval of 1; the interval is a count because the
    step's guard divides by it: reported at that clear,
    ``fixtures/realworld/gl001_clear_only_with_accumulation_on__sockeye.py``). And a function with
    no loop that clears one network on every call but never another that
    it steps (a GAN's ``step(data)``), when each network is built from a
    class of the module whose optimizer is built over its own
    ``self.parameters()``, every clear of the function names such a
    network, and no loop of the run calls the function
    (``fixtures/realworld/gl001_step_method_clears_one_network__code-soup.py``).
    And a clear after the step that skips the first iteration (``if
    batch_index > 0: opt.zero_grad()``) while the step may run there (no
    guard, or a guard whose count is a setting) and every other clear runs
    on the first iteration alone: the second step applies the first batch's
    gradients again (``fixtures/realworld/gl001_clear_after_step_skips_first_batch__tez.py``).
    And an LBFGS stepped with a closure that backpropagates without clearing
    first: LBFGS calls the closure up to ``max_iter`` times in one step and
    reads the gradients after each call, so each evaluation adds to the last
    (``fixtures/realworld/gl001_lbfgs_closure_without_clear__temperature_scaling.py``).
    And a loop that clears networks (``model.zero_grad()``) while its
    optimizer also holds another network built beside them (learnable loss
    weights, a temperature: ``Adam(list(model.parameters()) +
    list(weighting.parameters()))``) that the loss runs through: nothing
    clears that network's gradients (reported at the clear; quiet when the
    network may be part of a cleared one, that is when it is used in any way
    but being called, moved and handed to the optimizer, or when its
    ``requires_grad`` may be switched off:
    ``fixtures/clearing/network_clear_leaves_loss_weights.py``).

    A class of the module whose ``step()`` reads no gradient (a weight
    average named ``ema_optimizer``) is no optimizer
    (``fixtures/realworld/gl001_weight_average_named_optimizer__Semi-supervised-learning.py``;
    also one nested in the trainer and built as ``self._EMA(...)``:
    ``fixtures/realworld/ok_gl001_nested_weight_average_class__DeepLense.py``),
    nor is higher's differentiable optimizer, whose ``step(loss)`` takes its
    gradients itself (``fixtures/frameworks/ok_higher_inner_optimizer_takes_its_own_gradients.py``),
    nor is an optimizer whose ``step`` is handed a learning rate
    (``emb_optimizer.step(lr)``, ``optimizer.step(lr=...)``: torch's takes
    only a closure; WholeGraph's sparse optimizers and Warp's apply and drop
    the gradients they collected:
    ``fixtures/realworld/ok_gl001_sparse_optimizer_stepped_with_rate__graphstorm.py``)
    or the gradients to apply (``opt.step([x.grad])``, ``opt.step(grads)``,
    ``opt.step(gradient_func())``: Warp's Adam,
    ``fixtures/realworld/ok_gl001_optimizer_handed_its_gradients__warp.py``).
    An object built from a class of the module whose ``step()`` and
    ``zero_grad()`` step and clear the optimizer it holds (a warm-up or
    logging wrapper) is read as that optimizer.

    **Loops it reads**: ``for`` and ``while`` loops; a step function that
    every loop of its package calling it leaves the gradient work to
    (``trainer.train_step(batch)``, in this module or another); a Lightning
    ``training_step`` under manual optimization (Lightning calls it once
    per batch and clears nothing itself).

    **Stays quiet when**

    - the loop clears the optimizer on the path to the step: ``zero_grad()`` on it, on a wrapper
      that holds it (``self.optim.zero_grad()`` for ``self.optim.optimizer``) or on its model,
      ``p.grad = None``, a helper that clears (also one handed a list of
      optimizers, or the optimizer a stepped wrapper holds:
      ``zero_optim_grads(self._policy_optimizer.optimizer)``), an optimizer
      class's own clear under another name (``set_grads_none()``:
      ``fixtures/realworld/ok_gl001_cleared_by_helpers_named_otherwise__garage.py``),
      or a closure run by ``step(closure)``. A clear counts
      only on the paths where it runs: not one in an ``except`` handler (it
      runs only on failed batches), in the other branch of an ``if`` that is
      no accumulation guard (``if amp: opt.zero_grad(); ... else:
      loss.backward(); opt.step()``), in a branch that leaves before the
      step, or, for a step on every iteration, under a periodic test of its
      own (``if step % 100 == 0: opt.zero_grad()``)
      (``fixtures/clearing/clear_on_one_branch_only.py``); a clear at the
      start of an accumulation window serves the step at its end
      (``fixtures/clearing/ok_clear_on_every_path.py``);
    - the loop calls a method of ``self`` that its class inherits from a
      class of another module (torch's aside), which cannot be read here and
      may clear ``self``'s optimizer
      (``fixtures/crossfile/inherited_method_clears__habitat-lab``);
    - the optimizer is handed to code the model cannot see, which may clear
      it, unless the callee's name says what else it does
      (``clip_gradient(optimizer, 1.0)``, ``adjust_learning_rate(optimizer,
      epoch)``, ``save_checkpoint(...)``), or every function of that name in
      the files of the run is read and none clears (no ``zero_grad``, no
      store into ``.grad``, no argument handed on to other code); a method
      whose name says it resets or clears, of an object of unknown kind built
      with the optimizer, counts as handed it (``gns = GradientNoiseScale(adp, sgd)``, then
      ``gns.reset_accumulation()``:
      ``fixtures/realworld/ok_gl001_object_built_with_optimizer_clears__adaptdl.py``);
    - a fresh optimizer over fresh tensors is built every iteration (also in
      the helper the loop calls, which builds it and steps it:
      ``fixtures/realworld/gl001_fresh_optimizer_built_in_called_helper__OLMo-core.py``), or the
      optimizer's own ``step()`` clears after stepping (ColossalAI's
      ``GeminiOptimizer``: ``fixtures/frameworks/ok_colossalai_gemini_step_clears.py``,
      once ``ZeroOptimizer``, also with the name rebound to it around
      itself, ``optimizer = ZeroOptimizer(optimizer, model)``:
      ``fixtures/realworld/ok_gl001_zero_optimizer_rebound_around_optimizer__ColossalAI-Examples.py``;
      a class of the module whose ``step()`` sets ``p.grad = None``:
      ``fixtures/realworld/ok_gl001_optimizer_class_clears_in_its_step__modded-nanogpt.py``);
    - the optimizer is set up for gradient release (optimi's
      ``gradient_release=True``, torchtune, a per-parameter optimizer dict
      stepped in hooks): each gradient is applied and freed during backward;
    - the stepped name is ``None`` wherever the step runs: the function binds
      it to ``None`` and to an optimizer only under an ``if`` whose test is
      written again around the step, on the other side (``opt = None``;
      ``if args.deepspeed: model, opt, ... = deepspeed_initialize(...)``; ...
      ``else: opt.step()``): that step raises on its first run
      (``fixtures/realworld/ok_gl001_optimizer_none_off_the_deepspeed_path__HunyuanDiT.py``);
    - the backward is ``torch.distributed.autograd.backward``: gradients live
      in the per-iteration distributed autograd context, never in ``.grad``;
    - the loop's backward is a CUDA graph's ``g.replay()`` and the graph was
      captured right after ``zero_grad(set_to_none=True)``: the captured
      backward allocates the gradients and each replay overwrites them
      (``fixtures/realworld/ok_gl001_graph_captured_after_gradients_set_to_none__physicsnemo.py``;
      captured over the warm-up's gradients, each replay adds to them:
      ``fixtures/realworld/gl001_graph_captured_over_warmup_gradients__physicsnemo.py``,
      reported without a fix, since a clear inside the replay loop would drop
      the graph's gradient tensors);
    - before the loop: the earlier backward's loss is not visibly computed by
      a model the optimizer was built over (a teacher, an input saliency),
      or something clears, steps or takes the optimizer in between, or the
      loop clears before it steps;
    - in a step function: a loop calling it does gradient work of its own
      beside the call (the clear may be there), or the stepped optimizer and
      a cleared one both come from elsewhere (they may share parameters);
    - the loop steps once and leaves (``optimizer.step(); complete = True``
      then ``if complete: break``, an accumulation window written ``while
      True:``) and the optimizer is cleared before the loop
      (``fixtures/realworld/gl006_clip_in_backward_step_of_while_true_window__GLM.py``);
    - two steps of one optimizer come from two calls of a function that holds
      the loop (``try: train() except OutOfMemoryError: train()``): each call
      runs its own loop, so the steps never share an iteration; or the first
      step's branch leaves the iteration (``if warmup: ...; opt.step();
      continue``); or the two steps sit on opposite sides of a setting that
      only code before the loop binds (``if amp: scaler.step(opt)`` and
      ``if not amp: opt.step()``, with ``amp`` read from the configuration and
      rebound by a helper before the loop:
      ``fixtures/realworld/ok_gl001_steps_on_opposite_sides_of_amp_setting__GaNDLF.py``).

    **Bad**::

        for x, y in loader:
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()

    **Good**::

        for x, y in loader:
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    """

    code = "GL001"
    name = "missing-zero-grad"
    summary = "a loop backpropagates and steps an optimizer but never clears its gradients"
    severity = Severity.ERROR
    fix = FixKind.SAFE
    needs = ((BACKWARD, STEP),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            reported: set[tuple[str, int]] = set()
            for step, loop in steps_with_loops(root):
                key = (step.target or "", id(loop))
                if key in reported:
                    continue  # one finding per optimizer and loop
                zeros = [e for e in root.events_of(EventKind.ZERO, loop) if clears(model, e, step.target)]
                # A loop that also steps the optimizer under an accumulation guard accumulates: GL011 and GL003 weigh it.
                periodic = not any(
                    same_object(s.target, step.target) and any(f.accumulation for f in frames_inside(s, loop))
                    for s in root.events_of(EventKind.STEP, loop)
                )
                off_path = [z for z in zeros if _off_the_path(model, z, step, loop, periodic) is not None]
                if len(off_path) < len(zeros):
                    continue
                if loop.called_by is not None and _may_share_parameters(model, step, root.events_of(EventKind.ZERO, loop)):
                    continue
                if any(
                    _hands_the_stepped(e.target, step.target) and handoff_may_clear(e, model.keeps_handed)
                    and _off_the_path(model, e, step, loop, periodic=False) is None
                    for e in root.events_of(HANDOFF, loop)
                ):
                    continue
                if _released(model, step.target):
                    continue  # gradient release applies and frees each gradient during backward: nothing piles up
                if _step_clears_itself(model, step.target):
                    continue  # the optimizer's own step() clears after stepping
                if step.has_args:
                    continue  # ``opt.step(lr)``, ``opt.step(grads)``: another library's optimizer, whose step may consume its gradients
                if _none_where_stepped(model, step):
                    continue  # ``opt = None`` unless ``if args.deepspeed:`` builds it, stepped in that test's ``else``
                if _replays_a_graph_captured_without_gradients(model, root, loop):
                    continue  # each replay writes the gradients the captured backward allocated: nothing adds up
                if calls_unseen_inherited_method(model, step, loop):
                    continue
                if (_last_iteration_only(model, step, loop) or _loop_left_after(model, step, loop)) and _cleared_before(
                    model, root, step, loop,
                ):
                    continue  # one step per run of the loop: the clear before the loop serves it
                if rebuilt_in(model, loop, step.target, step) and all(
                    rebuilt_in(model, loop, source, step) for source in param_sources(model, step.target or "")
                ):
                    continue  # a fresh optimizer over fresh tensors (or networks built anew) each iteration: nothing carries over
                reported.add(key)
                misplaced = next((z for z in off_path if _misplaced_clear(model, z, step, loop) is not None), None)
                if misplaced is not None:
                    # The clear the user moves or re-tests: report it there (``if self.scheduler: ...; self.zero_grad()``).
                    yield Report(
                        misplaced.node,
                        f"`{model.code(misplaced.node)}` runs {_off_the_path(model, misplaced, step, loop, periodic)}: "
                        f"then nothing clears `{step.target}`'s gradients on the path to its step at line "
                        f"{model.line(step.node)} {loop_phrase(model, loop)}, and each step also applies every earlier "
                        f"step's gradients; {_misplaced_clear(model, misplaced, step, loop)}",
                        fix=fixes.add_zero_grad(model, step), event=misplaced, against=(step,),
                    )
                    continue
                if off_path:
                    zero = off_path[0]
                    message = (
                        f"`{step.target}` is stepped at line {model.line(step.node)} but nothing clears its gradients on "
                        f"the path to this step {loop_phrase(model, loop)}: `{model.code(zero.node)}` at line "
                        f"{model.line(zero.node)} runs {_off_the_path(model, zero, step, loop, periodic)}; each step without it also "
                        f"applies every earlier step's gradients"
                    )
                else:
                    message = (
                        f"`{step.target}` is stepped at line {model.line(step.node)} but its gradients are never "
                        f"cleared {loop_phrase(model, loop)}: each step also applies every earlier step's gradients"
                    )
                if _only_replays(root, loop):
                    # A clear in the loop would drop the graph's static gradient tensors: the clear belongs before the capture.
                    message += "; call `zero_grad(set_to_none=True)` right before capturing the graph, whose backward then writes them"
                    yield Report(step.node, message, event=step)
                    continue
                yield Report(step.node, message, fix=fixes.add_zero_grad(model, step), event=step)
            yield from _steps_reapplying_gradients(model, root)
            yield from _steps_twice_in_one_call(model, root)
            yield from _network_clears_leaving_parameters(model, root)
            yield from _backward_before_loop(model, root)
            yield from _uncleared_in_step_method(model, root)
            yield from _clear_skipping_first_step(model, root)
            yield from _closure_reevaluated_without_clear(model, root)


def _hands_the_stepped(handed: str | None, stepped: str | None) -> bool:
    """Whether a call is handed the stepped optimizer or something it holds: the optimizer a wrapper steps
    (``zero_optim_grads(self._policy_optimizer._optimizer)`` before ``self._policy_optimizer.step()``)."""
    if handed is None or stepped is None:
        return False
    return same_object(handed, stepped) or handed.startswith(stepped + ".")


def _none_where_stepped(model: LoopModel, step: Event) -> bool:
    """Whether the stepped name is ``None`` on every path where the step runs: its function binds it to ``None``, and
    binds it to anything else only in one branch of an ``if`` whose test is spelled again around the step, on the
    other side (``opt = None``; ``if args.deepspeed: model, opt, _ = deepspeed_initialize(...)``; ...; ``if
    args.deepspeed: model.step() else: opt.step()``). That step raises on its first run; no gradients pile up."""
    if model.index is None or step.target is None:
        return False
    function = function_holding(model, step.node)
    values = model.index.assignments.get(function, {}).get(step.target, [])
    if not any(type(v) is cst.Name and v.value == "None" for v in values):
        return False
    step_sides = branch_sides(model, step.node, function)
    for value in values:
        if type(value) is cst.Name and value.value == "None":
            continue
        sides = branch_sides(model, value.value if type(value) is Unpacked else value, function)
        if not any(test == other and side != other_side for test, side in sides for other, other_side in step_sides):
            return False
    return True


def _replays_a_graph_captured_without_gradients(model: LoopModel, root: Root, loop: Frame) -> bool:
    """Whether every backward of the loop is a ``graph.replay()`` of a CUDA graph captured right after the gradients
    were set to None (``optimizer.zero_grad(set_to_none=True)`` then ``with torch.cuda.graph(g):``, PyTorch's
    whole-network capture): the captured backward allocates the gradients and writes them, so each replay overwrites
    them rather than adding to the last step's."""
    if not _only_replays(root, loop) or model.index is None:
        return False
    parents = model.parents or {}
    function = function_holding(model, loop.node)
    for node in model.file.walk(function if function is not None else model.module):
        if type(node) is not cst.With or not any(
            type(item.item) is cst.Call and callee_name(item.item) == "graph" for item in node.items
        ):
            continue
        block = parents.get(node)
        siblings = list(block.body) if type(block) in (cst.IndentedBlock, cst.Module) else []
        at = next((i for i, statement in enumerate(siblings) if statement is node), 0)
        before = siblings[at - 1] if at > 0 else None
        if type(before) is cst.SimpleStatementLine and any(
            type(small) is cst.Expr and type(small.value) is cst.Call and method_name(small.value) == "zero_grad"
            and _sets_to_none(small.value)
            for small in before.body
        ):
            return True
    return False


def _only_replays(root: Root, loop: Frame) -> bool:
    """Whether every backward of the loop is a CUDA graph's ``replay()``."""
    backwards = root.events_of(EventKind.BACKWARD, loop)
    return bool(backwards) and all(b.framework == "cuda_graph" for b in backwards)


def _sets_to_none(call: cst.Call) -> bool:
    """Whether ``zero_grad`` sets the gradients to None: ``set_to_none=True`` or the default (True since PyTorch 2.0)."""
    given = keyword_arg(call, "set_to_none") or next(iter(positional_args(call)), None)
    return given is None or bool_literal(given.value) is True


def _last_iteration_only(model: LoopModel, step: Event, loop: Frame) -> bool:
    """Whether the step runs only on the loop's last iteration: under ``if i == len(xs) - 1:`` (or ``i + 1 ==
    len(xs)``), or under ``if not is_accumulating:`` with ``is_accumulating = i < len(xs) - 1`` in the loop."""
    if type(loop.node) is not cst.For:
        return False
    index = loop_index(loop.node)
    if index is None:
        return False
    name = index[0]
    for frame in frames_inside(step, loop):
        if frame.kind is not FrameKind.BRANCH or type(frame.node) is not cst.If or frame.branch != "if":
            continue
        test = frame.node.test
        if _is_last(test, name, negated=False):
            return True
        if type(test) is cst.UnaryOperation and type(test.operator) is cst.Not and type(test.expression) is cst.Name:
            flag = test.expression.value
            values = [
                n.value for n in walk(loop.node.body)
                if type(n) is cst.Assign and len(n.targets) == 1 and dotted_name(n.targets[0].target) == flag
            ]
            if len(values) == 1 and _is_last(values[0], name, negated=True):
                return True
    return False


def _loop_left_after(model: LoopModel, step: Event, loop: Frame) -> bool:
    """Whether the loop ends once the step has run: a ``break`` (or ``return``) follows the step in its block, or the
    block sets a flag (``complete = True``) that a later statement, in a block between it and the loop's body, tests to
    break (``if complete: break``). An accumulation loop written ``while True:`` that steps once and leaves (GLM's ``train_step``)."""
    if type(loop.node) not in (cst.For, cst.While) or not lies_in(model, step.node, loop.node):
        return False
    parents = model.file.parent_map()
    statement = parents.get(step.node)
    while statement is not None and type(statement) is not cst.SimpleStatementLine:
        statement = parents.get(statement)
    block = parents.get(statement) if statement is not None else None
    if block is None or statement not in getattr(block, "body", ()):
        return False
    flags = set()
    for later in block.body[block.body.index(statement) + 1:]:
        if type(later) is not cst.SimpleStatementLine:
            continue
        for small in later.body:
            if type(small) in (cst.Break, cst.Return):
                return True
            if type(small) is cst.Assign and len(small.targets) == 1 and bool_literal(small.value) is True:
                name = dotted_name(small.targets[0].target)
                if name is not None:
                    flags.add(name)
    if not flags:
        return False
    # ``if complete: break`` after the statement that holds the step, in any block between it and the loop's body
    node = statement
    while node is not None and node is not loop.node:
        block = parents.get(node)
        body = getattr(block, "body", ())
        body = list(body) if isinstance(body, (list, tuple)) else []
        if node in body and any(
            type(later) is cst.If and dotted_name(later.test) in flags and later.orelse is None
            and leaves_block(later.body) and not any(type(n) is cst.Continue for n in walk(later.body))
            for later in body[body.index(node) + 1:]
        ):
            return True
        node = block
    return False


def _is_last(test: cst.BaseExpression, index: str, negated: bool) -> bool:
    """``i == len(xs) - 1`` / ``i + 1 == len(xs)`` (or, ``negated``, ``i < len(xs) - 1`` / ``i != len(xs) - 1`` /
    ``i + 1 < len(xs)``)."""
    if type(test) is not cst.Comparison or len(test.comparisons) != 1:
        return False
    operator = type(test.comparisons[0].operator)
    wanted = (cst.LessThan, cst.NotEqual) if negated else (cst.Equal,)
    if operator not in wanted:
        return False
    counter, offset = counter_and_offset(test.left)
    right = test.comparisons[0].comparator
    if counter != index:
        return False
    if type(right) is cst.Call and callee_name(right) == "len":
        return offset == 1
    if type(right) is cst.BinaryOperation and type(right.operator) is cst.Subtract and number(right.right) == 1:
        return type(right.left) is cst.Call and callee_name(right.left) == "len" and offset == 0
    return False


def _cleared_before(model: LoopModel, root: Root, step: Event, loop: Frame) -> bool:
    """Whether the step's optimizer is cleared before the loop, in the same run of the function that holds it."""
    first = root.events_in(loop)[0]
    return any(
        clears(model, z, step.target) and not z.inside(loop) and root.order(z) < root.order(first)
        for z in root.events_of(EventKind.ZERO)
    )


# Optimizers whose ``step(closure)`` calls the closure several times and reads the gradients after each call.
_REEVALUATING = frozenset({"torch.optim.LBFGS", "torch.optim.lbfgs.LBFGS"})


def _closure_reevaluated_without_clear(model: LoopModel, root: Root) -> Iterator[Report]:
    """``optimizer = LBFGS(params, max_iter=50); def closure(): loss.backward(); return loss; optimizer.step(closure)``.

    LBFGS calls the closure up to ``max_iter`` times in one step and reads
    the gradients after each call: a closure that backpropagates without
    clearing first hands it the sum of every evaluation so far.
    """
    for step in root.events_of(EventKind.STEP):
        if step.framework != "closure" or step.target is None or type(step.node) is not cst.Call:
            continue
        if not _reevaluates(model, step.target):
            continue
        closure = closure_of(model, step.node)
        if closure is None:
            continue
        body = closure.body
        backward = next((n for n in model.file.walk(body) if type(n) is cst.Call and method_name(n) == "backward"), None)
        if backward is None or _clears_in(model, body):
            continue
        yield Report(
            step.node,
            f"`{step.target}` is an LBFGS, which calls `{closure.name.value if type(closure) is cst.FunctionDef else 'the closure'}` "
            f"several times in one step and reads the gradients after each call, but the closure backpropagates at line "
            f"{model.line(backward)} without clearing them first: each evaluation adds to the last one's gradients; "
            f"call `{step.target}.zero_grad()` at the top of the closure",
            event=step,
        )


def _step_clears_itself(model: LoopModel, optimizer: str | None) -> bool:
    """Whether every value the module gives the optimizer's name is built by a constructor whose ``step()`` clears the
    gradients after stepping: a framework's declaration (colossalai's ``GeminiOptimizer``) or a class of the module
    whose ``step()`` sets the gradients to ``None`` (modded-nanogpt's ``NorMuonAndAdam``)."""
    if model.index is None or optimizer is None:
        return False
    values = [v for v in model.index.assigned_anywhere(optimizer) if isinstance(v, cst.BaseExpression)]

    def clearing(value: cst.BaseExpression) -> bool:
        return type(value) is cst.Call and bool(
            model.index.qualified_names(value.func) & frameworks.CLEARING_STEPS
            or (type(value.func) is cst.Name and model.index.step_clears(value.func.value))
        )

    # ``optimizer = get_optimizer(model)`` then ``optimizer = ZeroOptimizer(optimizer, model)``: the name ends up
    # holding the wrapper, built around what it held
    wraps_itself = any(
        clearing(v) and bool(v.args) and dotted_name(v.args[0].value) == optimizer for v in values
    )
    return bool(values) and all(clearing(v) or wraps_itself for v in values)


def _reevaluates(model: LoopModel, optimizer: str) -> bool:
    if model.index is None:
        return False
    return any(
        type(value) is cst.Call and model.index.qualified_names(value.func) & _REEVALUATING
        for value in model.index.assigned_anywhere(optimizer)
    )


def _clears_in(model: LoopModel, body: cst.CSTNode) -> bool:
    """Whether code clears gradients: a ``zero_grad()`` of anything, or ``.grad = None`` / ``.grad.zero_()``."""
    for node in model.file.walk(body):
        if type(node) is cst.Call and method_name(node) in ("zero_grad", "zero_", "detach_"):
            return True
        if type(node) is cst.Assign and any(type(t.target) is cst.Attribute and t.target.attr.value == "grad" for t in node.targets):
            return True
    return False


def _clear_skipping_first_step(model: LoopModel, root: Root) -> Iterator[Report]:
    """A clear after the step that skips the loop's first iteration, while the step may run on it.

    ``loss.backward(); opt.step(); if batch_index > 0: opt.zero_grad()``: the
    first step's gradients are not cleared, so the second step applies them
    again. Only where every other clear of the optimizer in the loop runs on
    the first iteration alone (``if batch_index == 0:``), and the step runs on
    every iteration or under a guard whose count is a setting (with a count
    of 1 it steps on the first iteration too; a literal count of 2 or more
    never does).
    """
    for step, loop in steps_with_loops(root):
        if step.framework is not None or step.target is None:
            continue
        zeros = [z for z in root.events_of(EventKind.ZERO, loop) if clears(model, z, step.target)]
        skipping = [z for z in zeros if root.order(z) > root.order(step) and _skips_first_iteration(model, z, step, loop) is not None]
        if not skipping or any(
            z not in skipping and _first_iteration_only(model, z, step, loop) is None for z in zeros
        ):
            continue
        if any(e.kind == HANDOFF and same_object(e.target, step.target) and handoff_may_clear(e, model.keeps_handed) for e in root.events_of(HANDOFF, loop)):
            continue
        guards = [f for f in frames_inside(step, loop) if f.kind is FrameKind.BRANCH and f.accumulation]
        if any(f.count is None or number(f.count) is not None for f in guards):
            continue  # a guard whose count is not a setting: it may never step on the first iteration
        clear = skipping[0]
        test = _skips_first_iteration(model, clear, step, loop)
        yield Report(
            clear.node,
            f"`{model.code(clear.node)}` runs only when `{model.code(test)}`: after the step at line "
            f"{model.line(step.node)} on the loop's first iteration nothing clears `{step.target}`, so the next step "
            f"applies the first batch's gradients again; clear after every step",
            event=clear, against=(step,),
        )


def _skips_first_iteration(model: LoopModel, clear: Event, step: Event, loop: Frame) -> cst.BaseExpression | None:
    """The conjunct of a test around ``clear`` (not around the step) that is false on the loop's first iteration only:
    its enumerate index (or an attribute set from it) ``> 0``, ``!= 0`` or ``>= 1``."""
    names = _index_names(model, loop)
    for frame in frames_inside(clear, loop):
        if frame.kind is not FrameKind.BRANCH or type(frame.node) is not cst.If or frame.branch != "if" or step.inside(frame):
            continue
        for conjunct in boolean_terms(frame.node.test, cst.And):
            if type(conjunct) is not cst.Comparison or len(conjunct.comparisons) != 1 or dotted_name(conjunct.left) not in names:
                continue
            operator, bound = type(conjunct.comparisons[0].operator), number(conjunct.comparisons[0].comparator)
            if (operator in (cst.GreaterThan, cst.NotEqual) and bound == 0) or (operator is cst.GreaterThanEqual and bound == 1):
                return conjunct
    return None


def _first_iteration_only(model: LoopModel, clear: Event, step: Event, loop: Frame) -> cst.BaseExpression | None:
    """The test that lets a clear (not the step) run on the loop's first iteration alone (``if i == 0:``)."""
    for frame in frames_inside(clear, loop):
        if frame.kind is FrameKind.BRANCH and type(frame.node) is cst.If and frame.branch == "if" and not step.inside(frame):
            first = _first_iteration_test(model, frame.node.test, loop)
            if first is not None:
                return first
    return None


def _uncleared_in_step_method(model: LoopModel, root: Root) -> Iterator[Report]:
    """A function with no loop that clears one network's gradients on every call, but not another's that it steps.

    ``def step(self, data)`` of a GAN: both backwards, ``self.discriminator.optimizer.step()``,
    ``self.generator.zero_grad()``, the generator's backward and ``self.generator.optimizer.step()``.
    The function is one batch's update (it clears per call); the discriminator, whose optimizer
    holds only its own parameters, is never cleared, so each of its steps applies every earlier
    batch's gradients too. Only where each network is built from a class of the module whose
    optimizer is built over ``self.parameters()`` (so the clear of one cannot reach the other),
    every clear of the function names such a network or its optimizer, nothing the function cannot
    see is handed the stepped network or its optimizer, and no loop of the run calls the function
    (that loop may clear beside the call).
    """
    function = root.node
    if type(function) is not cst.FunctionDef or model.index is None or function.name.value in model.called_in_loop:
        return
    if any(e.loops for e in root.events):
        return  # a loop of its own, or read as one iteration of its callers' loop: the loop checks judge it
    zeros = [e for e in root.events if e.kind is EventKind.ZERO and not e.recovers]
    cleared_networks = [_own_network(model, z.target, z.target_kind) for z in zeros]
    if not zeros or None in cleared_networks:
        return  # nothing cleared here (the caller clears), or a clear whose reach is not known
    stepped = [e for e in root.events if e.kind is EventKind.STEP and e.framework is None and e.target is not None]
    stepped_networks = {id(step): _own_network(model, step.target, ObjKind.OPTIMIZER) for step in stepped}
    if not any(stepped_networks[id(step)] in cleared_networks for step in stepped):
        return  # the function clears no network it steps: its clears are not the per-batch clears
    for step in stepped:
        network = stepped_networks[id(step)]
        if network is None or network in cleared_networks:
            continue
        if not any(e.kind is EventKind.BACKWARD and root.order(e) < root.order(step) for e in root.events):
            continue
        if any(
            e.kind == HANDOFF and e.target is not None and _names_network(e.target, network) and handoff_may_clear(e, model.keeps_handed)
            for e in root.events
        ):
            continue
        if _released(model, step.target):
            continue
        cleared = next(z for z, n in zip(zeros, cleared_networks) if n is not None)
        yield Report(
            step.node,
            f"`{step.target}` is stepped at line {model.line(step.node)} but `{function.name.value}`, which clears "
            f"`{cleared.target}` on every call (line {model.line(cleared.node)}), never clears `{network}`: each step "
            f"also applies every earlier call's gradients",
            fix=fixes.add_zero_grad(model, step), event=step,
        )


def _names_network(target: str, network: str) -> bool:
    """Whether ``target`` is ``network`` or something it holds (``self.netD.optimizer`` for ``self.netD``)."""
    return target == network or target.startswith(network + ".") or network.startswith(target + ".")


def _own_network(model: LoopModel, target: str | None, kind: ObjKind) -> str | None:
    """The network whose gradients a clear or a step reaches, where it is certain: an instance of a class of the
    module (``self.discriminator = Discriminator(...)``), cleared itself (``self.discriminator.zero_grad()``) or
    through the optimizer its class builds over its own parameters (``self.discriminator.optimizer``, with
    ``self.optimizer = optim.Adam(self.parameters())`` in every class that assigns ``self.optimizer``)."""
    if target is None or model.index is None or "." not in target:
        return None
    if kind is ObjKind.MODEL:
        return target if _built_from_module_class(model, target) else None
    if kind is not ObjKind.OPTIMIZER:
        return None
    holder, _, attribute = target.rpartition(".")
    if holder in ("self", "cls") or not _built_from_module_class(model, holder):
        return None
    values = [v for table in model.index.assignments.values() for v in table.get(f"self.{attribute}", [])]
    if not values or not all(_over_own_parameters(v) for v in values):
        return None
    return holder


def _built_from_module_class(model: LoopModel, name: str) -> bool:
    """Whether every assignment of ``name`` in the module calls a class the module defines (``Generator(...)``)."""
    classes = {function_class for function_class in model.index.class_of.values() if function_class}
    values = [_unmoved(v) for table in model.index.assignments.values() for v in table.get(name, [])]
    return bool(values) and all(type(v) is cst.Call and callee_name(v) in classes for v in values)


# Methods that return the module they are called on (moved or cast): ``Generator(...).to(device)`` is a Generator.
_RETURNS_ITSELF = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval", "requires_grad_"})


def _unmoved(value: cst.BaseExpression) -> cst.BaseExpression:
    """``Generator(...)`` for ``Generator(...).to(device)``."""
    while type(value) is cst.Call and type(value.func) is cst.Attribute and value.func.attr.value in _RETURNS_ITSELF:
        value = value.func.value
    return value


def _over_own_parameters(value: cst.BaseExpression) -> bool:
    """Whether an assignment builds an object over ``self.parameters()`` alone (``optim.Adam(self.parameters(), lr=lr)``)."""
    if type(value) is not cst.Call or not value.args:
        return False
    first = value.args[0].value
    return type(first) is cst.Call and dotted_name(first.func) == "self.parameters" and not first.args


def _off_the_path(model: LoopModel, clear: Event, step: Event, loop: Frame, periodic: bool = True) -> str | None:
    """Where a clear (or a handoff that may clear) of the step's optimizer runs instead of on the path to the step,
    in words; None when it runs on that path.

    A clear counts only on the paths where it runs before the step that needs
    it (or after the step before the next one): not in the other branch of an
    ``if`` that is no accumulation guard (``if amp: opt.zero_grad(); ...
    scaler.step(opt) else: loss.backward(); opt.step()``), not in a branch
    that leaves the iteration before the step (``if not finite: opt.zero_grad();
    continue``), and, for a step that runs on every micro-batch, not under a
    periodic test of its own (``if step % 100 == 0: opt.zero_grad()``).
    Branches of an accumulation guard alternate between micro-batches, so a
    clear in one may serve a step in another (a clear at the window's start).
    """
    for frame in frames_inside(clear, loop):
        if frame.kind is not FrameKind.BRANCH or step.inside(frame):
            continue
        if frame.branch == "after" or type(frame.node) is not cst.If:
            continue
        if in_other_branch(step, frame) and not frame.accumulation:
            return f"only in the other branch of the `if` at line {model.line(frame.node)}"
    if leaves_before(clear, step):
        return "only on the iterations that leave before the step"
    scheduled = _scheduler_branch(model, clear, step, loop)
    if scheduled is not None:
        return f"only when a scheduler is set (`if {model.code(scheduled.node.test)}:` at line {model.line(scheduled.node)}), while the step runs without one"
    never = _never_with_count_one(model, clear, step, loop)
    if never is not None:
        remainder, count = never
        return f"only when `{model.code(remainder)}`, which never holds when `{model.code(count)}` is 1"
    setting = _only_with_accumulation_on(clear, step, loop)
    if setting is not None:
        return f"only with accumulation on (`{setting}` above 1), while the step runs with it off too"
    for frame in frames_inside(clear, loop):
        if frame.kind is not FrameKind.BRANCH or type(frame.node) is not cst.If or step.inside(frame) or frame.branch != "if":
            continue
        first = _first_iteration_test(model, frame.node.test, loop)
        if first is not None:
            return f"only when `{model.code(first)}` (line {model.line(frame.node)}), on the loop's first iteration"
        bounded = _index_bound_test(frame.node.test, loop)
        if bounded is not None:
            return (
                f"only while `{model.code(bounded)}` (line {model.line(frame.node)}), and the step runs on the other "
                f"iterations too"
            )
    if periodic and step.framework is None and not step.with_context("accumulate") and not any(
        f.kind is FrameKind.BRANCH and f.accumulation for f in frames_inside(step, loop)
    ):
        for frame in frames_inside(clear, loop):
            if frame.kind is FrameKind.BRANCH and type(frame.node) is cst.If and not step.inside(frame) and _periodic(frame.node.test):
                held = "" if frame.branch == "if" else " is false"  # "else", or the rest of the block after `if x: continue`
                return f"only when `{model.code(frame.node.test)}`{held} (line {model.line(frame.node)}), while the step runs on every iteration"
    return None


def _misplaced_clear(model: LoopModel, clear: Event, step: Event, loop: Frame) -> str | None:
    """How to fix a clear off the step's path that is itself the mistake (the one the user changes), else None."""
    if _scheduler_branch(model, clear, step, loop) is not None:
        return "clear outside the scheduler's branch"
    if _only_with_accumulation_on(clear, step, loop) is not None:
        return "clear after every step, whatever the count"
    never = _never_with_count_one(model, clear, step, loop)
    if never is not None:
        remainder = never[0].left
        shifted = f"({model.code(remainder.left)} - {model.code(never[0].comparisons[0].comparator)})"
        return f"test `{shifted} % {model.code(never[1])} == 0`, which holds for a count of 1 too"
    return None


def _only_with_accumulation_on(clear: Event, step: Event, loop: Frame) -> str | None:
    """The accumulation setting a clear runs only with on (``if update_interval > 1: opt.zero_grad()``), when the step
    runs with it off too; else None. The setting is a count named for accumulation or one an accumulation guard of the
    function divides by."""
    side = accumulation_side(clear, loop)
    if side is None or not side[1] or accumulation_side(step, loop) is not None:
        return None
    return side[0]


def _never_with_count_one(model: LoopModel, clear: Event, step: Event, loop: Frame) -> tuple[cst.Comparison, cst.BaseExpression] | None:
    """A test around a clear, not around the step, that compares a remainder by a count of the run with a literal 1 or
    more (``if it % iteration_per_update == 1:``), and the count: a remainder by 1 is always 0, so without
    accumulation the clear never runs. A count spelled as a literal (``% 4``) says it is never 1."""
    for frame in frames_inside(clear, loop):
        if frame.kind is not FrameKind.BRANCH or type(frame.node) is not cst.If or frame.branch != "if" or step.inside(frame):
            continue
        for conjunct in boolean_terms(frame.node.test, cst.And):
            if type(conjunct) is not cst.Comparison or len(conjunct.comparisons) != 1:
                continue
            target = conjunct.comparisons[0]
            remainder = conjunct.left
            if type(target.operator) is not cst.Equal or (number(target.comparator) or 0) < 1:
                continue
            if type(remainder) is cst.BinaryOperation and type(remainder.operator) is cst.Modulo and number(remainder.right) is None:
                if type(remainder.right) in (cst.Name, cst.Attribute):
                    return conjunct, remainder.right
    return None


def _scheduler_branch(model: LoopModel, clear: Event, step: Event, loop: Frame) -> Frame | None:
    """The branch around a clear that runs only when a scheduler is set (``if self.scheduler:``) and does not hold the
    step: without a scheduler the clear never runs while the step does."""
    for frame in frames_inside(clear, loop):
        if frame.kind is not FrameKind.BRANCH or type(frame.node) is not cst.If or frame.branch != "if" or step.inside(frame):
            continue
        if _scheduler_presence(model, frame.node.test) is not None:
            return frame
    return None


def _scheduler_presence(model: LoopModel, test: cst.BaseExpression) -> str | None:
    """The scheduler whose presence a test asks for (``if self.scheduler:``, ``if scheduler is not None:``), else None:
    a branch that runs only when the run was given a scheduler."""
    if type(test) is cst.Comparison and len(test.comparisons) == 1 and type(test.comparisons[0].operator) is cst.IsNot:
        if type(test.comparisons[0].comparator) is cst.Name and test.comparisons[0].comparator.value == "None":
            test = test.left
    name = dotted_name(test) if type(test) in (cst.Name, cst.Attribute) else None
    if name is None:
        return None
    info = model.objects.get(name)
    kind = info.kind if info is not None else kind_from_name(name)
    return name if kind is ObjKind.SCHEDULER else None


def _index_names(model: LoopModel, loop: Frame) -> set[str]:
    """The names of the loop's ``enumerate`` index from 0: the loop variable and attributes assigned only from it
    (``self.batch_index = b_idx``). Empty for other loops (``enumerate(loader, 1)`` counts from elsewhere)."""
    if type(loop.node) is not cst.For or type(loop.node.iter) is not cst.Call or callee_name(loop.node.iter) != "enumerate":
        return set()
    if len(loop.node.iter.args) != 1 or type(loop.node.target) is not cst.Tuple or not loop.node.target.elements:
        return set()
    index = loop.node.target.elements[0].value
    if type(index) is not cst.Name:
        return set()
    names = {index.value}
    if model.index is not None:
        names |= model.index.names_assigned_only_from(index.value)
    return names


def _first_iteration_test(model: LoopModel, test: cst.BaseExpression, loop: Frame) -> cst.BaseExpression | None:
    """A conjunct of ``test`` that holds only on the loop's first iteration: its ``enumerate`` index (or an attribute
    assigned only from it, ``self.batch_index = b_idx``) compared equal to 0."""
    names = _index_names(model, loop)
    for conjunct in boolean_terms(test, cst.And):
        if type(conjunct) is cst.Comparison and len(conjunct.comparisons) == 1 and type(conjunct.comparisons[0].operator) is cst.Equal:
            if number(conjunct.comparisons[0].comparator) == 0 and dotted_name(conjunct.left) in names:
                return conjunct
    return None


def _index_bound_test(test: cst.BaseExpression, loop: Frame) -> cst.Comparison | None:
    """The whole test when it orders the loop's own index, or a counter its body increments on every iteration
    (``steps += 1``), against a bound that is no literal (``if it < args.texture_from:``, ``if steps >
    h.disc_start_step:``): true on one run of iterations only, a phase of the loop. None for any other test."""
    if type(test) is not cst.Comparison or len(test.comparisons) != 1:
        return None
    operator = type(test.comparisons[0].operator)
    if operator not in (cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual):
        return None
    if number(test.left) is not None or number(test.comparisons[0].comparator) is not None:
        return None  # ``if i > 0:`` skips the first iteration (judged on its own), a literal bound is no phase switch
    index = loop_index(loop.node) if type(loop.node) is cst.For else None
    counters = ({index[0]} if index is not None else set()) | _counted_by(loop.node)
    sides = (dotted_name(test.left), dotted_name(test.comparisons[0].comparator))
    return test if any(c in sides and sides.count(c) == 1 for c in counters) else None


def _counted_by(loop: cst.For | cst.While) -> set[str]:
    """The names the loop's body counts its iterations with: ``steps += 1`` in the body itself, under no branch."""
    return {
        name for line in loop.body.body if type(line) is cst.SimpleStatementLine for small in line.body
        if type(small) is cst.AugAssign and type(small.operator) is cst.AddAssign and number(small.value) == 1
        and (name := dotted_name(small.target)) is not None
    }


def _periodic(test: cst.BaseExpression) -> bool:
    """Whether a test holds a remainder (``step % 100 == 0``): true on one iteration in so many."""
    return any(type(n) is cst.BinaryOperation and type(n.operator) is cst.Modulo for n in walk(test))


def _network_clears_leaving_parameters(model: LoopModel, root: Root) -> Iterator[Report]:
    """A loop that clears a network (``model.zero_grad()``) while its optimizer also holds another network's parameters.

    ``Adam(list(model.parameters()) + list(mtl.parameters()))`` with learnable loss weights ``mtl`` built beside the
    model, and only ``model.zero_grad()`` in the loop: ``mtl``'s gradients are never cleared, and every step applies
    their sum since the start. Reported at the clear (the line to change: clear the optimizer) when the optimizer is
    built in the module over networks' ``parameters()`` only, every clear of the loop names one of its networks, and
    one network it holds is built in the module with learnable layers, is called in the loss backpropagated before
    the step, and is used in no way but being called, moved and handed to the optimizer (it may be part of a cleared
    network otherwise). Not when anything else may clear: a call handed the optimizer, an inherited method.
    """
    constructions = _optimizer_constructions(model)
    if model.index is None or not constructions:
        return
    seen: set[tuple[int, int]] = set()
    for step, loop in steps_with_loops(root):
        if step.framework is not None or step.target is None:
            continue
        construction = construction_of(model, step, constructions)
        if construction is None or (id(loop), id(construction)) in seen or not holds_only_named_networks(model, construction):
            continue
        seen.add((id(loop), id(construction)))
        owners = owners_of_construction(model, construction)
        zeros = root.events_of(EventKind.ZERO, loop)
        cleared = [z for z in zeros if z.target is not None and any(related(z.target.removeprefix("self."), o.removeprefix("self.")) for o in owners)]
        if not cleared or len(cleared) < len(zeros) or any(z.target_kind in (ObjKind.OPTIMIZER, ObjKind.TENSOR) for z in cleared):
            continue  # no clear, or one that may be the optimizer's own or of anything else
        if any(_off_the_path(model, z, step, loop, periodic=True) is not None for z in cleared):
            continue  # a clear off the step's path is the loop's other finding
        if any(same_object(e.target, step.target) for e in root.events_of(HANDOFF, loop)):
            continue
        if calls_unseen_inherited_method(model, step, loop) or _released(model, step.target) or _step_clears_itself(model, step.target):
            continue
        names = {z.target.removeprefix("self.") for z in cleared}
        left = sorted(o for o in owners if not any(related(o.removeprefix("self."), n) for n in names))
        backwards = [b for b in root.events_of(EventKind.BACKWARD, loop) if b.loss is not None and root.order(b) < root.order(step)]
        for owner in left:
            found = _uncleared_network(model, owner, backwards)
            if found is None:
                continue
            spelled, backward, call, built = found
            zero = cleared[0]
            networks = " and ".join(dict.fromkeys(f"`{z.target}`" for z in cleared))
            yield Report(
                zero.node,
                f"the loop clears the gradients of {networks} only (`{model.code(zero.node)}`), but `{step.target}` "
                f"(built at line {model.line(construction)}) also holds `{spelled}`'s parameters (`{model.code(built.func)}`, called at "
                f"line {model.line(call)} for the loss backpropagated at line {model.line(backward.node)}): nothing "
                f"clears those, so each step at line {model.line(step.node)} also applies every earlier step's "
                f"gradients of `{spelled}`; clear the optimizer instead: `{step.target}.zero_grad()`",
                event=zero, against=(step,),
            )
            break


def _uncleared_network(model: LoopModel, owner: str, backwards: list[Event]) -> tuple[str, Event, cst.Call, cst.Call] | None:
    """``(network, backward, call, construction)`` when ``owner`` is a network the module builds with learnable layers, that
    a loss of ``backwards`` is computed through, and that is only called, moved and handed to an optimizer
    (``owner`` as the optimizer's construction names it: ``temperature`` for ``self.temperature.parameters()``)."""
    spellings = [s for s in (owner, f"self.{owner}") if model.index.assigned_anywhere(s)]
    if len(spellings) != 1:
        return None
    owner = spellings[0]
    values = model.index.assigned_anywhere(owner)
    if len(values) != 1 or type(values[0]) is not cst.Call:
        return None
    built = unmoved(values[0])
    if _layer_built_by(model, built) is None or freezes_itself(model, built):
        return None
    if not only_called_moved_and_gathered(model, owner) or requires_grad_switched_off(model, frozenset({owner})):
        return None
    for backward in backwards:
        call = next((c for c in calls_computing_loss(model, backward.loss) if dotted_name(c.func) == owner), None)
        if call is not None:
            return owner, backward, call, built
    return None


def _backward_before_loop(model: LoopModel, root) -> Iterator[Report]:
    """A backward before the training loop (a check, a debug print of gradients) whose gradients the first step applies.

    ``out.sum().backward()`` before ``for x, y in loader: loss.backward();
    opt.step(); opt.zero_grad()``: the loop clears only after stepping, so
    its first step adds the earlier backward's gradients to the first batch's.
    Only when the earlier loss comes from a model the optimizer was built
    over, and nothing between them clears, steps or takes the optimizer.
    """
    seen: set[tuple[int, str]] = set()
    for step, _ in steps_with_loops(root):
        outer = step.loops[0]
        key = (id(outer), last_name(step.target or ""))
        if step.target is None or key in seen:
            continue
        seen.add(key)
        sources = param_sources(model, step.target)
        iteration = root.events_in(outer)
        if not sources or not iteration:
            continue
        start = root.order(iteration[0])
        before = [e for e in root.events[:start] if not e.loops]
        backward = next((e for e in reversed(before) if e.kind is EventKind.BACKWARD), None)
        if backward is None or backward.framework is not None or backward.recovers:
            continue
        after = before[before.index(backward) + 1:]
        if any(_clears_or_steps(model, e, step.target) for e in after):
            continue
        if not _computed_by(model, backward, sources):
            continue
        first_clear = next((e for e in iteration if _clears_or_steps(model, e, step.target) and e.kind is not EventKind.STEP), None)
        first_step = next((e for e in iteration if e.kind is EventKind.STEP and same_object(e.target, step.target)), None)
        if first_clear is None or first_step is None or root.order(first_clear) < root.order(first_step):
            continue  # no clear at all is the loop's own finding; a clear before the step removes these gradients
        yield Report(
            backward.node,
            f"the gradients of this backward are not cleared before the loop at line {model.line(outer.node)}, which "
            f"clears `{step.target}` only after stepping: its first step at line {model.line(first_step.node)} applies "
            f"them too; clear `{step.target}` before the loop",
            event=backward, against=(first_step,),
        )


def _clears_or_steps(model: LoopModel, event: Event, optimizer: str) -> bool:
    if event.kind is EventKind.STEP:
        return event.target is None or same_object(event.target, optimizer)
    return _clears_or_may_clear(model, event, optimizer)


def _clears_or_may_clear(model: LoopModel, event: Event, optimizer: str | None) -> bool:
    """A clear of ``optimizer``'s gradients, or a handoff of it to code the module cannot see that may clear them."""
    if event.kind is EventKind.ZERO:
        return clears(model, event, optimizer)
    return event.kind == HANDOFF and same_object(event.target, optimizer) and handoff_may_clear(event, model.keeps_handed)


def _computed_by(model: LoopModel, backward: Event, sources: frozenset[str]) -> bool:
    """Whether the backpropagated loss is visibly computed by calling one of ``sources`` (the optimizer's models),
    itself or in a function of the module it calls (``loss = self.compute_loss(batch)``)."""
    if backward.loss is None or model.index is None:
        return False
    expressions = [backward.loss]
    name = dotted_name(backward.loss) or _root_of(backward.loss)
    function = function_holding(model, backward.node)
    if name is not None:
        expressions += [v for v in model.index.assignments.get(function, {}).get(name, []) if isinstance(v, cst.BaseExpression)]
    calls = [node for expression in expressions for node in model.file.walk(expression) if type(node) is cst.Call]
    if any(last_name(dotted_name(call.func) or "") in sources for call in calls):
        return True
    helpers = {model.index.resolve_function(call, function) for call in calls} - {None}
    return any(
        type(node) is cst.Call and last_name(dotted_name(node.func) or "") in sources
        for helper in helpers for node in model.file.walk(helper.body)
    )


def _root_of(expression: cst.BaseExpression) -> str | None:
    """``out`` for ``out.sum()`` or ``out[0].mean()``."""
    node = expression
    while type(node) in (cst.Call, cst.Attribute, cst.Subscript):
        node = node.func if type(node) is cst.Call else node.value
    return node.value if type(node) is cst.Name else None


def _may_share_parameters(model: LoopModel, step: Event, zeros: list[Event]) -> bool:
    """Whether a clear of another optimizer may clear this one's parameters: neither shows what it was built over.

    A step function gets its optimizers from elsewhere (``opt_g, opt_d =
    self.optimizers()``); two of them may hold the same parameters, and then
    clearing one clears the other.
    """
    if param_sources(model, step.target or ""):
        return False
    return any(
        z.target_kind is ObjKind.OPTIMIZER and not same_object(z.target, step.target) and not param_sources(model, z.target or "")
        for z in zeros
    )


def _steps_reapplying_gradients(model: LoopModel, root) -> Iterator[Report]:
    """A second step of one optimizer in the same iteration, after another backward and no clear since the first.

    ``loss_a.backward(); opt.step(); loss_b.backward(); opt.step()``: the
    second step sees ``loss_a``'s gradients plus ``loss_b``'s and applies
    ``loss_a``'s a second time.
    """
    for loop in root.loops():
        events = root.events_in(loop)
        last_step: dict[str, Event] = {}  # optimizer (last name) -> its latest step so far in this loop
        since: dict[str, list[Event]] = {}  # events after that step
        for event in events:
            for seen in since.values():
                seen.append(event)
            if event.kind is not EventKind.STEP or event.target is None or event.framework == "closure":
                continue
            if innermost_loop(event) is not loop:
                continue
            key = last_name(event.target)
            first = last_step.get(key)
            if (
                first is not None
                and first.loops == event.loops
                and not local_of_its_own(model, first.target, event.target, event.node)
                and not exclusive(first, event)
                and not leaves_before(first, event)
                and _in_one_run_of(model, loop, first, event)
                and not contradicting_settings(model, first.node, event.node, loop.node)  # ``if amp:`` ... ``else:`` twice
            ):
                between = since[key][:-1]
                backward = next((e for e in between if e.kind is EventKind.BACKWARD and not exclusive(e, event)), None)
                handled = any(_clears_or_may_clear(model, e, event.target) for e in between)
                if backward is not None and not handled and not _weights_restored_between(model, loop, first, event):
                    yield Report(
                        event.node,
                        f"`{event.target}` steps {_twice(model, first, event)} in the same iteration, with a backward "
                        f"at line {model.line(backward.node)} between and no clear: the second step applies the first "
                        f"step's gradients again; clear `{event.target}` before the second backward",
                        event=event, against=(first, backward),
                    )
                elif (
                    not handled
                    and not any(e.kind is EventKind.BACKWARD for e in between)
                    and first.target.removeprefix("self.") == event.target.removeprefix("self.")
                    and any(e.kind is EventKind.BACKWARD and not exclusive(e, first) for e in events[:events.index(first)])
                    and _side_by_side(first, event, events)
                ):  # two steps side by side (one under a guard beside an unguarded one is GL011's)
                    yield Report(
                        event.node,
                        f"`{event.target}` steps {_twice(model, first, event)} in the same iteration with no backward "
                        f"and no clear between: the second step applies the same gradients again (two updates per "
                        f"batch, and twice the momentum); drop one of the steps",
                        event=event, against=(first,),
                    )
            last_step[key] = event
            since[key] = []
        yield from _step_reapplying_last_iteration(model, root, loop, events)


# Methods that write saved weights back into a model (``self.model.set_params(old_weights)``)
_RESTORING_METHODS = frozenset({"load_state_dict", "set_params", "set_parameters", "set_weights", "load_params"})


def _weights_restored_between(model: LoopModel, loop: Frame, first: Event, second: Event) -> bool:
    """Whether the loop's own code writes saved weights back into a model between two steps (``old =
    model.get_params().clone()`` ... ``opt.step()`` ... ``model.set_params(old)`` ... ``opt.step()``): the first step is
    undone, and the second applies the first backward's gradients with its own once, from the saved weights (hindsight
    anchor learning's look-ahead step)."""
    holder = function_holding(model, first.node)
    if holder is None or function_holding(model, second.node) is not holder:
        return False
    start, end = model.line(first.node), model.line(second.node)
    for node in model.file.walk(loop.node):
        if type(node) is cst.Call and method_name(node) in _RESTORING_METHODS and node.args:
            if start < model.line(node) < end and model.info(dotted_name(receiver(node))).kind is not ObjKind.OPTIMIZER:
                return True
    return False


def _steps_twice_in_one_call(model: LoopModel, root) -> Iterator[Report]:
    """Two steps of one optimizer side by side after one backward, in a function's own code outside any loop
    (``scaler.step(opt); scaler.update(); opt.step()`` in an agent's ``update_actor``): every call updates twice with
    the same gradients, whoever calls it."""
    if type(root.node) is not cst.FunctionDef:
        return
    events = [e for e in root.events if not e.loops]
    for index, first in enumerate(events):
        if first.kind is not EventKind.STEP or first.target is None or first.framework is not None:
            continue
        if first.target_kind is not ObjKind.OPTIMIZER or not any(
            e.kind is EventKind.BACKWARD and not exclusive(e, first) for e in events[:index]
        ):
            continue
        for second in events[index + 1:]:
            if second.kind in (EventKind.BACKWARD, EventKind.ZERO) or second.kind is HANDOFF and same_object(second.target, first.target):
                break  # a new backward, or something that clears or may: no plain double step
            if second.kind is not EventKind.STEP or second.framework is not None or second.target != first.target:
                continue  # the very same name (``a.optimizers[0]`` and ``b.optimizers[0]`` are two optimizers)
            if exclusive(first, second) or not _side_by_side(first, second, events):
                continue
            yield Report(
                second.node,
                f"`{second.target}` steps {_twice(model, first, second)} with no backward and no clear between: the "
                f"second step applies the same gradients again (two updates per call, and twice the momentum); drop "
                f"one of the steps",
                event=second, against=(first,),
            )
            break


def _side_by_side(first: Event, second: Event, events: list[Event]) -> bool:
    """Whether two steps run on every pass that reaches the second: the same frames, or the first in a branch of an
    ``if`` that is no accumulation guard and whose other branch steps the same optimizer too (``if amp:
    scaler.step(opt) else: opt.step()`` followed by a leftover ``opt.step()``)."""
    shared = {id(f) for f in second.frames}
    if not shared <= {id(f) for f in first.frames}:
        return False
    extra = [f for f in first.frames if id(f) not in shared]
    if any(f.kind is not FrameKind.BRANCH or f.accumulation for f in extra):
        return False
    return all(
        any(
            e.kind is EventKind.STEP and e is not first and same_object(e.target, first.target)
            and any(g.kind is FrameKind.BRANCH and g.node is frame.node and g.branch != frame.branch for g in e.frames)
            for e in events
        )
        for frame in extra
    )


def _step_reapplying_last_iteration(model: LoopModel, root: Root, loop: Frame, events: list[Event]) -> Iterator[Report]:
    """The first of two steps of one optimizer in an iteration, when nothing clears it after the last one: it applies
    the gradients the previous iteration's last step used, again, with its own backward's.

    ``vae_loss.backward(); opt_g.step(); net_g.zero_grad(); adv_loss.backward(); opt_g.step()``: the clear sits
    between the two steps, so the next iteration's first step applies ``adv_loss``'s gradients a second time.
    Both steps run on every iteration (no branch around either inside the loop).
    """
    steps: dict[str, list[Event]] = {}
    for event in events:
        if (event.kind is EventKind.STEP and event.target is not None and event.framework is None
                and innermost_loop(event) is loop and not any(f.kind is FrameKind.BRANCH for f in frames_inside(event, loop))):
            steps.setdefault(last_name(event.target), []).append(event)
    for same in steps.values():
        first, last = same[0], same[-1]
        if first is last or first.node is last.node or not _in_one_run_of(model, loop, first, last):
            continue
        at_first, at_last = events.index(first), events.index(last)
        between = events[at_last + 1:] + events[:at_first]
        if any(_clears_or_may_clear(model, e, first.target) for e in between):
            continue
        backward = next((e for e in reversed(events[:at_first]) if e.kind is EventKind.BACKWARD), None)
        if backward is None or not any(e.kind is EventKind.ZERO and clears(model, e, first.target) for e in events[at_first:at_last]):
            continue  # no clear of it anywhere in the iteration: the loop's own finding above
        yield Report(
            first.node,
            f"`{first.target}` steps at line {model.line(first.node)} and again at line {model.line(last.node)} in each "
            f"iteration, but nothing clears it after the second step: the next iteration's first step applies the "
            f"gradients the second step used again, with those of the backward at line {model.line(backward.node)}; "
            f"clear `{first.target}` before that backward",
            event=first, against=(last, backward),
        )


def _twice(model: LoopModel, first: Event, second: Event) -> str:
    """``at line 3 and again at line 9``, or for one step reached through two calls, the lines of the calls."""
    if first.node is not second.node:
        return f"at line {model.line(first.node)} and again at line {model.line(second.node)}"
    parted = next(((a, b) for a, b in zip(first.call_chain, second.call_chain) if a is not b), None)
    if parted is None:
        return f"twice at line {model.line(first.node)}"
    return f"at line {model.line(first.node)} through the calls at lines {model.line(parted[0])} and {model.line(parted[1])}"


def _in_one_run_of(model: LoopModel, loop: Frame, first: Event, second: Event) -> bool:
    """Whether two events inside ``loop`` ran in one run of it.

    A helper that holds the loop, called twice (``try: train() except
    OutOfMemoryError: train()``), runs its loop twice: the events of the two
    calls share the loop's frame but never its iterations. They share a run
    when the calls through which their paths part lie inside the loop.
    """
    common = 0
    for a, b in zip(first.call_chain, second.call_chain):
        if a is not b:
            break
        common += 1
    parting = [chain[common] for chain in (first.call_chain, second.call_chain) if len(chain) > common]
    return all(lies_in(model, call, loop.node) for call in parting)


def _released(model: LoopModel, optimizer: str | None) -> bool:
    """Whether ``optimizer`` is set up for gradient release (optimi, torchtune, a per-parameter optimizer dict in hooks)."""
    return any(s.optimizer is not None and same_object(s.optimizer, optimizer) for s in model.release.setups)


class ZeroGradBetweenBackwardAndStep(Rule):
    """Gradients are cleared after ``backward()`` and before the ``step()`` that should use them.

    **Why it matters.** The step then sees zero (or ``None``) gradients: the
    model does not learn, or learns only from weight decay, and nothing fails.

    A closure handed to ``opt.step(closure=f)`` runs inside the step, before
    the update: a clear in it after its backward (Lightning manual
    optimization, ``self.manual_backward(loss); if boundary: opt.zero_grad()``)
    is between that backward and the step
    (``fixtures/realworld/gl002_clear_in_step_closure_after_manual_backward__studienarbeit.py``).

    **Fix.** Move the clear after the step (or before the backward).

    **Stays quiet when**

    - the clear runs in a closure handed to ``step(closure)`` before the
      closure's backward (``fixtures/realworld/ok_gl002_clear_in_step_closure_before_manual_backward__studienarbeit.py``),
      the step's closure is not seen, or the clear is in a nested function
      that steps first and clears after;
    - the clear sits in a branch that leaves before the step
      (``if not finite: opt.zero_grad(); continue``) or in an ``except``
      handler (out-of-memory recovery);
    - the clear reaches another optimizer's model, or a model the stepped
      optimizer is known not to be built from (``for p32, p16 in
      zip(fp32_model.parameters(), bf16_copy.parameters()): p32.grad =
      p16.grad.float(); p16.grad = None``);
    - a test on the parameter loop's own variables picks the gradients to
      drop (``for name, p in model.named_parameters(): if "prototypes" in
      name: p.grad = None``): parameters kept fixed for some iterations, or
      non-finite gradients skipped, on purpose; or the loop walks a
      collection picked elsewhere rather than all of a network's
      ``parameters()`` (TRPO's critic update drops the gradients of
      ``actor_params`` so that the step moves the value head only:
      ``fixtures/realworld/ok_gl002_shared_parameters_dropped_before_critic_step__RL4LMs.py``),
      or the parameter loop zeroes a gradient under a test of a value computed
      from it (a per-parameter clip that drops gradients far above its
      threshold);
    - the clear throws the update away on purpose: it sits under an ``if``
      the step does not share whose test is a flag saying so (``if
      ignore_grad:``, ``if skip_step:``, an entry of a dict, ``if
      stats["skip_example"]:``:
      ``fixtures/realworld/ok_gl002_gl003_window_dropped_on_flag_in_dict__atlas.py``) or a check of this batch's loss or
      gradient norm (a loss spike, a non-finite value, ``if loss != loss:``),
      not of a setting
      (``fixtures/realworld/ok_gl002_update_discarded_on_purpose__glide-finetune.py``,
      ``ok_gl002_cleared_when_the_loss_is_nan__NMTGMinor.py``);
    - the function that clears writes a gradient by hand before the step
      (``p.grad = torch.autograd.grad(loss, p)[0]``, Reptile's
      ``ref.grad.data.sub_(proto.data).add_(ref.data)``): the clear makes
      room for it
      (``fixtures/realworld/ok_gl002_gradient_assigned_after_clear__medical-imaging.py``,
      ``ok_gl002_reptile_meta_gradient_written_after_clear__NMTGMinor.py``);
    - in CUDA-graph code, ``graph.replay()`` is the backward that the step uses.

    **Bad**::

        loss.backward()
        optimizer.zero_grad()
        optimizer.step()

    **Good**::

        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    """

    code = "GL002"
    name = "zero-grad-between-backward-and-step"
    summary = "gradients are cleared between backward() and the step that should use them"
    severity = Severity.ERROR
    fix = FixKind.SAFE
    needs = ((BACKWARD, STEP),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            for backward, zero, step in clears_between_backward_and_step(model, root.events, probe_events(root)):
                yield Report(
                    zero.node,
                    f"`{model.code(zero.node)}` clears the gradients of the backward at line "
                    f"{model.line(backward.node)} before `{step.target}` steps at line {model.line(step.node)}: "
                    f"the step sees no gradients",
                    fix=fixes.move_after_step(model, zero, step),
                    event=zero, against=(backward, step),
                )


class ZeroGradInAccumulation(Rule):
    """The optimizer steps under an accumulation guard, but the gradients are cleared on every micro-batch.

    **Why it matters.** Gradient accumulation sums the gradients of several
    micro-batches before one step. A clear that runs on every micro-batch
    throws away all but the last, so the effective batch is one micro-batch
    and the accumulation only slows training down.

    **Fix.** Clear under the same guard as the step, right after it.

    **Stays quiet when**

    - the clear is under the same guard as the step, or in the window-start
      branch of the guard, or under a window-start flag (``if start:
      opt.zero_grad(); start = False``, with ``start = True`` right after the
      loop's stepping statement:
      ``fixtures/realworld/gl003_clear_at_window_start_continue_guard__mmf.py``);
    - the clear sits in a branch that leaves before the step (the micro-batches
      that never step), or in an ``except`` handler, or in the other branch of
      an ``if`` that is no accumulation guard (``if math.isnan(grad_norm):
      optimizer.zero_grad(); n = 0`` / ``else:`` ... the step:
      ``fixtures/realworld/gl003_nan_window_dropped__s3prl.py``), or under an
      ``if`` the step does not share that drops the update on purpose, as
      GL002 reads it (``if stats["skip_example"]: model.zero_grad()``);
    - the clear walks a list that is filled only right after each step (``for
      opt in stepped: opt.zero_grad()``), or belongs to a probe: a helper that
      backpropagates, reads the gradients and clears them, stepping nothing
      (``fixtures/realworld/gl002_probe_backward_in_first_step_helper__MeZO.py``);
    - the clear follows a step of its optimizer in the same branch, with no
      backward between (``if i == len(loader) - 1: optimizer.step();
      optimizer.zero_grad()`` flushes a last partial accumulation);
    - the clear runs only with accumulation off and the step only with it on,
      whether in two branches of one ``if`` on the setting or in two ``if``s
      (``if steps == 1: optimizer.zero_grad()`` ... ``if steps > 1: ...``),
      or the clear runs only with accumulation off whatever guards the step
      (``if accum_steps == 1: zero_grad()`` ... ``if not accumulate: step()``:
      ``fixtures/realworld/ok_gl003_clear_only_without_accumulation__TMRVC.py``);
    - the backwards of the micro-batches that do not step are visibly another
      optimizer's (their loss reaches only the networks of an optimizer cleared
      before and stepped after them): an actor cleared, backpropagated and
      stepped every ``policy_update_delay`` updates while the critics update on
      every one accumulates nothing (GL004 is quiet there too:
      ``fixtures/realworld/ok_gl003_policy_cleared_under_its_own_delay__REDQ.py``);
    - another optimizer steps on every pass after the same backward, before
      the guarded step: the guard schedules this optimizer's updates (a
      discriminator stepped where ``i % n_critic != 0``, both cleared every
      pass), it holds no window back (GL013 is quiet too:
      ``fixtures/realworld/ok_gl003_gl013_critic_stepped_on_schedule__HRNet-Hand-Pose-Estimation.py``);
    - the loop before a step outside any loop is a retry loop: the pass that
      gets through ends it (``try: ...backward() except OOM: chunk_size //= 2
      else: break``), so its clear drops only what a failed try left
      (``fixtures/realworld/ok_gl003_retry_loop_on_out_of_memory__tab-ddpm.py``);
    - the step's guard is a flag named for stepping (``if should_step:``)
      that is set only before the loop: the same on every micro-batch, it
      picks none of them
      (``fixtures/realworld/ok_gl003_step_flag_set_before_loop__DreamerVLA.py``);
    - the guard divides by a count that is always 1 where it runs, so it
      passes on every batch: a local set only to ``1``, or a framework
      setting held at 1 there (Lightning refuses ``accumulate_grad_batches``
      above 1 under manual optimization, so a manual module's
      ``self.trainer.accumulate_grad_batches`` is 1:
      ``fixtures/realworld/ok_gl003_accumulate_grad_batches_of_manual_module__naifu.py``;
      a count of the module's own configuration:
      ``fixtures/realworld/gl003_own_accumulation_count_of_manual_module__naifu.py``);
    - the loop over parameters that clears each gradient first copies it
      elsewhere (``self.optimizer.state[p]["previous_grad"] =
      p.grad.clone()``, ``grads.append(p.grad.clone())``): the accumulated
      gradients are kept, to be added back (sharpness-aware minimisation,
      ``fixtures/realworld/ok_gl003_gradients_saved_before_clearing_for_sam__batchflow.py``;
      dropped without a copy: ``fixtures/realworld/gl003_gradients_dropped_before_sam_backward__batchflow.py``).

    **Bad**::

        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            (loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                optimizer.step()

    **Good**::

        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()

    A clear under the same test as the step's guard but *before* the
    backward (``if (j + 1) % k == 0: optimizer.zero_grad()``, then the
    backward, then ``if (j + 1) % k == 0: optimizer.step()``) is flagged
    too: it runs on the micro-batch that steps and wipes the ``k - 1``
    micro-batches before it (``fixtures/realworld/gl003_clear_under_step_test_before_backward__dlrm.py``;
    a clear on the window's first micro-batch, ``if j % k == 0:``, tests
    something else and is right). The two tests may be spelled apart: the
    step after ``if (j + 1) % k: continue`` or in the ``else`` of ``if (j +
    1) % k:`` runs where ``(j + 1) % k == 0`` holds, and the clear and the
    step may sit in two helpers the iteration calls
    (``fixtures/realworld/gl003_clear_under_continue_guard_test_before_backward__mmf.py``).
    The guard may also count down the micro-batches left, whatever the count
    is called: ``if acc_batches > 1: acc_batches -= 1; continue`` before the
    step (``fixtures/realworld/gl003_clear_before_countdown_skip_guard__pytorch-cifar100.py``;
    a count of batches to skip while warming up, ``warmup``/``skip``/``wait``
    in its name, is no guard).

    A clear at the start of each epoch is flagged when the step's guard counts
    micro-batches across epochs (``self.global_step % k``, counted up in the
    batch loop and never set back in the epoch loop) and the batch loop clears
    after its own step: the last micro-batches of each epoch belong to the
    next epoch's first step, and the clear throws them away
    (``fixtures/accumulation/epoch_start_clear_with_counter_across_epochs.py``;
    quiet when the guard counts per epoch, ``(i + 1) % k`` of the batch loop's
    index or a counter set back each epoch, also at the start of the function
    the epoch loop calls, ``cur_step = 0`` in ``train_epoch``:
    ``fixtures/realworld/ok_gl003_counter_set_in_epoch_function__qlib.py``, or flushes the epoch's last
    micro-batches with an ``or`` clause, or steps them after the batch loop at the epoch's end:
    ``fixtures/accumulation/ok_epoch_start_clear_with_counter_per_epoch.py``).

    Inside ``with accelerator.accumulate(model):`` (an ``Accelerator`` built
    in the module with ``gradient_accumulation_steps``, or one handed in
    from elsewhere when the block itself tests ``sync_gradients``),
    accelerate skips the prepared optimizer's ``step()`` and
    ``zero_grad()`` until the micro-batch that syncs; ``model.zero_grad()``
    or a ``p.grad = None`` loop there runs on every micro-batch and is
    flagged too. The prepared optimizer's own ``zero_grad()`` *before* the
    block's backward is flagged as well (when it is prepared in the same
    function and every ``Accelerator`` of the module is given a count that
    may exceed 1): it runs on the micro-batch that syncs, before that
    micro-batch's backward, and clears what the earlier ones accumulated.

    **Stays quiet when** the step is a flush after an inner loop that steps
    under its own guard (``if n != 0: opt.step()`` after the batch loop of
    a function an epoch loop calls: the clear at the function's start is
    once per epoch,
    ``fixtures/realworld/gl003_epoch_start_clear_with_flush__GraphINVENT2.py``),
    the clear runs only on the loop's first micro-batch (``if cur_iter ==
    0:`` of its ``enumerate`` index, with a clear after each step:
    ``fixtures/realworld/ok_gl003_clear_on_first_micro_batch_only__TimeSformer.py``),
    the clear is in a block the loop runs once (``if
    not self._check_done: ...; self._check_done = True``, a one-time debug
    probe:
    ``fixtures/realworld/gl105_one_time_probe_and_rebuilt_scaler__zalo_ai_2025.py``),
    under the same guard as the step (or
    ``if accelerator.sync_gradients:``), leaves the loop early (``if not
    finite: zero_grad(); continue``), falls between backward and step
    (GL002's finding), clears the prepared optimizer inside
    ``accumulate()`` after the backward (also an optimizer whose origin is
    not in view, cleared right where it is stepped: ``for opt in
    self.optimizers.values(): opt.step(); opt.zero_grad()``,
    ``fixtures/realworld/gl003_prepared_optimizers_from_dict_values__HFTrainer.py``), or sits in the other branch of an
    ``if accumulation_steps > 1:`` that picks the mode once (its branches
    never alternate between batches). Inside ``accumulate()`` it is also
    quiet when the module builds an ``Accelerator`` that cannot accumulate
    (no count, or a literal 1), or when the accelerator comes from
    elsewhere and the block never tests ``sync_gradients``
    (``fixtures/realworld/gl003_*__DiffSynth-Studio.py``,
    ``gl003_*__alpaca_farm.py``).
    """

    code = "GL003"
    name = "zero-grad-in-accumulation"
    summary = "the step is under an accumulation guard but the clear runs every micro-batch"
    severity = Severity.ERROR
    fix = FixKind.SAFE
    needs = ((BACKWARD, STEP),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        settled = Settled()
        for root in model.roots:
            for report in _ungated_clears_in_accumulate(model, root):
                if report.node not in settled:
                    yield report
            for report in _epoch_start_clears(model, root):
                if report.node not in settled:
                    yield settled.note(report)
            probes = probe_events(root)
            between = {id(zero) for _, zero, _ in clears_between_backward_and_step(model, root.events, probes)}
            for zero, backward, step, guard in _boundary_clears_before_backward(model, root):
                if zero.node not in settled and id(zero) not in between:
                    yield settled.note(
                        Report(
                            zero.node,
                            f"`{model.code(zero.node)}` runs on the micro-batch that steps (it tests what the step's "
                            f"guard at line {model.line(guard.node)} tests), but before that micro-batch's "
                            f"backward at line {model.line(backward.node)}: it clears what the earlier micro-batches "
                            f"accumulated, so only the last one's gradients reach `{step.target}`'s step; clear right "
                            f"after the step instead",
                            event=zero, against=(backward, step),
                        )
                    )
            unguarded: dict[int, list[Event]] = {}  # per loop: the clears under no accumulation guard of an iteration
            after_loops = [(step, acc.frame, acc) for step, acc in steps_after_loops(model, root)]
            for step, loop, acc in [(s, l, accumulation(root, s, l)) for s, l in steps_with_loops(root)] + after_loops:
                if acc is None or _flushes_inner_loop(root, step, loop):
                    continue
                if acc.style == "guard":
                    if id(loop) not in unguarded:
                        zeros = root.events_of(EventKind.ZERO, loop)
                        unguarded[id(loop)] = [z for z in zeros if not any(f.accumulation for f in frames_inside(z, loop))]
                    candidates = unguarded[id(loop)]
                else:
                    candidates = root.events_of(EventKind.ZERO, acc.frame)
                for zero in candidates:
                    if zero.node in settled or id(zero) in between or id(zero) in probes or not clears(model, zero, step.target):
                        continue
                    if split_by_setting(zero, step):
                        continue  # ``if accum_steps > 1: ...step... else: zero_grad()...``: the modes never mix
                    side = accumulation_side(zero, loop)
                    if side is not None and not side[1]:
                        continue  # ``if accum_steps == 1: zero_grad()``: it runs only where nothing accumulates
                    if leaves_before(zero, step):
                        continue  # a reset on the micro-batches that leave the loop early, not a clear on every one
                    if _clears_only_what_stepped(model, root, zero):
                        continue  # ``for opt in stepped: opt.zero_grad()`` with ``stepped.append(opt)`` after each step
                    if _recovers_instead_of_stepping(zero, step):
                        continue  # ``if isnan(norm): zero_grad(); n = 0 else: ...step...``: not every micro-batch
                    if discards_update(model, zero, step):
                        continue  # ``if stats["skip_example"]: model.zero_grad()``: only where a check drops the window
                    if _follows_own_step(root, zero, loop):
                        continue  # ``if i == len(loader) - 1: opt.step(); opt.zero_grad()``: it clears what a step used
                    if _under_window_start_flag(model, zero, step, loop):
                        continue  # ``if start: clear; start = False`` ... ``step; start = True``: once per window
                    if runs_once(model, zero, loop):
                        continue  # ``if not self._check_done: ...; self._check_done = True``: a one-time probe
                    if _first_iteration_only(model, zero, step, loop) is not None:
                        continue  # ``if cur_iter == 0: opt.zero_grad()``: once, before the first window (GL001 weighs it)
                    if _saves_before_clearing(model, zero):
                        continue  # ``state[p]["previous_grad"] = p.grad.clone(); p.grad = None``: kept, maybe added back
                    yield settled.note(
                        Report(
                            zero.node,
                            f"`{model.code(zero.node)}` runs on every micro-batch but `{step.target}` only steps "
                            f"{_step_place(model, step, acc)}: only the last micro-batch's gradients reach the step"
                            f"{_undivided_too(model, root, acc, zero)}",
                            # After a loop of a function run once per epoch, whether the step belongs in the loop
                            # or the clear after the step (the epoch one window) is the author's call.
                            fix=fixes.move_after_step(model, zero, step) if step.loops else None,
                            event=zero, against=(step,),
                        )
                    )


def _saves_before_clearing(model: LoopModel, zero: Event) -> bool:
    """Whether a clear of each parameter's gradient in a loop over parameters comes after the loop body copies that
    gradient elsewhere (``self.optimizer.state[p]["previous_grad"] = p.grad.clone()``, ``grads.append(p.grad.clone())``):
    the accumulated gradients are kept, to be added back later (sharpness-aware minimisation's micro-batches)."""
    if not zero.manual:
        return False
    loop = next((f for f in reversed(zero.frames) if f.kind is FrameKind.LOOP and type(f.node) is cst.For), None)
    if loop is None:
        return False
    names = {n.value for n in walk(loop.node.target) if type(n) is cst.Name}
    line = model.line(zero.node)
    for node in walk(loop.node.body):
        if model.line(node) >= line:
            continue
        if type(node) is cst.Assign and not any(is_grad(t.target) for t in node.targets):
            value = node.value
        elif type(node) is cst.Call and method_name(node) in ("append", "extend", "copy_", "add_"):
            value = node
        else:
            continue
        if any(is_grad(n) and type(n.value) is cst.Name and n.value.value in names for n in walk(value)):
            return True
    return False


def _flushes_inner_loop(root: Root, step: Event, loop: Frame) -> bool:
    """Whether ``step`` flushes what an inner loop left (``for batch in loader: ... if n % k == 0: opt.step()`` then
    ``if n != 0: opt.step()`` after it, in a function an epoch loop calls): the outer loop's iterations are epochs,
    and a clear at their start is no clear of every micro-batch."""
    if not step.inside(loop) or any(f.kind is FrameKind.LOOP for f in frames_inside(step, loop)):
        return False
    return any(
        e is not step and same_object(e.target, step.target) and any(f.kind is FrameKind.LOOP for f in frames_inside(e, loop))
        for e in root.events_of(EventKind.STEP, loop)
    )


def _steps_in_accumulate(root: Root) -> Iterator[tuple[Event, Frame, AccumulateContext]]:
    """Each plain optimizer step inside a framework's accumulation context (``with accelerator.accumulate(model):``)
    with no accumulation guard of its own: (step, the ``with`` block, the context's declaration)."""
    for step in root.events_of(EventKind.STEP):
        if step.via_scaler is not None or step.framework is not None:
            continue
        block = next((f for f in reversed(step.frames) if f.kind is FrameKind.WITH and f.context == "accumulate"), None)
        if block is None or any(f.accumulation for f in frames_inside(step, block)):
            continue
        found = frameworks.accumulate_call(block)
        if found is not None:
            yield step, block, found[0]


def _ungated_clears_in_accumulate(model: LoopModel, root) -> Iterator[Report]:
    """Clears inside a framework's accumulation context (``with accelerator.accumulate(model):``) that the framework
    does not skip between steps.

    The framework skips a prepared optimizer's ``step()`` and ``zero_grad()``
    until the micro-batch that syncs; ``model.zero_grad()`` and a
    hand-written ``p.grad = None`` loop are plain PyTorch and run every time.
    Only where the module builds the framework's object with an accumulation
    count that may be above 1: without one, every micro-batch syncs.
    """
    settings = framework_settings(model)
    for step, block, declared in _steps_in_accumulate(root):
        setting = settings.accumulation_of(declared.settings)
        built_accumulating = any(counts_more_than_one(count) for count in setting.counts)
        if not built_accumulating and setting.built:
            continue  # built without a count that may exceed 1: every micro-batch syncs
        if not root.events_of(EventKind.BACKWARD, block):
            continue  # nothing is backpropagated in the block: no gradients for the clear to lose
        if not built_accumulating and not _tests_sync_flag(model, root, block, declared):
            continue  # the framework's object comes from elsewhere, and nothing here says a micro-batch may not sync
        backwards = root.events_of(EventKind.BACKWARD, block)
        for zero in root.events_of(EventKind.ZERO, block):
            # The optimizer's own clear, also when its kind is unknown (``for opt in self.optimizers.values(): opt.step();
            # opt.zero_grad()``): prepared, the framework skips it with the step; plain, both run every micro-batch.
            if zero.target_kind is ObjKind.OPTIMIZER or _clears_what_it_steps(zero, step):
                report = _prepared_clear_before_backward(model, root, zero, step, block, backwards, declared)
                if report is not None:
                    yield report
                continue
            if not clears(model, zero, step.target):
                continue
            if any(f.accumulation for f in frames_inside(zero, block)) or leaves_before(zero, step):
                continue
            stepped = model.code(step.node.func.value) if type(step.node) is cst.Call and type(step.node.func) is cst.Attribute else step.target
            yield Report(zero.node, declared.clear_message(model.code(zero.node), model.line(block.node), stepped), event=zero, against=(step,))


def _clears_what_it_steps(zero: Event, step: Event) -> bool:
    """``opt.zero_grad()`` of the object ``opt.step()`` steps (``for opt in self.optimizers.values(): opt.step();
    opt.zero_grad()``), whatever its kind is known to be."""
    if zero.manual or type(zero.node) is not cst.Call or type(step.node) is not cst.Call:
        return False
    if same_object(zero.target, step.target):
        return True
    cleared, stepped = zero.node.func, step.node.func
    return (
        type(cleared) is cst.Attribute and type(stepped) is cst.Attribute
        and dotted_name(cleared.value) is not None and dotted_name(cleared.value) == dotted_name(stepped.value)
    )


def _plain_backward_in_accumulate(model: LoopModel, root) -> Iterator[Report]:
    """A plain ``loss.backward()`` of an undivided loss inside a framework's accumulation context whose framework divides
    only in its own backward: the context sums the micro-batches' gradients for the step on the one that syncs.

    Only where the module builds the framework's object with an accumulation count that may be above 1.
    """
    settings = framework_settings(model)
    reported: set[int] = set()
    for step, block, declared in _steps_in_accumulate(root):
        if declared.plain_backward_message is None:
            continue
        setting = settings.accumulation_of(declared.settings)
        if not any(counts_more_than_one(count) for count in setting.counts):
            continue  # no count that may exceed 1 in this module: every micro-batch may sync
        for backward in root.events_of(EventKind.BACKWARD, block):
            if backward.framework is not None or backward.normalised or id(backward.node) in reported:
                continue
            if backward.call_chain or type(backward.node) is not cst.Call or positional_args(backward.node):
                continue  # through a helper, or with a given gradient: not judged here
            reported.add(id(backward.node))
            yield Report(
                backward.node, declared.plain_backward_message(model.code(backward.node), model.line(block.node)),
                event=backward, against=(step,),
            )


def _step_place(model: LoopModel, step: Event, acc) -> str:
    """Where the step sits, for GL003's message: its line too when no loop holds it (a function run once per epoch)."""
    place = accumulation_place(model, acc)
    return place if step.loops else f"at line {model.line(step.node)}, {place}"


def _under_window_start_flag(model: LoopModel, zero: Event, step: Event, loop: Frame) -> bool:
    """Whether a clear runs under a flag that marks a window's start: ``if should_start_update:`` whose branch sets it
    to False, while the statement of the loop that steps is followed, in its own block, by setting it to True.

    ``if start: opt.zero_grad(); start = False`` ... ``if (i + 1) % k: continue`` / ``finish_update(); start =
    True``: the clear runs on the first micro-batch after each step, as a clear at the window's start does.
    """
    parents = model.parents or {}
    for frame in frames_inside(zero, loop):
        if frame.kind is not FrameKind.BRANCH or type(frame.node) is not cst.If or frame.branch != "if" or step.inside(frame):
            continue
        flag = dotted_name(frame.node.test) if type(frame.node.test) in (cst.Name, cst.Attribute) else None
        if flag is None or not _sets_flag(frame.node.body, flag, "False"):
            continue
        stepping = next((call for call in step.call_chain if lies_in(model, call, loop.node)), step.node)
        while stepping is not None and type(parents.get(stepping)) is not cst.IndentedBlock:
            stepping = parents.get(stepping)
        block = parents.get(stepping) if stepping is not None else None
        if block is None or not lies_in(model, block, loop.node):
            continue
        later = block.body[block.body.index(stepping) + 1:]
        if any(type(s) is cst.SimpleStatementLine and _sets_flag(s, flag, "True") for s in later):
            return True
    return False


def _sets_flag(node: cst.CSTNode, flag: str, value: str) -> bool:
    """Whether ``node`` holds, at its own level (not in a nested block), ``flag = value``."""
    statements = node.body if type(node) in (cst.IndentedBlock, cst.SimpleStatementSuite) else [node]
    for statement in statements:
        smalls = statement.body if type(statement) is cst.SimpleStatementLine else [statement]
        for small in smalls:
            if type(small) is cst.Assign and len(small.targets) == 1 and dotted_name(small.targets[0].target) == flag:
                if type(small.value) is cst.Name and small.value.value == value:
                    return True
    return False


def _boundary_clears_before_backward(model: LoopModel, root: Root) -> Iterator[tuple[Event, Event, Event, Frame]]:
    """Clears under a test identical to the accumulating step's guard, before the backward of the same micro-batch.

    ``if (j + 1) % k == 0: optimizer.zero_grad()`` / ``loss.backward()`` / ``if (j + 1) % k == 0:
    optimizer.step()`` (DLRM): the clear runs on the micro-batch that steps, and wipes the
    ``k - 1`` micro-batches before it. A clear on the window's first micro-batch tests something
    else (``j % k == 0``) and is right.
    """
    for step, loop in steps_with_loops(root):
        acc = accumulation(root, step, loop)
        if acc is None or acc.style != "guard" or type(acc.frame.node) is not cst.If:
            continue
        selects = _micro_batches_selected(model, acc.frame)
        at = root.order(step)
        for zero in root.events_of(EventKind.ZERO, loop):
            if not clears(model, zero, step.target) or leaves_before(zero, step) or not _in_one_run_of(model, loop, zero, step):
                continue  # (a helper inlined at two call sites shares its loop: each copy is judged alone)
            same_test = any(
                f.kind is FrameKind.BRANCH and f.accumulation and type(f.node) is cst.If
                and _micro_batches_selected(model, f, _test_at_call(model, zero, f)) == selects
                and not _counter_changed_between(model, f.node, acc.frame.node, loop)
                for f in frames_inside(zero, loop)
            )
            if not same_test:
                continue
            later = [
                b for b in acc.backwards
                if root.order(zero) < root.order(b) < at and not exclusive(b, zero) and _in_one_run_of(model, loop, zero, b)
            ]
            if later and not _others_backwards_only(model, root, loop, step, _off_the_guards_test(model, acc, loop)):
                yield zero, later[0], step, acc.frame


def _counter_changed_between(model: LoopModel, first: cst.If, second: cst.If, loop: Frame) -> bool:
    """Whether a name the two tests read is assigned between them (``if n % k == 0: clear`` / ``n += 1`` / ... /
    ``if n % k == 0: step``): the same words test different counts, the clear opening the window the step closes."""
    read = {dotted_name(n) for n in walk(first.test) if type(n) in (cst.Name, cst.Attribute)} - {None}
    start, end = model.line(first), model.line(second)
    for node in walk(loop.node):
        if type(node) not in (cst.Assign, cst.AugAssign):
            continue
        targets = [t.target for t in node.targets] if type(node) is cst.Assign else [node.target]
        if not any(dotted_name(t) in read for t in targets):
            continue
        if start < model.line(node) < end and not lies_in(model, node, first) and not lies_in(model, node, second):
            return True
    return False


def _off_the_guards_test(model: LoopModel, acc, loop: Frame) -> list[Event]:
    """The accumulated backwards that run on the micro-batches the guard does not select: under no branch testing
    what the step's guard tests (``if (i + 1) % k == 0:`` written twice selects the same micro-batches)."""
    selects = _micro_batches_selected(model, acc.frame)
    return [
        b for b in acc.backwards
        if not any(
            f.kind is FrameKind.BRANCH and type(f.node) is cst.If and _micro_batches_selected(model, f) == selects
            for f in frames_inside(b, loop)
        )
    ]


def _others_backwards_only(model: LoopModel, root: Root, loop: Frame, step: Event, backwards: list[Event]) -> bool:
    """Whether each backward of the micro-batches that do not step is visibly another optimizer's: its loss reaches
    networks of an optimizer cleared before it and stepped after it, and none of ``step``'s optimizer's. Then nothing
    accumulates for this step between its windows (REDQ: the Q loss on every update, the policy's clear, backward and
    step only every ``policy_update_delay`` updates)."""
    mine = parameter_owners(model, step.target or "")
    if not backwards or not mine:
        return False
    others = {
        s.target: parameter_owners(model, s.target)
        for s in root.events_of(EventKind.STEP, loop) if s.target is not None and not same_object(s.target, step.target)
    }
    for backward in backwards:
        if reaching_call(model, backward, mine) is not None:
            return False
        at = root.order(backward)
        owner = next((
            name for name, owners in others.items()
            if owners and reaching_call(model, backward, owners) is not None
            and any(root.order(z) < at and clears(model, z, name) for z in root.events_of(EventKind.ZERO, loop))
            and any(root.order(s) > at and same_object(s.target, name) for s in root.events_of(EventKind.STEP, loop))
        ), None)
        if owner is None:
            return False
    return True


def _test_at_call(model: LoopModel, event: Event, branch: Frame) -> cst.BaseExpression:
    """The test of a branch of a helper the event was inlined through, as the call hands it its arguments
    (``self._step(batch, is_last=(i + 1) % k == 0)`` with ``if is_last: zero_grad()`` inside)."""
    test = branch.node.test
    function = function_holding(model, branch.node)
    if function is None or not event.call_chain:
        return test
    call = next((c for c in reversed(event.call_chain) if terminal(c.func) == function.name.value), None)
    return with_arguments(test, bind_arguments(function, call)) if call is not None else test


def _micro_batches_selected(model: LoopModel, branch: Frame, test: cst.BaseExpression | None = None) -> tuple[str, bool | None]:
    """Which micro-batches a branch of an ``if`` runs on: the remainder it tests and whether the branch runs where that
    remainder is zero (for a test that is no remainder, compared with 0 or bare: the whole test, and whether this is
    its ``if`` branch).

    ``if (i + 1) % k == 0:``, the ``else`` of ``if (i + 1) % k:`` and the rest of the block after ``if (i + 1) %
    k: continue`` all run where ``(i + 1) % k`` is zero: one guard spelled three ways.
    """
    test = branch.node.test if test is None else test
    while getattr(test, "lpar", ()):  # ``((i + 1) % k == 0)`` handed in with its parentheses
        test = test.with_changes(lpar=(), rpar=())
    negated = False
    while type(test) is cst.UnaryOperation and type(test.operator) is cst.Not:
        test, negated = test.expression, not negated
    true_when_zero = False  # a bare remainder is true where it is not zero
    if type(test) is cst.Comparison and len(test.comparisons) == 1 and number(test.comparisons[0].comparator) == 0:
        if type(test.comparisons[0].operator) in (cst.Equal, cst.NotEqual):
            true_when_zero = type(test.comparisons[0].operator) is cst.Equal
            test = test.left
    if type(test) is not cst.BinaryOperation or type(test.operator) is not cst.Modulo:
        return model.code(test), branch.branch == "if"
    runs_when_zero = true_when_zero != negated
    if branch.branch != "if":  # ``else``, or the rest of the block after an ``if`` that leaves
        runs_when_zero = not runs_when_zero
    return model.code(test), runs_when_zero


def _epoch_start_clears(model: LoopModel, root: Root) -> Iterator[Report]:
    """A clear at the start of each epoch while the accumulation guard counts micro-batches across epochs.

    ``for epoch ...: opt.zero_grad(); for batch ...: ...; global_step += 1;
    if global_step % k == 0: opt.step(); opt.zero_grad()``: the counter
    carries the last ``global_step % k`` micro-batches of an epoch over to a
    step in the next, but the clear at the epoch's start throws their
    gradients away, so the first step of every epoch sums fewer micro-batches
    than it divides by. Only where the batch loop clears after its own step
    (else the loop never clears: GL001), the counter is not reset or rebound
    in the epoch loop, and the guard has no clause that flushes the last
    micro-batches of an epoch (``or i == len(loader) - 1``).
    """
    seen: set[int] = set()
    for step, loop in steps_with_loops(root):
        acc = accumulation(root, step, loop)
        if acc is None or acc.style != "guard" or type(acc.frame.node) is not cst.If:
            continue
        outer = _loop_around(step, loop)
        counter = _counts_across(model, acc.frame.node.test, loop, outer) if outer is not None else None
        if counter is None:
            continue
        if not any(clears(model, z, step.target) and step.inside(acc.frame) and z.inside(acc.frame) for z in root.events_of(EventKind.ZERO, loop)):
            continue
        if _stepped_after_loop(root, step, loop, outer):
            continue
        first = root.events_in(loop)[0]
        for zero in root.events_of(EventKind.ZERO, outer):
            if id(zero) in seen or zero.inside(loop) or root.order(zero) > root.order(first):
                continue
            if any(f.kind is not FrameKind.WITH for f in frames_inside(zero, outer)) or not clears(model, zero, step.target):
                continue
            seen.add(id(zero))
            yield Report(
                zero.node,
                f"`{model.code(zero.node)}` at the start of each epoch throws away the micro-batches accumulated at the "
                f"end of the previous one: the guard `{model.code(acc.frame.node.test)}` at line "
                f"{model.line(acc.frame.node)} counts `{model.code(counter)}` across epochs, so those micro-batches belong to `{step.target}`'s "
                f"next step, which then sums fewer micro-batches than the loss is divided by; clear only after the step, "
                f"or count the micro-batches per epoch",
                event=zero, against=(step,),
            )


def _stepped_after_loop(root: Root, step: Event, loop: Frame, outer: Frame) -> bool:
    """Whether the epoch loop steps the same optimizer again after the batch loop (``for batch ...: ...; opt.step();
    opt.zero_grad()`` at the epoch's end): the micro-batches left over are applied there, and the clear at the next
    epoch's start finds nothing to throw away."""
    last = root.events_in(loop)[-1]
    return any(
        other.target == step.target and not other.inside(loop) and root.order(other) > root.order(last)
        for other in root.events_of(EventKind.STEP, outer)
    )


def _loop_around(event: Event, loop: Frame) -> Frame | None:
    """The loop directly around ``loop`` among the event's frames (the epoch loop around a batch loop)."""
    loops = event.loops
    at = next(i for i, f in enumerate(loops) if f is loop)
    return loops[at - 1] if at > 0 else None


def _counts_across(model: LoopModel, test: cst.BaseExpression, loop: Frame, outer: Frame) -> cst.BaseExpression | None:
    """What the guard ``test`` takes a remainder of, when it is a counter that the batch ``loop`` counts up and the
    epoch loop ``outer`` never sets back: not the batch loop's own index, nothing assigned in the epoch loop
    outside the batch loop (nor in the function holding the batch loop, when the epoch loop calls it); and no
    ``or`` clause that flushes an epoch's last micro-batches. Else None."""
    if any(type(n) is cst.BooleanOperation and type(n.operator) is cst.Or for n in model.file.walk(test)):
        return None
    remainders = [n for n in model.file.walk(test) if type(n) is cst.BinaryOperation and type(n.operator) is cst.Modulo]
    if len(remainders) != 1:
        return None
    counters = _counted_names(remainders[0].left)
    if not counters or type(loop.node) is not cst.For:
        return None
    if counters & {n.value for n in model.file.walk(loop.node.target) if type(n) is cst.Name}:
        return None  # ``for i, batch in enumerate(loader)``: counted per epoch
    counted_up = set()
    for node in model.file.walk(loop.node.body):
        if type(node) is cst.AugAssign and type(node.operator) is cst.AddAssign:
            counted_up.add(dotted_name(node.target))
    if not counters <= counted_up:
        return None
    scopes = [outer.node.body]
    holder = function_holding(model, loop.node)
    if holder is not None and holder is not function_holding(model, outer.node):
        scopes.append(holder.body)  # the batch loop's function, called once per epoch: ``cur_step = 0`` at its start
    for node in (n for scope in scopes for n in model.file.walk(scope)):
        if node is loop.node:
            continue
        if type(node) in (cst.Assign, cst.AnnAssign) and not lies_in(model, node, loop.node):
            targets = [t.target for t in node.targets] if type(node) is cst.Assign else [node.target]
            if any(dotted_name(t) in counters for t in targets):
                return None  # ``global_step = 0`` at the start of each epoch
    return remainders[0].left


def _counted_names(expression: cst.BaseExpression) -> set[str]:
    """The names a counter expression adds up (``global_step`` in ``global_step + 1``); empty when it holds anything
    else than names, attributes, numbers and sums."""
    if type(expression) in (cst.Name, cst.Attribute):
        name = dotted_name(expression)
        return {name} if name is not None else set()
    if type(expression) is cst.BinaryOperation and type(expression.operator) in (cst.Add, cst.Subtract):
        left, right = _counted_names(expression.left), _counted_names(expression.right)
        if (not left and number(expression.left) is None) or (not right and number(expression.right) is None):
            return set()
        return left | right
    return set()


def _clears_only_what_stepped(model: LoopModel, root: Root, zero: Event) -> bool:
    """``for opt in zero_grad_opts: opt.zero_grad()`` where every ``zero_grad_opts.append(opt)`` of the function
    comes right after a step, in the loop that holds it: the clear reaches only the optimizers that stepped."""
    cleared = zero.target or (dotted_name(receiver(zero.node)) if type(zero.node) is cst.Call else None)
    if cleared is None or "." in cleared:
        return False
    collection = next(
        (
            f.node.iter for f in zero.frames
            if f.kind is FrameKind.LOOP and type(f.node) is cst.For and type(f.node.target) is cst.Name
            and f.node.target.value == cleared and type(f.node.iter) is cst.Name
        ),
        None,
    )
    function = function_holding(model, zero.node)
    if collection is None or function is None:
        return False
    appends = [
        node for node in model.file.walk(function.body)
        if type(node) is cst.Call and callee_name(node) == "append" and dotted_name(receiver(node)) == collection.value
    ]
    steps = [e for e in root.events_of(EventKind.STEP) if function_holding(model, e.node) is function]
    return bool(appends) and all(
        any(
            model.line(step.node) < model.line(append) and step.loops and lies_in(model, append, step.loops[-1].node)
            for step in steps
        )
        for append in appends
    )


def _recovers_instead_of_stepping(zero: Event, step: Event) -> bool:
    """Whether the clear and the step sit in the two branches of an ``if`` that is no accumulation guard (``if
    math.isnan(grad_norm): optimizer.zero_grad(); accum = 0 / else: ... optimizer.step()``): the clear runs only on
    the micro-batches that test picks, dropping a bad window instead of stepping it."""
    sides = {id(f.node): f for f in step.frames if f.kind is FrameKind.BRANCH}
    return any(
        f.kind is FrameKind.BRANCH and id(f.node) in sides and sides[id(f.node)].branch != f.branch
        and not f.accumulation and not sides[id(f.node)].accumulation and not f.fixed
        for f in zero.frames
    )


def _follows_own_step(root: Root, zero: Event, loop: Frame) -> bool:
    """Whether ``zero`` comes right after a step of its optimizer in the same branch, no backward between.

    A last partial accumulation flushed under its own test (``if i == len(loader) - 1:``)
    steps and clears there: the clear drops only the gradients that step used.
    """
    events = root.events_in(loop)
    at = next(i for i, e in enumerate(events) if e is zero)
    for earlier in reversed(events[:at]):
        if earlier.kind is EventKind.BACKWARD:
            return False
        if earlier.kind is EventKind.STEP and same_object(earlier.target, zero.target):
            inside = frames_inside(earlier, loop)
            return bool(inside) and all(zero.inside(f) for f in inside)
    return False


def _tests_sync_flag(model: LoopModel, root, block, declared: AccumulateContext) -> bool:
    """Whether the accumulation block branches on the framework's sync flag (``sync_gradients``): it expects
    micro-batches that do not sync."""
    return any(
        f.accumulation and type(f.node) is cst.If and declared.sync_flag in model.code(f.node.test)
        for event in root.events_in(block)
        for f in frames_inside(event, block)
    )


def _prepared_clear_before_backward(
    model: LoopModel, root, zero: Event, step: Event, block, backwards, declared: AccumulateContext
) -> Report | None:
    """The prepared optimizer cleared inside the framework's accumulation block before the block's backward.

    The prepared optimizer's ``zero_grad`` runs only on the micro-batch that
    syncs, which the block marks on entering it: a clear before that
    micro-batch's backward throws away what the earlier ones accumulated.
    Only for an optimizer handed to the framework's ``prepare`` in the
    function of the block (a plain one clears and steps on every
    micro-batch), and where every construction of the framework's object in
    the module is given an accumulation count that may exceed 1.
    """
    setting = framework_settings(model).accumulation_of(declared.settings)
    if setting.without_count or not all(counts_more_than_one(c) for c in setting.counts):
        return None  # some construction of the module syncs on every micro-batch: the clear may be the plain one
    name = last_name(zero.target or "")
    function = function_holding(model, block.node)
    if not name or name != last_name(step.target or "") or function is None or not declared.prepared_in(model.file, function, name):
        return None
    if any(f.accumulation for f in frames_inside(zero, block)) or leaves_before(zero, step):
        return None
    after = [b for b in backwards if root.order(zero) < root.order(b) < root.order(step)]
    if not after or root.order(zero) > root.order(step):
        return None
    return Report(
        zero.node,
        declared.early_clear_message(model.code(zero.node), model.line(after[0].node), model.line(block.node), model.code(step.node)),
        event=zero, against=(after[0], step),
    )


def _undivided_too(model: LoopModel, root, acc: Accumulation, zero: Event) -> str:
    """GL004's half of the same loop, told in GL003's message: one problem, one finding.

    The backward named is the first undivided one after the clear (the one whose gradients the
    clear lets through), else the first of the loop.
    """
    undivided = [b for b in acc.backwards if not _divided_for_step(b)]
    undivided.sort(key=lambda b: root.order(b) < root.order(zero))
    if not undivided or _deliberate_sum(model, root, acc):
        return ""
    count = f"`{model.code(acc.count)}`" if acc.count is not None else "the number of micro-batches"
    return f"; once the clear moves, also divide the loss of the backward at line {model.line(undivided[0].node)} by {count}"


def _mean_of_own_micro_batch(model: LoopModel, backward: Event, acc: Accumulation, loop: Frame) -> cst.BaseExpression | None:
    """The divisor, when a loss is divided only by a count of its own micro-batch: a mean over that micro-batch alone.

    ``loss = torch.sum(nll) / (tokens + 1e-8) * dp_size`` with ``tokens = torch.sum(loss_mask)`` counted in the same
    iteration (in the loop's body, or in a helper the loop calls) from a tensor of the function's own: every value
    that scales the loss down has that shape, maybe times a rank factor (``dp_size``, the world size). A count made
    before the loop over the whole batch, an attribute, a parameter, or any other factor (``loss * scale``) may
    divide by the accumulated batch: then nothing is said.
    """
    if model.index is None or type(backward.loss) is not cst.Name:
        return None
    function = function_holding(model, backward.node)
    table = model.index.assignments.get(function, {})
    if function is None or any(dotted_name(n.target) == backward.loss.value for n in model.index.augmented.get(function, ())):
        return None
    divisor = None
    for value in table.get(backward.loss.value, []):
        if not isinstance(value, cst.BaseExpression) or not scales_down(value):
            continue
        while type(value) is cst.BinaryOperation and type(value.operator) is cst.Multiply and _rank_factor(model, value.right, table):
            value = value.left
        normalised = _weights_normalised_to_one(value)
        if normalised is not None:  # ``torch.dot(losses, weights / weights.sum())``: a weighted mean of its samples
            divisor = normalised
            continue
        if type(value) is not cst.BinaryOperation or type(value.operator) is not cst.Divide:
            return None
        count = _without_epsilon(value.right)
        if type(count) is not cst.Name or not _counted_in_iteration(model, count.value, function, table, acc, loop):
            return None
        divisor = value.right
    return divisor


def _weights_normalised_to_one(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """The sum in ``weights / weights.sum()`` (or ``/ torch.sum(weights)``) when that is every division of ``value``
    (``torch.dot(per_sample_loss, weights / weights.sum())``): weights that add up to one make a weighted mean of
    the micro-batch's samples, not a division by a count of micro-batches. None for any other value."""
    divisions = [n for n in walk(value) if type(n) is cst.BinaryOperation and type(n.operator) is cst.Divide]
    if not divisions:
        return None
    for division in divisions:
        numerator = dotted_name(division.left) if type(division.left) in (cst.Name, cst.Attribute) else None
        total = division.right
        summed = None
        if type(total) is cst.Call and callee_name(total) == "sum":
            if type(total.func) is cst.Attribute and not total.args:
                summed = dotted_name(total.func.value)
            elif len(total.args) == 1:
                summed = dotted_name(total.args[0].value)
        if numerator is None or summed != numerator:
            return None
    return divisions[0].right


def _without_epsilon(node: cst.BaseExpression) -> cst.BaseExpression:
    """``(tokens + 1e-8)`` read as ``tokens``."""
    if type(node) is cst.BinaryOperation and type(node.operator) is cst.Add:
        epsilon = number(node.right)
        if epsilon is not None and 0 < epsilon <= 1e-3:
            return node.left
    return node


_RANK_COUNT = re.compile(r"world_size|get_world_size|num_processes|num_replicas")


def _rank_factor(model: LoopModel, node: cst.BaseExpression, table: dict) -> bool:
    """``dp_size`` assigned only the world size, a mesh's named dimension (``mesh.size("dp")``) or 1: a factor over ranks."""

    def over_ranks(value: cst.BaseExpression) -> bool:
        if type(value) is cst.IfExp:
            return over_ranks(value.body) and over_ranks(value.orelse)
        if number(value) == 1:
            return True
        if type(value) is cst.Call:
            name = callee_name(value) or ""
            if name == "size":
                given = positional_args(value)
                return len(value.args) == 1 and bool(given) and type(given[0].value) is cst.SimpleString
            return bool(_RANK_COUNT.search(name)) and not value.args
        name = dotted_name(value)
        return name is not None and bool(_RANK_COUNT.search(last_name(name)))

    if over_ranks(node):
        return True
    values = table.get(dotted_name(node), []) if type(node) is cst.Name else []
    return bool(values) and all(isinstance(v, cst.BaseExpression) and over_ranks(v) for v in values)


# Counts of a tensor's entries: ``torch.sum(mask)``, ``mask.sum()``, ``mask.numel()``, ``torch.count_nonzero(mask)``.
_COUNTS = frozenset({"sum", "numel", "count_nonzero"})


def _counted_in_iteration(
    model: LoopModel, name: str, function: cst.FunctionDef, table: dict, acc: Accumulation, loop: Frame
) -> bool:
    """Whether every value of ``name`` counts the entries of a tensor the function itself made (not ``self.``'s, not a
    parameter's), each counted once per micro-batch: in the accumulating loop's body, or in a helper it calls."""
    values = table.get(name, [])
    if not values:
        return False
    iteration = acc.frame.node if acc.style == "micro_loop" else loop.node  # what runs once per micro-batch
    loop_function = function_holding(model, iteration)
    for value in values:
        if type(value) is not cst.Call or callee_name(value) not in _COUNTS:
            return False
        counted = positional_args(value)[0].value if dotted_name(value.func) in ("torch.sum", "torch.count_nonzero") and value.args else (
            value.func.value if type(value.func) is cst.Attribute else None
        )
        if type(counted) is not cst.Name or counted.value not in table:
            return False  # not a tensor the function made
        made = [v.value if isinstance(v, Unpacked) else v for v in table[counted.value]]
        if function is loop_function and not all(lies_in(model, v, iteration) for v in (value, *made)):
            return False  # counted, or the tensor counted made, before the loop: the whole batch's
    return True


def _divided_for_step(backward: Event, division_counts: bool = True) -> bool:
    """Whether a backward's loss needs no division for accumulation: divided (unless ``division_counts`` is False: a
    mean over its own micro-batch), handed to a framework, or a given gradient."""
    return (
        (backward.normalised and division_counts)
        or backward.framework == "closure"  # the step's closure backpropagates: nothing accumulates
        or frameworks.divides_by_count(backward)
        or backward.with_context("accumulate")
        or backward.upstream
    )



class UnscaledAccumulatedLoss(Rule):
    """Gradients are accumulated over several micro-batches but the loss is not divided by their number.

    **Why it matters.** Accumulating N micro-batches sums N gradients. Without
    dividing the loss by N, the gradient is N times what the same batch
    would give in one piece. With SGD each step is N times too large: the
    learning rate is secretly multiplied by N. Adam and the optimizers built
    like it divide the update by the gradient's own scale, so the step
    barely changes; what the factor still moves is everything that compares
    the raw gradient with a constant: clipping thresholds, ``eps``, logged
    gradient norms. The message says which, from the class the optimizer is
    built from (both when that is unknown).

    Also reported: a loss divided by another count than the guard's
    (``loss / args.grad_accum`` while the step runs every
    ``args.accumulation_steps`` micro-batches, ``loss / 4`` under ``% 8``),
    when the two are certainly different: two settings of one object both
    named as accumulation counts that the module never ties together, or
    two different literals. A division by ``len(loader)`` or a batch size
    beside the guard's count is left alone.

    A loss divided by the guard's count at its backward whose every term was
    divided by the same count already (``weighted = loss * w / acc`` summed into
    ``total``, then ``(total / acc).backward()``) is divided by the count squared:
    reported at the outer division
    (``fixtures/realworld/gl004_loss_divided_twice_by_count__modalities.py``).

    And a loss term multiplied by the accumulation count that the other terms
    of the same loss are divided by (``l_total += a / self.accum_iters`` beside
    ``l_total += b * self.accum_iters``): the function's own division says what
    the count is, so this is reported even when the guard is in a caller of
    another file (``fixtures/realworld/gl004_loss_term_multiplied_by_count__traiNNer-redux.py``).

    Accumulation is read from a guard (``%``, a flag made from one, a count
    of samples or tokens against a virtual batch size, also with an "or last
    batch" clause: ``if samples_seen >= virtual_batch_size or is_last:``
    whose branch sets the count back), or from an inner loop of micro-batches
    (``for _ in range(accum)``, ``batch.chunk(k)``, a loader over the batch's
    sub-batches: ``fixtures/realworld/gl004_subbatch_means_summed__deepqmc.py``, or a ``while`` loop that
    runs until a counter it adds to reaches a threshold, also in a helper
    method whose caller steps), also a loop over a tensor split into pieces
    in a per-batch method with no loop around its step (a trainer's
    ``iteration(data)`` that splits the batch with ``chunk`` and steps once
    after the pieces:
    ``fixtures/realworld/gl004_chunks_of_batch_in_per_batch_method__homura.py``,
    or cuts a piece that starts at the loop's variable,
    ``global_batch[i : i + mini_batch]``:
    ``fixtures/realworld/gl004_slices_of_global_batch_in_step_method__cosmos-rl.py``;
    a ``range(accum)`` loop there counts when each pass draws a fresh batch,
    ``batch = next(data_iter)``, ``get_next_batch(loader)``, also with the
    last micro-batch run after the loop, ``range(accum - 1)`` under
    ``no_sync()`` then one more backward, reported there too:
    ``fixtures/realworld/gl004_micro_batches_drawn_in_step_function__lm-engine.py``;
    otherwise it may run anything, such as a re-forward of
    cached features whose every loss is the whole batch's:
    ``fixtures/realworld/ok_gl004_cached_features_reforwarded_per_micro_batch__open_clip.py``).

    The step may be in another file of the run: a function every
    definition of which steps the optimizer it is handed
    (``self.mp_trainer.optimize(self.opt)``) steps it at the call.

    **Fix.** Divide the loss before ``backward()``: ``(loss / accum).backward()``,
    ``loss = loss / accum`` or ``loss /= accum``. Frameworks that divide for you
    (``accelerator.backward``, DeepSpeed's ``engine.backward``) need nothing;
    Lightning's ``manual_backward`` and Fabric's ``fabric.backward`` divide by
    nothing (Lightning refuses ``accumulate_grad_batches`` under manual
    optimization), so the loss handed to them must be divided.

    **Stays quiet when**

    - the loop hands the gradients of two models to a comparison
      (``loose_close(torch_parm.grad, zero_parm.grad)``, ``assert
      torch.allclose(a.grad, b.grad)``): a test training two implementations
      side by side, both summing the same micro-batches on purpose
      (``fixtures/realworld/ok_gl004_parity_test_compares_gradients__InternEvo.py``);
    - the loss is divided on its way to backward (``loss / n``, ``loss /= n``,
      ``loss.mul_(mb_size / batch_size)``, a helper returning a divided loss
      (also a method of an object built from a class of the module,
      ``self.gradient_accumulator.scale_loss(loss)``:
      ``fixtures/realworld/gl004_loss_divided_by_accumulator_object__student_aware_distillation.py``);
      a division by the world size alone does not count: DDP already
      averages over ranks and the micro-batches are still summed; nor does a
      division by a count of the micro-batch's own tokens, made in the same
      iteration (``torch.sum(nll) / (torch.sum(loss_mask) + 1e-8)``, also in a
      helper the loop calls): a mean over one micro-batch, reported with the
      divisor named (``fixtures/realworld/gl004_micro_batch_token_mean__verl.py``;
      weights normalised to add up to one, ``torch.dot(losses, weights /
      weights.sum())``, make a weighted mean of one micro-batch too:
      ``fixtures/realworld/gl004_weighted_mean_loss_accumulated__modyn.py``;
      a count of the whole batch's tokens made before the loop divides:
      ``fixtures/accumulation/gl004_tokens_counted_over_whole_batch.py``); nor does
      a division by a running counter, ``n += 1`` per micro-batch and
      ``n = 0`` in the ``if n >= accum:`` branch that steps, which is 1, 2,
      ... rather than the count, and is reported on the division itself,
      the line to change (``fixtures/realworld/gl004_divided_by_running_counter__neural_sp.py``,
      stepped through an optimizer wrapper of another module:
      ``fixtures/crossfile/optimizer_wrapper_in_another_module``); a running average of the logged loss by
      that counter is no backward and is left alone),
      also when it then goes through apex's ``amp.scale_loss``, an fp16
      optimizer's ``optimizer.backward(loss)`` or a helper handed the loss;
      the loss may be given by keyword (``booster.backward(loss=loss / n,
      optimizer=optimizer)``); a sum of divided terms (``loss = ce_loss + z_loss``, both divided;
      not ``l1 + 0.5 * l2``, where only one term is scaled)
      and a divided element of a tuple a helper returns (``loss, ce_loss =
      self.train_micro_batch(...)``) count as divided; a division of the loss's
      name written where it cannot reach the backward does not (``loss =
      output.loss`` right before ``loss.backward()``, and ``loss =
      sum(losses) / len(losses)`` after the loop, for a log:
      ``fixtures/realworld/gl004_loss_averaged_for_log_after_micro_batch_loop__flame.py``);
    - a framework divides: ``accelerator.backward`` (inside ``accumulate()``
      too; a plain ``loss.backward()`` there is flagged, for ``accumulate()``
      divides nothing: ``fixtures/frameworks/gl004_plain_backward_in_accumulate.py``),
      Lightning, a DeepSpeed engine's ``backward`` (whatever the name
      ``deepspeed.initialize`` returned it under), or a plain ``loss.backward()``
      of a loss the engine computed (``loss = model_engine(x)``: from v0.18.3 the
      engine hooks the tensors its forward returns and divides their gradients:
      ``fixtures/realworld/ok_gl004_plain_backward_of_engine_output__deepspeed.py``);
    - the gradients are divided after accumulating: ``p.grad /= n``,
      ``p.grad.mul_(1 / n)``, ``scale_grads_(params, 1 / tokens)``,
      ``optimizer.multiply_grads(1 / n)`` (also by a name every assignment of
      which divides, ``factor = world_size / sample_size``:
      ``fixtures/realworld/ok_gl004_gradients_multiplied_by_named_factor__DeepLearningExamples.py``), Opacus ``virtual_step()``, a DDP
      communication hook that divides by more than the world size (also one
      a wrapper factory makes: ``register_comm_hook(None, wrap(allreduce_hook))``);
    - the backward feeds a given gradient (``y.backward(dy)``): there is no
      mean loss;
    - the divided loss is multiplied by a scale on its way (``(loss *
      loss_scale).backward()``:
      ``fixtures/realworld/ok_gl004_divided_loss_times_loss_scale__ProphetNet-GENIE.py``);
    - the backward is in a helper of the module and the caller divided the
      loss it hands it, also when the helper only renames it first (``loss =
      lm_loss; loss.backward()``:
      ``fixtures/realworld/gl006_clip_in_backward_step_of_while_true_window__GLM.py``);
    - the loss is what a function the module cannot see returns, handed an
      argument named as a normaliser (``compute_loss(..., rl_scale=rl_scale)``
      with ``rl_scale`` the window's token count, ``num_items_in_batch``,
      ``normalizer``): it may divide
      (``fixtures/realworld/gl004_loss_from_unseen_call_handed_token_scale__prime-rl.py``);
    - the backward is a helper the loop hands the count the step waits for
      (``self.student.backward(loss, ctx, grad_accum_rounds=accum)``, a model
      plugin's method): it may divide by it;
    - a clear of the stepping optimizer throws the backward's gradients away
      before any step, on every path the backward runs (a probe or warm-up
      backward followed by ``optimizer.zero_grad()``), or runs on every
      micro-batch that does not step (outside the guard, or in its other
      branch: ``if even: muon.step(); optimizers[1].zero_grad() else: ...``);
    - the loss is multiplied by a factor that may be ``1 / n``
      (``loss * grad_accum_scale``), though not by per-sample ``weights`` or a
      ``mask`` unless those were divided (``weights = mask / tokens_in_step``);
    - the sum is meant: the loss sums over samples or tokens, ``reduction="sum"``,
      or ``x.sum()`` of a visibly per-sample ``x`` (a criterion with
      ``reduction="none"``, elementwise arithmetic, a network's output, and no
      mean over the samples on the way: ``.mean(dim=[1, 2, 3])`` over each
      sample's own elements keeps one value per sample); a comment beside the loss saying the sum over samples,
      tokens or micro-batches is meant; or weight decay / learning rate scaled
      by the accumulation count (a recipe tuned for a nominal batch; the
      count's whole name, ``self.accumulation_steps``, not another attribute
      of ``self``:
      ``fixtures/realworld/gl004_weight_decay_restored_beside_undivided_loss__catalyst.py``). A sum of
      loss terms (``l1 + 0.5 * l2``: the factor weighs one term against the
      other, it divides nothing) or over the components of a loss whose parts
      are already means (``per_quantile_losses.sum()``, ``torch.stack([...]).sum()``)
      is no sum over samples, nor is the sum of what an unseen criterion returns
      (``fixtures/realworld/gl004_per_quantile_sum_accumulated__DeepLearningExamples.py``);
    - the loss is what a model returns whose ``forward``, in another file of the run,
      sums it over tokens (``_, loss, metrics = model(...)``, also through a function
      of the module returning it, with ``model = VALLE(...)`` and ``VALLE.forward(...,
      reduction="sum")`` returning ``total_loss`` made only of criteria reducing by
      ``reduction``; a forward that then divides by the token count is a mean:
      ``fixtures/crossfile/loss_summed_in_model_forward__icefall``,
      ``fixtures/crossfile/loss_averaged_in_model_forward__icefall``);
    - the clear runs on every micro-batch: nothing accumulates yet, and GL003
      reports that loop, naming the undivided loss in its message;
    - the backward sits in the branch of ``if accumulation_steps > 1:`` that
      does not accumulate (a setting, not a guard: the branches never
      alternate);
    - the backward is another optimizer's own: that optimizer is cleared
      before it and steps right after it on every path it runs (a GAN's
      ``opt_d.zero_grad(); d_loss.backward(); opt_d.step()`` on every batch
      beside a generator that accumulates:
      ``fixtures/gan/gan_generator_accumulates_discriminator_every_batch.py``).

    **Bad**::

        loss = loss_fn(model(x), y)
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()

    **Good**::

        loss = loss_fn(model(x), y) / accum
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """

    code = "GL004"
    name = "unscaled-accumulated-loss"
    summary = "gradients are accumulated over N micro-batches but the loss is not divided by N"
    severity = Severity.WARNING
    fix = FixKind.UNSAFE
    needs = ((BACKWARD, STEP),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        if any(e.framework == "comm_hook" for root in model.roots for e in root.events_of(GRAD_DIVIDE)):
            return  # a DDP communication hook normalises the accumulated gradients as it all-reduces them
        yield from _multiplied_by_the_count(model)
        for root in model.roots:
            yield from _plain_backward_in_accumulate(model, root)
            wiped: set[int] | None = None  # the steps whose micro-batches a clear on the stepping one wipes
            judged = [(step, loop, acc) for step, loop in steps_with_loops(root) if (acc := accumulation(root, step, loop))]
            # a per-batch method the caller runs (no loop around its step) whose own loop over the batch's chunks
            # backpropagates each before one step
            judged += [
                (step, acc.frame, acc) for step, acc in steps_after_loops(model, root)
                if _splits_a_batch(acc.frame.node) or _draws_a_batch_each_time(model, acc.frame.node)
            ]
            for step, loop, acc in judged:
                if any(not _undoes_loss_scale(model, e, acc.backwards) for e in root.events_of(GRAD_DIVIDE, loop)):
                    continue  # the accumulated gradients are divided by hand
                if acc.style == "micro_loop" and not (
                    _looks_like_micro_batches(model, acc.frame.node) or _splits_a_batch(acc.frame.node)
                ):
                    continue
                if _cleared_every_micro_batch(model, root, step, loop, acc):
                    continue  # nothing accumulates: GL003 reports the clear, the one line to change
                if wiped is None:
                    wiped = {id(s) for _, _, s, _ in _boundary_clears_before_backward(model, root)}
                if id(step) in wiped:
                    continue  # nothing accumulates either: GL003 reports the clear before the stepping backward
                if (acc.style == "guard" and type(acc.frame.node) is cst.If
                        and _others_backwards_only(model, root, loop, step, _off_the_guards_test(model, acc, loop))):
                    continue  # the other micro-batches backpropagate other optimizers' losses only: nothing accumulates
                yield from _wrong_divisors(model, acc, step)
                yield from _divided_twice(model, acc, step)
                if _deliberate_sum(model, root, acc):
                    continue
                if _compares_two_models_gradients(model, loop):
                    continue  # a parity test: both sides sum the same undivided losses, and the comparison is the point
                count = f"`{model.code(acc.count)}`" if acc.count is not None else "the number of micro-batches"
                undivided = False  # whether a backward of the loop was reported undivided
                for backward in acc.backwards:
                    own_mean = _mean_of_own_micro_batch(model, backward, acc, loop) if backward.normalised else None
                    if _divided_for_step(backward, own_mean is None) or _thrown_away(model, root, backward, step, loop):
                        continue
                    if _another_optimizers_micro_batch(root, backward, step, loop) or _handed_the_count(model, backward, acc):
                        continue
                    if _built_by_unseen_call_handed_a_normaliser(model, backward):
                        continue  # ``loss = compute_loss(..., rl_scale=rl_scale)``: it may divide by what it is handed
                    if _from_abstract_method(model, backward):
                        continue  # ``loss = self.forward_propagation(batch)``: each subclass's override decides
                    if _output_of_a_dividing_engine(model, backward):
                        continue  # ``loss = model_engine(x); loss.backward()``: the engine's output hooks divide it
                    division = _by_running_counter(model, backward)
                    if division is not None:  # the line to change is the division, and every backward of it is one finding
                        yield Report(
                            division,
                            f"`{model.code(division)}` divides by `{model.code(division.right)}`, a running micro-batch "
                            f"counter (1, 2, ... up to the step), not by {count}: gradients are accumulated for "
                            f"`{step.target}`, which steps {accumulation_place(model, acc)}, and the first micro-batches "
                            f"weigh more than the last; divide by {count}",
                        )
                        continue
                    divided = (
                        f" (it is divided by `{model.code(own_mean)}`, counted from its own micro-batch: a mean over one "
                        f"micro-batch, not over the accumulated batch)" if own_mean is not None else ""
                    )
                    undivided = True
                    yield Report(
                        backward.node,
                        f"gradients are accumulated for `{step.target}`, which steps {accumulation_place(model, acc)}, "
                        f"but the loss is not divided by {count}{divided}: {too_large(*stepped_update_scale(model, step))}",
                        fix=fixes.divide_loss(model, backward, acc),
                        event=backward, against=(step,), setting=acc.count,
                    )
                for backward in acc.trailing if undivided else ():
                    if not _divided_for_step(backward):
                        yield Report(
                            backward.node,
                            f"the last micro-batch, run after the micro-batch loop at line "
                            f"{model.line(acc.frame.node)}, is not divided by {count} either: gradients are accumulated "
                            f"for `{step.target}`, which steps after it; divide this loss as the loop's",
                            fix=fixes.divide_loss(model, backward, acc),
                            event=backward, against=(step,), setting=acc.count,
                        )


_COMPARING = re.compile(r"(^|_)(assert|allclose|isclose|close|equal)", re.IGNORECASE)


def _compares_two_models_gradients(model: LoopModel, loop: Frame) -> bool:
    """Whether the loop hands the gradients of two different tensors to a comparison (``loose_close(torch_p.grad,
    zero_p.grad)``, ``assert torch.allclose(a.grad, b.grad)``): a test that trains two implementations side by side
    and checks they agree, where both sum the same micro-batches on purpose (InternEvo's ZeRO-vs-DDP test)."""
    for node in model.file.walk(loop.node):
        if type(node) is not cst.Call or not _COMPARING.search(callee_name(node) or ""):
            continue
        owners = set()
        for arg in node.args[:2]:
            value = arg.value
            if type(value) is cst.Attribute and value.attr.value == "grad":
                owners.add(dotted_name(value.value))
        if len(owners - {None}) == 2:
            return True
    return False


def _output_of_a_dividing_engine(model: LoopModel, backward: Event) -> bool:
    """A plain backward of a loss computed by calling a framework object that divides its outputs' gradients by its
    accumulation count (``loss = model_engine(x)``, DeepSpeed's engine: ``frameworks/deepspeed.py``)."""
    if backward.framework is not None or backward.loss is None:
        return False
    for call in calls_computing_loss(model, backward.loss):
        callee = dotted_name(call.func)
        if callee is None:
            continue
        info = model.objects.get(callee)
        kind = info.kind if info is not None else kind_from_name(callee)
        if frameworks.divides_outputs(last_name(callee), kind):
            return True
    return False


def _multiplied_by_the_count(model: LoopModel) -> Iterator[Report]:
    """Loss terms multiplied by the accumulation count that the other terms of the same loss are divided by.

    ``l_total += term_a / self.accum_iters`` beside ``l_total += term_b * self.accum_iters``, both into the loss a
    backward of the function backpropagates: the function's own division says the count is the number of
    micro-batches, so the product makes that term ``accum_iters ** 2`` times what it should be. Reported at the
    product whether or not the accumulation guard is visible (the flag may come from a caller in another file).
    Only a name said to be an accumulation count (``accum`` in its last part) counts.
    """
    if model.index is None:
        return
    seen: set[int] = set()
    for root in model.roots:
        for backward in root.events_of(EventKind.BACKWARD):
            function = function_holding(model, backward.node)
            name = dotted_name(backward.loss) if backward.loss is not None else None
            if function is None or name is None or (id(function), name) in seen:
                continue
            seen.add((id(function), name))
            terms = [v for v in model.index.assignments.get(function, {}).get(name, []) if isinstance(v, cst.BaseExpression)]
            terms += [n.value for n in model.index.augmented.get(function, ()) if type(n.operator) is cst.AddAssign and dotted_name(n.target) == name]
            divisors = {dotted_name(n.right) for t in terms for n in walk(t) if type(n) is cst.BinaryOperation and type(n.operator) is cst.Divide}
            for term in terms:
                for node in walk(term):
                    if type(node) is not cst.BinaryOperation or type(node.operator) is not cst.Multiply:
                        continue
                    factor = next((side for side in (node.right, node.left) if dotted_name(side) in divisors), None)
                    count = dotted_name(factor) if factor is not None else None
                    if count is not None and _ACCUMULATION_COUNT.search(last_name(count)):
                        yield Report(
                            node,
                            f"this loss term is multiplied by `{count}`, the accumulation count the other terms of "
                            f"`{name}` are divided by: it weighs `{count}` squared times what it should in the "
                            f"gradient `{model.code(backward.node)}` accumulates; divide it by `{count}` too",
                        )


def _wrong_divisors(model: LoopModel, acc: Accumulation, step: Event) -> Iterator[Report]:
    """Losses divided by another count than the one the step's guard uses: ``loss / args.grad_accum`` under
    ``if (i + 1) % args.accumulation_steps == 0:``, or ``loss / 4`` under ``% 8``.

    Only the mismatches that are certainly wrong: two different settings of one
    object both named as accumulation counts, neither assigned from the other
    nor given the same value in the module; or two literals that differ (a name
    the module assigns one literal once counts as that literal). A loss that is
    divided by the guard's count as well, or whose every division is not by such
    a count (``len(loader)``, a batch size, the world size), is left alone.
    """
    if acc.count is None:
        return
    for backward in acc.backwards:
        if not backward.normalised or backward.framework is not None or backward.call_chain:
            continue
        divisions = _loss_divisions(model, backward)
        if not divisions or any(_same_count(model, divisor, acc.count) for _, divisor in divisions):
            continue
        for division, divisor in divisions:
            if _certainly_other_count(model, divisor, acc.count):
                yield Report(
                    division,
                    f"the loss is divided by `{model.code(divisor)}`, but `{step.target}` steps {accumulation_place(model, acc)} "
                    f"every `{model.code(acc.count)}` micro-batches: two different counts, so each step's gradient is "
                    f"`{model.code(acc.count)} / {model.code(divisor)}` times the accumulated batch's mean; divide by "
                    f"`{model.code(acc.count)}`",
                )


def _divided_twice(model: LoopModel, acc: Accumulation, step: Event) -> Iterator[Report]:
    """A loss divided by the guard's count at its backward whose every term was divided by the same count already.

    ``weighted = loss * w / self.gradient_acc_steps`` summed into ``total_loss``, then
    ``(total_loss / self.gradient_acc_steps).backward()``: divided by the count squared. Reported at the outer
    division, the one to remove. Only divisions written in the backward's function, followed through names whose
    every value (``=`` and ``+=``) is such a division.
    """
    if acc.count is None or model.index is None:
        return
    for backward in acc.backwards:
        if backward.framework is not None or backward.call_chain or backward.loss is None:
            continue
        outer = backward.loss
        if type(outer) is not cst.BinaryOperation or type(outer.operator) is not cst.Divide or not _same_count(model, outer.right, acc.count):
            continue
        function = function_holding(model, backward.node)
        if _every_term_divided_by(model, outer.left, acc.count, function, depth=0):
            yield Report(
                outer,
                f"the loss is divided by `{model.code(acc.count)}` here, and every term of `{model.code(outer.left)}` "
                f"already was: divided by `{model.code(acc.count)}` squared, so `{step.target}`, which steps "
                f"{accumulation_place(model, acc)}, gets a gradient `{model.code(acc.count)}` times too small; divide once",
            )


def _every_term_divided_by(
    model: LoopModel, value: cst.BaseExpression, count: cst.BaseExpression, function: cst.FunctionDef | None, depth: int
) -> bool:
    """Whether ``value`` is a division by ``count``, or a sum of such, or a name whose every value (``=``, ``+=``) is."""
    while type(value) is cst.BinaryOperation and type(value.operator) is cst.Multiply and number(value.right) is not None:
        value = value.left
    if type(value) is cst.BinaryOperation and type(value.operator) is cst.Divide:
        return _same_count(model, value.right, count)
    if type(value) is cst.BinaryOperation and type(value.operator) is cst.Add:
        return all(_every_term_divided_by(model, side, count, function, depth) for side in (value.left, value.right))
    if type(value) is not cst.Name or depth >= 3:
        return False
    values = [v for v in model.index.assignments.get(function, {}).get(value.value, [])]
    values += [n.value for n in model.index.augmented.get(function, ()) if dotted_name(n.target) == value.value]
    if any(type(n.operator) is not cst.AddAssign for n in model.index.augmented.get(function, ()) if dotted_name(n.target) == value.value):
        return False
    terms = [v for v in values if not _neutral(v)]  # ``total = None`` or ``total = 0.0`` before the sum
    return bool(terms) and all(
        isinstance(v, cst.BaseExpression) and _every_term_divided_by(model, v, count, function, depth + 1) for v in terms
    )


def _neutral(value) -> bool:
    if not isinstance(value, cst.BaseExpression):
        return False
    return (type(value) is cst.Name and value.value == "None") or number(value) == 0


def _loss_divisions(model: LoopModel, backward: Event) -> list[tuple[cst.CSTNode, cst.BaseExpression]]:
    """Where the backward's loss is divided: ``(loss / n).backward()``, ``loss = x / n``, ``loss /= n`` in its function."""
    loss = backward.loss
    found: list[tuple[cst.CSTNode, cst.BaseExpression]] = []

    def divisions_in(value: cst.BaseExpression) -> None:
        while type(value) is cst.BinaryOperation and type(value.operator) is cst.Divide:
            found.append((value, value.right))
            value = value.left

    if loss is None or model.index is None:
        return found
    divisions_in(loss)
    if type(loss) is cst.Name:
        function = function_holding(model, backward.node)
        for value in model.index.assignments.get(function, {}).get(loss.value, []):
            if isinstance(value, cst.BaseExpression):
                divisions_in(value)
        for node in model.index.augmented.get(function, ()):
            if type(node.operator) is cst.DivideAssign and dotted_name(node.target) == loss.value:
                found.append((node, node.value))
    return found


# The last part of a name that says it holds the accumulation count: ``grad_accum``, ``accumulation_steps``, ``accum_iter``.
_ACCUMULATION_COUNT = re.compile(r"accum", re.IGNORECASE)


def _same_count(model: LoopModel, divisor: cst.BaseExpression, count: cst.BaseExpression) -> bool:
    """Whether a divisor is written as the guard's count, or both are the same literal."""
    if model.code(divisor) == model.code(count):
        return True
    mine, theirs = _literal(model, divisor), _literal(model, count)
    return mine is not None and mine == theirs


def _certainly_other_count(model: LoopModel, divisor: cst.BaseExpression, count: cst.BaseExpression) -> bool:
    """Whether a divisor certainly holds another number than the guard's count (see ``_wrong_divisors``)."""
    mine, theirs = _literal(model, divisor), _literal(model, count)
    if mine is not None and theirs is not None:
        return mine != theirs and mine > 1
    if type(divisor) is not cst.Attribute or type(count) is not cst.Attribute:
        return False
    owner, other = dotted_name(divisor.value), dotted_name(count.value)
    names = divisor.attr.value, count.attr.value
    if owner is None or owner != other or names[0] == names[1] or not all(_ACCUMULATION_COUNT.search(n) for n in names):
        return False
    return not _linked(model, dotted_name(divisor), dotted_name(count))


def _linked(model: LoopModel, first: str, second: str) -> bool:
    """Whether the module assigns one name from the other, or both the same value."""
    values: dict[str, set[str]] = {first: set(), second: set()}
    for table in model.index.assignments.values():
        for name in (first, second):
            for value in table.get(name, []):
                if not isinstance(value, cst.BaseExpression):
                    return True  # unpacked from a call: unknown
                text = model.code(value)
                other = second if name == first else first
                if other in text:
                    return True
                values[name].add(text)
    return bool(values[first] & values[second]) or _named_in_strings(model, first, second)


def _named_in_strings(model: LoopModel, first: str, second: str) -> bool:
    """``setattr(args, "grad_accum", ...)``, or a property ``def grad_accum(self)``: one of the settings is made in a way
    the module may tie to the other."""
    names = {first.rsplit(".", 1)[-1], second.rsplit(".", 1)[-1]}
    for node in model.file.every_node(model.module):
        if type(node) is cst.FunctionDef and node.name.value in names:
            return True
        if type(node) is cst.Call and callee_name(node) == "setattr":
            if any(type(a.value) is cst.SimpleString and a.value.evaluated_value in names for a in node.args):
                return True
    return False


def _literal(model: LoopModel, node: cst.BaseExpression) -> float | None:
    """A number literal, or a name the module assigns exactly one number literal and never changes."""
    value = number(node)
    if value is not None or type(node) is not cst.Name or model.index is None:
        return value
    assigned = list(model.index.assigned_anywhere(node.value))
    changed = any(dotted_name(a.target) == node.value for nodes in model.index.augmented.values() for a in nodes)
    if len(assigned) != 1 or changed or not isinstance(assigned[0], cst.BaseExpression):
        return None
    return number(assigned[0])


# Backwards left alone: frameworks that divide the loss by their own accumulation count, and
# closures (run by the step itself). Lightning's manual_backward and Fabric's backward divide by nothing.


def _handed_the_count(model: LoopModel, backward: Event, acc: Accumulation) -> bool:
    """``self.student.backward(loss, ctx, grad_accum_rounds=accum)``: a backward helper handed the count may divide by it.

    Only a call the loop does not define itself (a model plugin's ``backward``
    in another file, an abstract method) gets here; it is handed the very
    count the step waits for, so the division is unknown, not absent.
    """
    if acc.count is None or type(backward.node) is not cst.Call:
        return False
    count = model.code(acc.count)
    handed = [arg for position, arg in enumerate(backward.node.args) if position > 0 or arg.keyword is not None]
    return any(model.code(arg.value) == count for arg in handed)


# An argument whose name says it normalises a loss: ``rl_scale``, ``normalizer``, ``num_items_in_batch``, ``num_tokens``.
_NORMALISER = re.compile(
    r"(^|_)(scale|norm|normali[sz]er|normali[sz]ation|denom|denominator|divisor|num_items\w*|num_tokens|n_tokens|total_tokens)$",
    re.IGNORECASE,
)


def _built_by_unseen_call_handed_a_normaliser(model: LoopModel, backward: Event) -> bool:
    """``loss, tensors = compute_loss(..., rl_scale=rl_scale)``: the loss is what a function the module cannot see
    returns, handed an argument named as a normaliser (a token count summed over the window, ``num_items_in_batch``):
    whether it divides is unknown, not absent."""
    if model.index is None or backward.loss is None:
        return False
    name = dotted_name(backward.loss)
    function = function_holding(model, backward.node)
    if name is None:
        return False
    for value in model.index.assignments.get(function, {}).get(name, []):
        call = value.value if isinstance(value, Unpacked) else value
        if type(call) is not cst.Call or model.index.resolve_function(call, function) is not None:
            continue
        for arg in call.args:
            said = arg.keyword.value if arg.keyword is not None else dotted_name(arg.value)
            if said is not None and _NORMALISER.search(last_name(said)) and not re.search(r"loss_scale|grad_scale", said):
                return True
    return False


def _by_running_counter(model: LoopModel, backward: Event) -> cst.BinaryOperation | None:
    """The division of this backward's loss by a running micro-batch counter, written in its function."""
    if model.index is None or backward.loss is None:
        return None
    name = dotted_name(backward.loss)
    if name is None:
        return None
    function = function_holding(model, backward.node)
    return running_division(function, name, model.index) or running_division(function, _scaled_from(model, backward, name), model.index)


def _scaled_from(model: LoopModel, backward: Event, name: str) -> str:
    """``loss`` for ``scaled_loss`` bound by ``with amp.scale_loss(loss, optimizer) as scaled_loss:`` around the
    backward; else ``name`` itself."""
    node = (model.parents or {}).get(backward.node)
    while node is not None:
        if type(node) is cst.With:
            for item in node.items:
                bound = dotted_name(item.asname.name) if item.asname is not None else None
                if bound == name and type(item.item) is cst.Call and item.item.args:
                    return dotted_name(item.item.args[0].value) or name
        node = (model.parents or {}).get(node)
    return name


def _thrown_away(model: LoopModel, root, backward: Event, step: Event, loop) -> bool:
    """Whether a clear of the stepping optimizer discards this backward's gradients before any step sees them.

    ``probe_loss.backward(); optimizer.zero_grad()``: a probe or warm-up
    backward whose gradients are thrown away on its own path accumulates
    nothing. The clear must run whenever the backward does (no branch of its
    own around it) and come before the optimizer's next step.
    """
    for later in _after_on_its_path(root, backward, loop):
        if later.kind is EventKind.STEP and same_object(later.target, step.target):
            return False
        if later.kind is EventKind.ZERO and clears(model, later, step.target) and _runs_whenever(later, backward, loop):
            return True
    return False


def _after_on_its_path(root, event: Event, loop) -> Iterator[Event]:
    """The events of ``loop`` after ``event``, in order, that can run in the same pass (not in another branch)."""
    events = root.events_in(loop)
    start = next(i for i, e in enumerate(events) if e is event)
    return (later for later in events[start + 1 :] if not exclusive(later, event))


def _runs_whenever(event: Event, other: Event, loop) -> bool:
    """Whether ``event`` runs whenever ``other`` does: no branch or loop of its own in ``loop`` that ``other`` is outside."""
    return all(other.inside(f) for f in frames_inside(event, loop))


def _another_optimizers_micro_batch(root, backward: Event, step: Event, loop) -> bool:
    """Whether this backward is another optimizer's own, cleared before it and stepped right after it.

    ``opt_d.zero_grad(); d_loss.backward(); opt_d.step()`` on every batch,
    beside a generator that accumulates for ``opt_g``: the discriminator's
    backward is no micro-batch of the generator's accumulation. The clear and
    the step of the other optimizer must run whenever the backward does, and
    no other backward may come between the backward and that step.
    """
    other = next((e for e in _after_on_its_path(root, backward, loop) if e.kind in (EventKind.BACKWARD, EventKind.STEP)), None)
    if other is None or other.kind is not EventKind.STEP or other.target is None or same_object(other.target, step.target):
        return False
    if not _runs_whenever(other, backward, loop):
        return False
    return any(
        earlier.kind is EventKind.ZERO and earlier.target_kind is ObjKind.OPTIMIZER and same_object(earlier.target, other.target)
        and root.order(earlier) < root.order(backward) and not exclusive(earlier, backward) and _runs_whenever(earlier, backward, loop)
        for earlier in root.events_in(loop)
    )


def _undoes_loss_scale(model: LoopModel, divide: Event, backwards: list[Event]) -> bool:
    """Whether a gradient division only undoes a factor the loss was multiplied by before backward.

    ``(loss * 2 ** lg_loss_scale).backward()`` then ``p.grad.mul_(1 / 2 ** lg_loss_scale)`` unscales an fp16
    loss scale: the micro-batches are still summed.
    """
    divisor = {dotted_name(n) for n in model.file.walk(divide.node) if type(n) in (cst.Name, cst.Attribute)} - {None}
    for backward in backwards:
        assignments = model.index.assignments.get(function_holding(model, backward.node), {}) if model.index else {}
        if backward.loss is None:
            continue
        loss_name = dotted_name(backward.loss)
        factors = {dotted_name(n) for n in model.file.walk(backward.loss) if type(n) in (cst.Name, cst.Attribute)} - {None, loss_name}
        factors = {f for f in factors if "grad" not in f and f != "loss"}
        for name in list(factors):  # ``loss_scale = 2 ** self.lg_loss_scale``: what the factor was made of
            for value in assignments.get(name, []):
                if isinstance(value, cst.BaseExpression):
                    factors |= {dotted_name(n) for n in model.file.walk(value) if type(n) in (cst.Name, cst.Attribute)} - {None}
        if factors & divisor:
            return True
    return False


def _cleared_every_micro_batch(model: LoopModel, root, step: Event, loop, acc: Accumulation) -> bool:
    """Whether a clear of the step's optimizer runs on every micro-batch (GL003's finding): then nothing piles up."""
    if acc.style == "guard":
        # outside every guard, or in the guard's other branch: on every micro-batch that does not step
        zeros = [
            z for z in root.events_of(EventKind.ZERO, loop)
            if not any(f.accumulation for f in frames_inside(z, loop)) or in_other_branch(z, acc.frame)
        ]
    else:
        zeros = root.events_of(EventKind.ZERO, acc.frame)
    return any(clears(model, z, step.target) and not leaves_before(z, step) and not split_by_setting(z, step) for z in zeros)


# A comment that says the undivided sum over samples or micro-batches is meant: ``# summed over micro-batches on
# purpose``, ``# loss scaled by batch_size``, ``# sum over tokens``; not ``# a sum of loss terms``.
_SUM_COMMENT = re.compile(
    r"\bsum(med)?\s+(over|across)\s+(the\s+)?(\w+[\s-])?(samples?|tokens?|micro|batch|examples?|elements?|pixels?|images?)"
    r"|scaled by|nominal batch|deliberate|on purpose",
    re.IGNORECASE,
)
# A hyper-parameter tuned for the summed gradient of a nominal batch: ``hyp["weight_decay"] *= bs * accumulate / nbs``.
_HYPERPARAMETER = re.compile(r"weight_decay|\blr\b|learning_rate", re.IGNORECASE)
_WEIGHT_DECAY = re.compile(r"weight_decay", re.IGNORECASE)


def _from_abstract_method(model: LoopModel, backward: Event) -> bool:
    """Whether the loss is what a method of ``self`` returns whose body here only raises ``NotImplementedError``: the
    subclasses' overrides compute it, and whether they divide it is theirs to say (TencentPretrain's trainers each
    return ``loss / self.accumulation_steps``)."""
    index = model.index
    name = dotted_name(backward.loss) if backward.loss is not None else None
    function = function_holding(model, backward.node)
    if index is None or name is None or function is None:
        return False
    for value in index.assignments.get(function, {}).get(name, []):
        value = getattr(value, "value", value) if not isinstance(value, cst.BaseExpression) else value
        if type(value) is not cst.Call or type(value.func) is not cst.Attribute or dotted_name(value.func.value) != "self":
            continue
        method = index.method_holding(function)
        owner = index.class_of.get(method) if method is not None else None
        called = index.method_of(owner, value.func.attr.value) if owner is not None else None
        if called is not None and only_raises_not_implemented(called):
            return True
    return False


def _deliberate_sum(model: LoopModel, root, acc: Accumulation) -> bool:
    """Whether the code says the sum over micro-batches is meant: the loss sums over samples or tokens.

    A loss built with ``reduction="sum"``, or as ``x.sum()`` / ``torch.sum(x)`` of a
    visibly per-sample or per-token ``x`` (``_per_sample``), a comment beside the loss
    saying so, or weight decay / learning rate scaled by the accumulation count (a
    recipe tuned for the summed gradient of a nominal batch, as yolov5's). A sum over
    the components of a loss whose parts are already means (``per_quantile.sum()``,
    ``torch.stack([a.mean(), b.mean()]).sum()``, ``l1 + 0.5 * l2``), or over what an
    unseen criterion returns, is no sum over samples.
    """
    index = model.index
    if index is None:
        return False
    for backward in acc.backwards:
        function = function_holding(model, backward.node)
        table = index.assignments.get(function, {})  # where the loss is made, even when inlined
        name = dotted_name(backward.loss) if backward.loss is not None else None
        for value in table.get(name, []) if name else []:
            if _from_summing_model(model, value, function, depth=0):
                return True
            value = getattr(value, "value", value) if not isinstance(value, cst.BaseExpression) else value  # an unpacked element
            if _SUM_COMMENT.search(_comment_of(model, value)):
                return True
            if _sums_over_samples(model, value, function):
                return True
    counts = _accumulation_names(model, acc)
    if not counts:
        return False
    home = function_holding(model, acc.frame.node)
    # The learning rate beside the loop; weight decay anywhere in the module (yolo trainers scale it in the method
    # that builds the optimizer: ``weight_decay *= batch_size * accumulate / nbs``).
    for node, names in _hyperparameters_set(model):
        if not names & counts:
            continue
        if _WEIGHT_DECAY.search(dotted_name(node) or model.code(node)) or home is None or lies_in(model, node, home):
            return True
    return False


def _hyperparameters_set(model: LoopModel) -> list[tuple[cst.BaseExpression, frozenset[str]]]:
    """Each assignment target of the module named as a learning rate or weight decay, with the names its value reads:
    read once per module (a module of many loops asks for every accumulation)."""

    def read() -> list[tuple[cst.BaseExpression, frozenset[str]]]:
        found = []
        for node in model.file.every_node(model.module):
            kind = type(node)
            if kind is not cst.Assign and kind is not cst.AugAssign:
                continue
            targets = [t.target for t in node.targets] if kind is cst.Assign else [node.target]
            named = [t for t in targets if _HYPERPARAMETER.search(dotted_name(t) or model.code(t))]
            if named:
                names = frozenset(_names_read(node.value))
                found.extend((t, names) for t in named)
        return found

    return model.file.once((_hyperparameters_set,), read)


def _from_summing_model(model: LoopModel, value, function: cst.FunctionDef | None, depth: int) -> bool:
    """Whether a loss is what a model returns whose ``forward`` sums it over samples or tokens, as another file of the
    run says (``LoopModel.summing_models``: ``_, loss, metrics = model(x=..., y=...)`` with ``model = VALLE(...)`` and
    ``VALLE.forward(..., reduction="sum")`` returning ``total_loss`` at that place), also through a function of the
    module that returns it (``_, loss, info = compute_loss(model=model, ...)``). The call must leave ``reduction``
    alone (or pass ``"sum"``), and every value the module binds the model's name to must be a class's construction
    (checked by the run) or the model itself (``model.to(device)``, ``model.module``).
    """
    position = -1
    if isinstance(value, Unpacked):
        value, position = value.value, value.position
    if type(value) is not cst.Call or depth > 2 or model.index is None:
        return False
    name = dotted_name(value.func)
    if name is None:
        return False
    summing = dict(fact.rsplit(":", 1) for fact in model.summing_models)
    if last_name(name) in summing:
        return (
            int(summing[last_name(name)]) == position
            and _leaves_reduction_to_forward(value)
            and _bound_only_to_models(model, last_name(name))
        )
    callee = model.index.module_functions.get(name)
    returned = model.index.returned(callee) if callee is not None else []
    if not returned:
        return False
    for each in returned:
        if position >= 0:
            elements = each.elements if type(each) is cst.Tuple else ()
            each = elements[position].value if len(elements) > position else None
        if type(each) is not cst.Name:
            return False
        values = model.index.assignments.get(callee, {}).get(each.value, [])
        if not values or not all(_from_summing_model(model, v, callee, depth + 1) for v in values):
            return False
    return True


def _leaves_reduction_to_forward(call: cst.Call) -> bool:
    """No ``reduction=`` but ``"sum"``, and no ``**kwargs`` that could hold one."""
    if any(arg.star == "**" for arg in call.args):
        return False
    given = keyword_arg(call, "reduction")
    return given is None or _reduction(call) == "sum"


def _bound_only_to_models(model: LoopModel, name: str) -> bool:
    """Every value the module assigns to ``name`` is a class's construction or made from ``name`` itself."""
    for value in model.index.assigned_anywhere(name):
        if isinstance(value, Unpacked) or type(value) not in (cst.Call, cst.Attribute):
            return False
        if type(value) is cst.Call and (callee_name(value) or "")[:1].isupper():
            continue
        root = value
        while type(root) in (cst.Call, cst.Attribute):
            root = root.func if type(root) is cst.Call else root.value
        if type(root) is not cst.Name or last_name(root.value) != name:
            return False
    return True


# Losses that reduce by the mean unless given another ``reduction``: ``F.cross_entropy``, ``nn.MSELoss()``...
_MEAN_CRITERION = re.compile(r"(_loss|Loss|cross_entropy|kl_div|_with_logits|nll)$")
# Reductions that may run over the samples (or gather the components of a loss): ``x.mean()``, ``torch.stack([...])``.
_MEANS = frozenset({"mean", "nanmean", "average", "stack"})
# Elementwise operations whose result keeps one value per sample or token.
_ELEMENTWISE = frozenset({
    "pow", "abs", "log", "exp", "square", "sqrt", "gather", "log_softmax", "logsigmoid", "softplus", "relu",
    "masked_fill", "where", "clamp", "neg",
})


def _sums_over_samples(model: LoopModel, value: cst.BaseExpression, function: cst.FunctionDef | None) -> bool:
    """``F.cross_entropy(..., reduction="sum")``, ``(nll * mask).sum()``, ``torch.sum(per_sample)``: a sum over samples.

    A sum of such terms is one too; any term that is not (a mean loss beside a summed
    one) makes the whole no sum over samples.
    """
    if type(value) is cst.BinaryOperation and type(value.operator) in (cst.Add, cst.Subtract):
        return _sums_over_samples(model, value.left, function) and _sums_over_samples(model, value.right, function)
    if type(value) is not cst.Call:
        return False
    if _reduction(value) == "sum":
        return True
    if method_name(value) != "sum" or type(value.func) is not cst.Attribute:
        return False  # the builtin ``sum(task_losses)`` adds several mean losses
    owner = value.func.value
    summed = positional_args(value)[0].value if dotted_name(owner) == "torch" and value.args else owner
    return _per_sample(model, summed, function, depth=0)


def _per_sample(model: LoopModel, node: cst.BaseExpression, function: cst.FunctionDef | None, depth: int) -> bool:
    """Whether ``node`` visibly holds one loss value per sample or token, read through the names it is made of.

    Evidence: a criterion called with ``reduction="none"`` (or built so), or elementwise
    arithmetic; and no mean anywhere on the way (``.mean()``, a criterion with its default
    mean reduction, ``torch.stack`` of losses). What an unseen criterion returns, or a
    name with no value in the function, is unknown: no evidence.
    """
    if type(node) is cst.Name:
        values = [v for v in model.index.assignments.get(function, {}).get(node.value, []) if isinstance(v, cst.BaseExpression)]
        return depth < 3 and bool(values) and all(_per_sample(model, v, function, depth + 1) for v in values)
    evidence = False
    for sub in model.file.walk(node):
        kind = type(sub)
        if kind is cst.Call:
            name = callee_name(sub) or ""
            reduction = _reduction(sub) or _built_with_reduction(model, sub, function)
            if _reduces_over_samples(sub, name) or reduction == "mean" or (reduction is None and _MEAN_CRITERION.search(name)):
                return False
            if reduction == "none" or name in _ELEMENTWISE or name in _MEANS or _network_output(model, sub):
                evidence = True  # a mean left here is over each sample's own elements (``.mean([1, 2, 3])``)
        elif (kind is cst.BinaryOperation and type(sub.operator) is not cst.MatrixMultiply) or (
            kind is cst.UnaryOperation and type(sub.operator) is cst.Minus
        ):
            evidence = True
    if not evidence or depth >= 3:
        return evidence
    names = {sub.value for sub in model.file.walk(node) if type(sub) is cst.Name}
    table = model.index.assignments.get(function, {})
    return not any(
        isinstance(v, cst.BaseExpression) and _made_of_means(model, v, function) for name in names for v in table.get(name, [])
    )


# The last name of a network called on a batch: its output holds one value per sample (``fsdp_model(x).sum()``).
_NETWORK = re.compile(r"model|net(work)?$|module$|backbone|encoder|decoder|transformer", re.IGNORECASE)
_CRITERION = re.compile(r"loss|criterion|crit$", re.IGNORECASE)


def _reduces_over_samples(call: cst.Call, name: str) -> bool:
    """``x.mean()``, ``x.mean(0)``, ``torch.mean(x, dim=d)`` with ``d`` unknown, ``torch.stack(losses)``: a reduction that
    may run over the samples (or stacks separate losses); not ``x.mean([1, 2, 3])`` / ``x.mean(dim=-1)``, over each
    sample's own elements."""
    if name not in _MEANS:
        return False
    if name not in ("mean", "nanmean"):
        return True
    given = keyword_arg(call, "dim")
    dims = given.value if given is not None else None
    if dims is None:
        positional = positional_args(call)
        function_form = type(call.func) is cst.Attribute and dotted_name(call.func.value) in ("torch", "np", "numpy")
        at = 1 if function_form or type(call.func) is cst.Name else 0
        dims = positional[at].value if len(positional) > at else None
    if dims is None:
        return True
    values = [e.value for e in dims.elements] if type(dims) in (cst.Tuple, cst.List) else [dims]
    literals = [number(v) if type(v) is not cst.UnaryOperation else (-number(v.expression) if number(v.expression) is not None else None) for v in values]
    return any(v is None or v == 0 for v in literals)


def _network_output(model: LoopModel, call: cst.Call) -> bool:
    """``out = fsdp_model(x)``: a call of the network itself, whose output has one value per sample."""
    name = dotted_name(call.func)
    if name is None:
        return False
    known = model.index.objects.get(name) if model.index is not None else None
    if known is not None and known.kind in (ObjKind.MODEL, ObjKind.PARALLEL_MODEL):
        return True
    last = last_name(name)
    return bool(_NETWORK.search(last)) and not _CRITERION.search(last)


def _made_of_means(model: LoopModel, node: cst.BaseExpression, function: cst.FunctionDef | None) -> bool:
    """Whether a value reduces by a mean somewhere: ``.mean()``, or a criterion with its default mean reduction."""
    for sub in model.file.walk(node):
        if type(sub) is cst.Call:
            name = callee_name(sub) or ""
            reduction = _reduction(sub) or _built_with_reduction(model, sub, function)
            if _reduces_over_samples(sub, name) or reduction == "mean" or (reduction is None and _MEAN_CRITERION.search(name)):
                return True
    return False


def _reduction(call: cst.Call) -> str | None:
    """The literal ``reduction=`` a call is given, if any."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "reduction" and type(arg.value) is cst.SimpleString:
            return arg.value.evaluated_value
    return None


def _built_with_reduction(model: LoopModel, call: cst.Call, function: cst.FunctionDef | None) -> str | None:
    """For ``criterion(pred, y)``, the literal ``reduction=`` the criterion was built with (``nn.MSELoss(reduction="none")``)."""
    name = dotted_name(call.func)
    if name is None or model.index is None:
        return None
    tables = model.index.assignments.values() if name.startswith("self.") else [model.index.assignments.get(function, {}), model.index.assignments.get(None, {})]
    for table in tables:
        for value in table.get(name, []):
            if type(value) is cst.Call:
                found = _reduction(value)
                if found is not None:
                    return found
                if _MEAN_CRITERION.search(callee_name(value) or ""):
                    return "mean"
    return None


def _accumulation_names(model: LoopModel, acc: Accumulation) -> set[str]:
    """The names that hold the number of micro-batches: the count, or the guard's accumulation-like names."""
    source = acc.count if acc.count is not None else (acc.frame.node.test if type(acc.frame.node) is cst.If else None)
    if source is None:
        return set()
    names = _names_read(source)
    if acc.count is not None:
        return names
    return {n for n in names if re.search(r"accum", n, re.IGNORECASE)}


def _names_read(node: cst.CSTNode) -> set[str]:
    """The names and whole attribute chains an expression reads (``self.accumulation_steps``, not ``self`` alone: any
    attribute of ``self`` would share it)."""
    inner = {id(n.value) for n in walk(node) if type(n) is cst.Attribute}
    return {
        name for n in walk(node)
        if type(n) in (cst.Name, cst.Attribute) and id(n) not in inner and (name := dotted_name(n)) is not None
    }


def _comment_of(model: LoopModel, node: cst.CSTNode) -> str:
    """The comment at the end of the line holding ``node``'s statement, if any."""
    parents = model.parents or {}
    while node is not None and type(node) is not cst.SimpleStatementLine:
        node = parents.get(node)
    if node is None or node.trailing_whitespace.comment is None:
        return ""
    return node.trailing_whitespace.comment.value


def _splits_a_batch(loop: cst.CSTNode) -> bool:
    """A ``for`` loop whose header splits a tensor into pieces (``zip(x.chunk(k), y.chunk(k))``, ``torch.split(x,
    n)``), or whose body cuts a piece of the batch that starts at its variable (``for i in range(0, len(batch), mb):
    part = batch[i : i + mb]``; what is cut is named for a batch, its samples or its inputs): the micro-batches of
    one batch. A loop over ``range(accum)`` or over lists made elsewhere
    may run anything (open_clip's re-forward of cached features, a slider trainer's prompt pairs), and is left to a
    loop around it."""
    if type(loop) is not cst.For:
        return False
    if any(type(n) is cst.Call and callee_name(n) in ("chunk", "split", "tensor_split") for n in walk(loop.iter)):
        return True
    return type(loop.target) is cst.Name and any(
        type(n) is cst.Subscript and _BATCH_NAME.search(dotted_name(n.value) or "")
        and any(type(e.slice) is cst.Slice and _starts_at(e.slice, loop.target.value) for e in n.slice)
        for n in walk(loop.body)
    )


# What a piece cut from is named when it holds the batch's samples (``global_batch``, ``samples``, ``inputs``), not
# indices into something else (``global_indices[i : i + batch_size]`` may pick calibration samples of one long batch)
_BATCH_NAME = re.compile(r"batch|sample|example|input|data", re.IGNORECASE)


def _starts_at(piece: cst.Slice, name: str) -> bool:
    """``[name : name + n]`` (or ``n + name``): a piece of ``n`` items that starts at ``name``."""
    lower, upper = piece.lower, piece.upper
    return (
        type(lower) is cst.Name and lower.value == name and type(upper) is cst.BinaryOperation
        and type(upper.operator) is cst.Add
        and any(type(side) is cst.Name and side.value == name for side in (upper.left, upper.right))
    )


# A call that hands the next batch of a data source: ``next(it)``, ``get_next_batch(loader)``, ``loader.next_batch()``.
_NEXT_BATCH = re.compile(r"^(next|(get_|fetch_|load_)?next_(micro_?)?batch|(get|fetch|load)_(micro_?)?batch)$")


def _draws_a_batch_each_time(model: LoopModel, loop: cst.CSTNode) -> bool:
    """A loop whose header says it runs micro-batches (``for _ in range(accum_steps)``) and whose body draws a fresh
    batch from a data source on each pass (``batch = next(data_iter)``, ``get_next_batch(train_dataloader)``): each
    pass is a micro-batch of its own, not a re-run over batches gathered elsewhere (open_clip's cached features)."""
    if not header_says_micro_batches(model, loop):
        return False
    return any(type(n) is cst.Call and _NEXT_BATCH.match(callee_name(n) or "") for n in model.file.walk(loop.body))


def _looks_like_micro_batches(model: LoopModel, loop_node: cst.CSTNode) -> bool:
    """An inner loop over ``range(accum_steps)``, ``batch.chunk(k)``, ``micro_batches``, ``subbatches``, ..., or a ``while`` loop that
    runs until a count of its own reaches a threshold (``_counted_while``)."""
    if type(loop_node) is cst.While:
        return _counted_while(loop_node)
    return header_says_micro_batches(model, loop_node)


_BELOW = (cst.LessThan, cst.LessThanEqual, cst.NotEqual)
_REACHED = (cst.GreaterThanEqual, cst.GreaterThan, cst.Equal)


def _counted_while(loop: cst.While) -> bool:
    """``while n < accum_steps:`` or ``while True: ...; n += 1; if n >= accum_steps: break``: micro-batches counted.

    The loop's body adds to a counter (``n += 1``, ``samples += len(x)``) and the loop
    ends when it reaches a threshold: its test keeps it below one, or an ``if`` that
    compares it with one breaks out.
    """
    counted = {
        dotted_name(node.target) for node in walk(loop.body) if type(node) is cst.AugAssign and type(node.operator) is cst.AddAssign
    } - {None}
    if not counted:
        return False

    def compares(test: cst.BaseExpression, operators: tuple[type, ...]) -> bool:
        return (
            type(test) is cst.Comparison and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, operators) and dotted_name(test.left) in counted
        )

    if compares(loop.test, _BELOW):
        return True
    return any(
        type(node) is cst.If and compares(node.test, _REACHED) and ends_with_break(node.body)
        for node in walk(loop.body)
    )


class InvertedAccumulationGuard(Rule):
    """The optimizer steps where the accumulation counter's remainder is *not* zero: the guard is inverted.

    **Why it matters.** ``if batches_done % accum:`` is true on every
    micro-batch except each ``accum``-th one. The step (and the clear after
    it) then runs on every micro-batch but one in ``accum``: nothing
    accumulates, every ``accum``-th micro-batch's gradients are added to
    the next one's, and with ``accum = 1`` (no accumulation) the remainder is
    always 0 and the optimizer never steps at all. Nothing fails.

    **Fix.** Test for a zero remainder: ``if batches_done % accum == 0:``
    (``(i + 1) % accum == 0`` to step at the end of each window).

    **Stays quiet when**

    - the branch holding the step leaves the iteration (``if (i + 1) % k:
      continue``, then the step): that is the right guard spelled the other
      way round;
    - the ``if`` has an ``else`` branch (``if i % n_critic: ... else:
      ...``): two updates alternating on purpose;
    - no backward outside the branch feeds the step: the branch does its own
      gradient work on the iterations it picks, which is no accumulation
      (``fixtures/clearing/ok_step_where_remainder_is_not_zero.py``);
    - the counter is the index of a batch loop that has ended before the
      ``if`` (a flush of the pass's last, short window after the loop), also
      in a function an epoch loop calls
      (``fixtures/realworld/ok_gl013_flush_after_loop_in_epoch_helper__vocal-remover.py``),
      or a counter only that loop moves on (``accum_counter += 1`` in its
      body, ``if accum_counter % accum_steps != 0: optimizer.step()`` after
      it: ``fixtures/realworld/ok_gl301_flush_and_schedule_after_batch_loop__pl_tts.py``).

    **Bad**::

        for i, (x, y) in enumerate(loader):
            loss_fn(model(x), y).backward()
            if i % accum:
                optimizer.step()
                optimizer.zero_grad()

    **Good**::

        for i, (x, y) in enumerate(loader):
            loss_fn(model(x), y).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
    """

    code = "GL013"
    name = "inverted-accumulation-guard"
    summary = "the step runs where the counter's remainder is not zero: on every micro-batch but the N-th"
    severity = Severity.ERROR
    fix = None  # which micro-batch closes a window (``i % k == 0`` or ``(i + 1) % k == 0``) is the author's call
    needs = ((BACKWARD, STEP),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            for step, loop, acc in single_branch_guards(root):
                guard = acc.frame
                remainder = _remainder_when_true(guard.node.test)
                if remainder is None or not _counts_micro_batches(model, remainder, loop, guard.node):
                    continue
                yield Report(
                    guard.node.test,
                    f"`{step.target}` steps at line {model.line(step.node)} only where `{model.code(remainder)}` is not "
                    f"zero: on every micro-batch but each N-th, so nothing accumulates, and with a count of 1 it never "
                    f"steps; the guard is inverted, test `{model.code(remainder)} == 0`",
                    event=step,
                )


def _counts_micro_batches(model: LoopModel, remainder: cst.BinaryOperation, loop: Frame, guard: cst.If) -> bool:
    """Whether the remainder is taken of a counter that moves on with the micro-batches at the guard: a plain name (not
    ``len(loader)``), and not the index of an inner loop that has ended before the guard (``if (i + 1) % k != 0:``
    after ``for i, b in enumerate(loader)`` steps a pass's last, short window)."""
    counter, _ = counter_and_offset(remainder.left)
    if counter is None:
        return False
    # the loop's code, and the helper that holds the guard when the loop calls it (``train_epoch`` called per epoch)
    holder = function_holding(model, guard)
    scopes = [loop.node] + ([holder] if holder is not None and not lies_in(model, holder, loop.node) else [])
    for scope in scopes:
        for node in walk(scope):
            if type(node) is cst.For and node is not loop.node and not lies_in(model, guard, node):
                if counter in {dotted_name(t) for t in walk(node.target) if type(t) in (cst.Name, cst.Attribute)}:
                    return False
    return True


def _remainder_when_true(test: cst.BaseExpression) -> cst.BinaryOperation | None:
    """The remainder a test holds true where it is not zero: a bare ``i % k``, ``i % k != 0`` or ``i % k > 0``."""
    if type(test) is cst.Comparison and len(test.comparisons) == 1 and number(test.comparisons[0].comparator) == 0:
        if type(test.comparisons[0].operator) not in (cst.NotEqual, cst.GreaterThan):
            return None
        test = test.left
    if type(test) is cst.BinaryOperation and type(test.operator) is cst.Modulo:
        return test
    return None


# GL005's prefilter: the attribute ``p.grad`` (never a bare name ``grad``) or ``p.grad.data``, with any
# blanks, ``)``, line continuations or comments between the parts (a comment is read to the line's end,
# so the search stays linear), then either ``.zero_``, ``.fill_`` or ``.mul_`` (GRAD_ZEROED_BY_METHOD), or
# an assignment (GRAD_ASSIGNED) in a text that also holds a value the model reads as zero gradients:
# ``zeros_like`` or a product with a zero literal in any spelling (``0 * p.grad``, ``p.grad * 0.0``).
_GAP = r"(?:[\s\\)]|#[^\n]*(?![^\n]))*"
_GRAD = rf"\.{_GAP}grad(?!\w){_GAP}(?:\.{_GAP}data(?!\w){_GAP})?"
GRAD_ZEROED_BY_METHOD = Spelled("grad", rf"{_GRAD}\.{_GAP}(?:zero_|fill_|mul_)(?!\w)")
GRAD_ASSIGNED = Spelled("grad", rf"{_GRAD}=(?!=)")
_ZERO_LITERAL = r"(?<![\w.])(?:0[xXoObB](?:_?0)+|(?:0(?:_?0)*(?:\.(?:0(?:_?0)*)?)?|\.0(?:_?0)*)(?:[eE][+-]?\d(?:_?\d)*)?)(?![\w.])"
ZEROING_VALUE = re.compile(rf"zeros_like|{_ZERO_LITERAL}{_GAP}\*|\*(?:[\s\\(]|#[^\n]*(?![^\n]))*{_ZERO_LITERAL}")


class GradsKeptAllocated(Rule):
    """Gradients are cleared by zeroing them in place, which keeps every gradient buffer allocated.

    **Why it matters.** ``zero_grad(set_to_none=False)`` and hand-written
    ``p.grad.zero_()`` loops keep one gradient-sized buffer per parameter
    alive between steps and spend a kernel writing zeros into it.
    ``set_to_none=True`` (the default since PyTorch 2.0) frees the buffers
    instead; the next backward allocates them fresh. Code captured in CUDA
    graphs needs stable buffers and is not flagged.

    **Fix.** ``optimizer.zero_grad(set_to_none=True)``, or ``model.zero_grad()``
    instead of a manual loop.

    **Stays quiet when**

    - the module uses ``.grad`` as a buffer that must exist: pre-allocated
      (``p.grad = torch.zeros_like(p)``), added or copied into
      (``p.grad += g``, ``p.grad.copy_(g)``, ``p.grad.data.sub_(a).add_(b)``),
      or read for every parameter with no None check (``flatten([p.grad for p
      in params])``, a loop over ``named_parameters()`` computing with
      ``param.grad / n``: a Kalman filter's measurement matrix,
      ``fixtures/realworld/ok_gl005_kalman_filter_reads_every_gradient__PWMLFF.py``;
      not a hand-written update, ``p -= lr * p.grad``);
    - the zeroing is inside a class's own ``zero_grad``: freeing or zeroing is
      its caller's choice;
    - the zeroing is a mask, not a clear: written in a method of an optimizer
      class (its own update reads the zeros, as for an infinite norm), under
      a test of the parameter's name (``if ".experts" not in name:``), or in
      a method a framework runs between the backward and the step (Lightning's
      ``on_before_optimizer_step``: ``fixtures/realworld/gl005_prototypes_masked_before_step__stable-pretraining.py``);
    - the code backpropagates once and never steps (a gradient comparison),
      or a hand-written zeroing that walks no network's ``parameters()``
      runs where nothing steps, in a function that turns ``requires_grad``
      on or backpropagates itself (the inputs' gradients of a sensitivity
      analysis, of an operator's timing benchmark:
      ``fixtures/realworld/ok_gl005_input_gradients_zeroed_for_sensitivity__prosper_nn.py``,
      ``ok_gl005_input_gradients_zeroed_in_timing_benchmark__ArcNerf.py``),
      or under a test that the object is a tensor at all or a leaf (``if
      torch.is_tensor(x) and x.is_leaf:``, a walk over nested inputs:
      ``gl005_pipeline_inputs_zeroed__nanoRLHF.py``);
    - a per-parameter loop zeroes a gradient under a test of a value
      computed from it (``if clip_coef < 0.2: p.grad.mul_(0)``: a clip that
      drops it, ``fixtures/realworld/ok_gl005_per_parameter_clip_drops_gradient__Infinity.py``;
      ``if torch.isnan(p.grad).any(): p.grad = torch.zeros_like(p.grad)``: a
      repair, ``fixtures/realworld/ok_gl005_non_finite_gradients_replaced__csm-multilingual.py``);
    - the buffers are kept on purpose and the code says why: a reason beside
      ``set_to_none=False``, a comment about keeping them resident, a test
      that mocks ``zero_grad`` to check its arguments;
    - the module uses CUDA graphs, or the gradient is one named tensor's.

    **Bad**::

        optimizer.zero_grad(set_to_none=False)

    **Good**::

        optimizer.zero_grad(set_to_none=True)
    """

    code = "GL005"
    name = "grads-kept-allocated"
    summary = "gradients are zeroed in place where set_to_none=True would free them"
    severity = Severity.WARNING
    fix = FixKind.SAFE
    needs = ((call_of("zero_grad"), "False"), GRAD_ZEROED_BY_METHOD, (GRAD_ASSIGNED, ZEROING_VALUE))

    def check(self, model: LoopModel) -> Iterator[Report]:
        if model.uses_cuda_graphs:
            return
        if model.index is not None and model.index.grads_used_as_buffers:
            return  # .grad is pre-allocated, added or copied into, or read whole: set to None it would break the code
        for root in model.roots:
            for event in root.events:
                if event.kind is not EventKind.ZERO or event.set_to_none is not False:
                    continue
                if event.target_kind is ObjKind.TENSOR:
                    continue  # one tensor's gradient (a perturbation, a hand-made weight), not the model's
                if _inside_own_zero_grad(model, event) or _caller_chose_in_place(event):
                    continue  # an optimizer's own zero_grad: zeroing in place is the branch its caller asked for
                if _inside_optimizer_update(model, event) or _masks_parameters_by_name(event) or masks_by_value(event):
                    continue  # gradients zeroed so that what reads them next skips them: a mask, not a clear
                if _in_hook_before_step(model, event):
                    continue  # a framework runs it between backward and step: zeroed so that the step skips them
                if _no_next_backward(root, event):
                    continue  # one backward, no step: nothing is kept between steps
                if event.manual and _zeroes_input_gradients(model, root, event):
                    continue  # an input's gradient, read and never applied (a sensitivity analysis): no parameter
                if _kept_on_purpose(model, root, event):
                    continue
                if event.manual:
                    message = (
                        f"`{model.code(event.node)}` zeroes gradients in place and keeps their buffers allocated: "
                        f"`zero_grad(set_to_none=True)` frees them"
                    )
                else:
                    message = (
                        f"`{model.code(event.node)}` keeps every gradient buffer allocated between steps: "
                        f"`set_to_none=True` frees them"
                    )
                yield Report(event.node, message, fix=fixes.free_gradients(model, event))


def _zeroes_input_gradients(model: LoopModel, root, event: Event) -> bool:
    """Whether a hand-written zeroing clears the gradients of tensors the code made to ask for them, where nothing
    steps: the zeroing walks no network's ``parameters()`` (``for x in inputs: x.grad.zero_()``, a sensitivity
    analysis, an operator's timing benchmark), and the function turns ``requires_grad`` on for something
    (``input_batch.requires_grad_(True)``) or backpropagates itself (its caller made the inputs ask for gradients), or
    the zeroing is under a test of whether the object is a tensor at all or a leaf (a walk over nested inputs: a
    parameter is always a leaf tensor, nanoRLHF's pipeline stages clear their received inputs so).
    A clearing helper that only zeroes what it is handed is still judged."""
    if any(e.kind is EventKind.STEP or e.kind is HANDOFF for e in root.events):
        return False
    if any(f.kind is FrameKind.LOOP and type(f.node) is cst.For and walks_every_parameter(model, f.node) for f in event.frames):
        return False
    if any(e.kind is EventKind.BACKWARD and _same_chain(e.call_chain, event.call_chain) for e in root.events):
        return True  # the zeroing's own function backpropagates
    if any(f.kind is FrameKind.BRANCH and type(f.node) is cst.If and _tests_for_any_tensor(f.node.test) for f in event.frames):
        return True  # ``if torch.is_tensor(x) and x.is_leaf: x.grad.zero_()``: a walk over nested inputs of any type
    function = function_holding(model, event.node)
    return function is not None and any(
        type(node) is cst.Call and callee_name(node) == "requires_grad_"
        and (not node.args or bool_literal(node.args[0].value) is True)
        or type(node) is cst.Assign and bool_literal(node.value) is True and any(_is_requires_grad(t.target) for t in node.targets)
        for node in model.file.walk(function.body)
    )


def _tests_for_any_tensor(test: cst.BaseExpression) -> bool:
    """``torch.is_tensor(x)``, ``isinstance(x, torch.Tensor)``, ``x.is_leaf``: a test no walk over parameters needs."""
    for node in walk(test):
        if type(node) is cst.Attribute and node.attr.value == "is_leaf":
            return True
        if type(node) is cst.Call:
            name = callee_name(node)
            if name == "is_tensor":
                return True
            args = positional_args(node)
            if name == "isinstance" and len(args) == 2 and any(terminal(n) == "Tensor" for n in walk(args[1].value) if type(n) in (cst.Name, cst.Attribute)):
                return True
    return False


def _inside_own_zero_grad(model: LoopModel, event: Event) -> bool:
    """Whether the zeroing is written inside a class's ``zero_grad`` method (``_zero_grad_group_helper`` too)."""
    function = function_holding(model, event.node)
    while function is not None:
        if "zero_grad" in function.name.value and model.index is not None and model.index.class_of.get(function):
            return True
        function = function_holding(model, function)
    return False


def _inside_optimizer_update(model: LoopModel, event: Event) -> bool:
    """Whether a manual zeroing is written in a method of an optimizer class (one whose bases, followed through the
    module's own classes, include a name ending in ``Optimizer``): the optimizer zeroes gradients its own update then
    reads (a clipping factor of 0 for an infinite norm), which ``None`` would break."""
    if not event.manual or model.index is None:
        return False
    bases: dict[str, list[str]] = {}
    for node in model.module.body:
        if type(node) is cst.ClassDef:
            bases[node.name.value] = [terminal(arg.value) or "" for arg in node.bases]
    function = function_holding(model, event.node)
    while function is not None:
        owner = model.index.class_of.get(function)
        if owner is not None and _derives_from_optimizer(owner, bases, set()):
            return True
        function = function_holding(model, function)
    return False


def _derives_from_optimizer(name: str, bases: dict[str, list[str]], seen: set[str]) -> bool:
    if name in seen:
        return False
    seen.add(name)
    return any(base.endswith("Optimizer") or _derives_from_optimizer(base, bases, seen) for base in bases.get(name, ()))


def _in_hook_before_step(model: LoopModel, event: Event) -> bool:
    """Whether a manual zeroing sits in a method a framework calls between the backward and the optimizer step
    (Lightning's ``on_before_optimizer_step``, ``on_after_backward``): the step reads those zeros, so they are a mask
    (a layer frozen for some epochs), not a clear that ``set_to_none=True`` could replace."""
    if not event.manual:
        return False
    function = function_holding(model, event.node)
    while function is not None:
        if function.name.value in frameworks.HOOKS_BEFORE_STEP:
            return True
        function = model.index.parent_function.get(function) if model.index is not None else None
    return False


def _masks_parameters_by_name(event: Event) -> bool:
    """Whether a manual zeroing runs under a test of the name of the parameter a loop around it walks (``for name, p in
    model.named_parameters(): if ".experts" not in name: p.grad.zero_()``): it zeroes some parameters' gradients so
    that what reads them next skips them, while a clear empties them all."""
    if not event.manual:
        return False
    loop_names: set[str] = set()
    for frame in event.frames:
        if frame.kind is FrameKind.LOOP and type(frame.node) is cst.For:
            loop_names.update(names_in(frame.node.target))
    if not loop_names:
        return False
    for frame in event.frames:
        if frame.kind is FrameKind.BRANCH and type(frame.node) is cst.If and _tests_a_name(frame.node.test, loop_names):
            return True
    return False


def _same_chain(a: tuple[cst.Call, ...], b: tuple[cst.Call, ...]) -> bool:
    """Whether two events were inlined through the very same calls (both written in one function)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _tests_a_name(test: cst.BaseExpression, names: set[str]) -> bool:
    """Whether ``test`` asks of one of ``names`` (or of an expression of it, ``_canonical_name(name)``) whether a string
    is in it or it starts or ends with one."""
    for node in walk(test):
        if type(node) is cst.Comparison:
            for target in node.comparisons:
                if type(target.operator) in (cst.In, cst.NotIn) and type(node.left) in (cst.SimpleString, cst.FormattedString):
                    if names_in(target.comparator) & names:
                        return True
        elif type(node) is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value in ("startswith", "endswith"):
            if names_in(node.func.value) & names:
                return True
    return False


def _caller_chose_in_place(event: Event) -> bool:
    """Whether the zeroing is the ``else`` of ``if set_to_none:`` (``set_grads_to_None``...): the caller picked it."""
    for frame in event.frames:
        if frame.kind is FrameKind.BRANCH and frame.branch == "else" and type(frame.node) is cst.If:
            name = dotted_name(frame.node.test) if type(frame.node.test) in (cst.Name, cst.Attribute) else None
            if name and re.search(r"to_?none", name, re.IGNORECASE):
                return True
    return False


def _no_next_backward(root, event: Event) -> bool:
    """Whether the clear is in code that backpropagates but never steps, and no loop around it backpropagates again
    (a one-off gradient check)."""
    kinds = root.kinds_in(None)
    if EventKind.STEP in kinds or EventKind.BACKWARD not in kinds:
        return False  # a clearing helper alone is judged as written
    return not any(EventKind.BACKWARD in root.kinds_in(loop) for loop in event.loops)


# A comment beside ``set_to_none=False`` that gives a reason about the buffers.
_REASON_COMMENT = re.compile(r"none|keep|kept|buffer|alloc|memory|graph|pointer|reuse|in.place|resident|stable", re.IGNORECASE)
# A comment saying the buffers are kept on purpose.
_KEEP_COMMENT = re.compile(r"resident|keep\w*\b.*\b(grad|buffer)|stable\b.*\b(buffer|address|pointer)|data_ptr|peak.memory", re.IGNORECASE)


def _kept_on_purpose(model: LoopModel, root, event: Event) -> bool:
    """Whether the code says the buffers stay: a comment beside an explicit ``set_to_none=False``, a comment in the
    function about keeping them resident, or a test that mocks ``zero_grad`` to check the argument it receives."""
    lines = (model.text if model.text is not None else model.module.code).splitlines()
    line = model.line(event.node)
    if not event.manual:
        beside = lines[line - 1] if line - 1 < len(lines) else ""
        above = lines[line - 2].strip() if line >= 2 else ""
        comments = [text.partition("#")[2] for text in (beside, above) if "#" in text]
        if any(_REASON_COMMENT.search(c) for c in comments):
            return True
    start, _, end, _ = model.position(root.node)
    if any(_KEEP_COMMENT.search(text) for text in lines[start - 1 : end] if "#" in text):
        return True
    for node in model.file.walk(root.node):
        if type(node) is cst.Call and callee_name(node) in ("patch", "object"):
            if any(type(a.value) is cst.SimpleString and "zero_grad" in (a.value.evaluated_value or "") for a in node.args):
                return True
    return False
