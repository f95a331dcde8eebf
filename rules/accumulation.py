"""Rules about gradient accumulation beyond clearing and dividing (GL006–GL008, GL010, GL011, GL014–GL016).

When clipping runs, who divides the loss by the number of micro-batches (the
loop itself or the framework it hands the loss to), and whether the step waits
for the accumulation boundary.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from gradlint.events import EventKind
from gradlint.findings import FixKind, Severity
from gradlint.fixes.accumulation import drop_division
from gradlint import frameworks
from gradlint.frameworks.framework import Backward, LossHook, ReturnedLoss
from gradlint.frameworks.settings import FrameworkSettings, counts_more_than_one, framework_settings, subscript_key
from gradlint.model import GRAD_DIVIDE, HANDOFF, Event, Frame, FrameKind, LoopModel, Root
from gradlint.parsed_file import ParsedFile
from gradlint.objects import ObjKind
from gradlint.optimizer_updates import UpdateScale, stepped_update_scale, too_small
from gradlint.queries import (
    accumulation,
    accumulation_place,
    clears,
    exclusive,
    frames_inside,
    function_holding,
    home_loop,
    leaves_before,
    lies_in,
    param_sources,
    runs_every_micro_batch,
    same_object,
    single_branch_guards,
    split_by_setting,
    steps_with_loops,
)
from gradlint.counters import (
    CounterStart, counter_start, flag_remainder_test, remainder_or_pass_end_test, remainder_test, window_offset,
)
from gradlint.rule import BACKWARD, STEP, Report, Rule
from gradlint.syntax import boolean_terms, callee_name, class_methods, dotted_name, keyword_arg, number, positional_args, receiver, walk


class ClipPerMicroBatch(Rule):
    """Gradients are clipped on every micro-batch while the optimizer steps only once per accumulation, or after the step.

    **Why it matters.** Clipping is meant for the gradient the optimizer
    applies: the sum over all micro-batches of an accumulation. Clipping on
    every micro-batch clips partial sums instead: the first micro-batches'
    share is clipped again and again, the clipping threshold no longer
    bounds the step, and the result depends on how the batch was split.
    Inside ``with accelerator.accumulate(model):`` ``optimizer.step()`` is a
    no-op on the micro-batches that do not sync, but
    ``accelerator.clip_grad_norm_`` is not (accelerate's own examples guard
    it with ``if accelerator.sync_gradients:``); under DDP those gradients
    are not even all-reduced yet, and with fp16 it unscales on every
    micro-batch, which raises (accelerate issue #641, fixed in diffusers'
    scripts by PR #721). Clipping after ``optimizer.step()`` in the
    same iteration is the opposite mistake: the step has already used the
    unclipped gradients, and the clipped ones are cleared before the next
    backward (also in a per-batch update method with no loop that clears,
    backpropagates and steps itself:
    ``fixtures/realworld/gl006_clip_after_step_in_update_method__rlkit.py``). Clipping before the backward, with a clear since the last
    step, clips nothing: the step applies the unclipped gradients of the
    backward that follows (or a clip after that backward acts alone, and the
    first is dead code:
    ``fixtures/realworld/gl006_generator_clipped_before_backward__mead-baseline.py``). So does a backward helper that clips first and
    backpropagates after (``clip_grad_norm_(shared, m); loss.backward()``,
    the step left to its caller): it clips what was there before the call.

    **Fix.** Clip exactly once per optimizer step, after the last backward
    of the accumulation and before the step: under the same guard as the
    step (``if accelerator.sync_gradients:`` with accelerate).

    Clipping written out in the module counts whatever it is called
    (``clipper.step(params)``): a function or method of the module that
    reads ``.grad``, computes ``max_norm / (total_norm + eps)``, caps it at 1
    and scales the gradients by it, as ``clip_grad_norm_`` does. So does a
    clipper built elsewhere and held under a name that says so
    (``self.gradient_clipper(model)``, a configured ``clip_grad_norm_``:
    ``fixtures/realworld/gl006_configured_clipper_every_micro_batch__modalities.py``).
    The backward may also run in a function of another module of the run
    that only builds the loss and backpropagates it
    (``sft_microbatch_train_step(log_probs, mask, accum)``:
    ``fixtures/crossfile/backward_in_microbatch_helper__cs336``).

    **Bad**::

        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / accum).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()

    **Good**::

        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()

    **Stays quiet when** the clip only measures the norm
    (``max_norm=float("inf")``); the clip sits under an accumulation guard or
    leaves the loop before the step; the clip names a model the accumulating
    optimizer is known not to be built from (a GAN's critic clipped in a
    helper the generator's micro-batch loop also calls:
    ``fixtures/realworld/gl006_critic_clip_in_generator_helper_correct__Reward-Forcing.py``);
    the step's ``if state.acc_step == 0:``
    tests a counter that nothing keeps in range with ``%`` (only
    ``acc_step = (acc_step + 1) % n`` makes it 0 once in ``n`` micro-batches); inside ``accelerator.accumulate()``, when
    the module builds its ``Accelerator`` without an accumulation setting
    that may exceed 1 (every batch then syncs); after the step, when a backward or another step
    follows the clip in the same iteration (it may be meant for them) or the
    loop never clears the stepped optimizer's gradients (the clipped values
    would then reach the next step); before the backward, when a backward
    or a step comes between the last clear and the clip (the clip then
    clips that backward's gradients, as
    ``fixtures/accumulation/ok_gl006_clip_between_backward_and_step.py``
    does), when the clear runs only under a guard, or when nothing clears.
    """

    code = "GL006"
    name = "clip-per-micro-batch"
    summary = "gradients are clipped on each micro-batch of an accumulation, after the step, or before the backward"
    severity = Severity.WARNING
    fix = None  # where the clip belongs depends on what else the loop does between backward and step
    # clip_grad_norm_, clip_grad_value_, clip_gradients; clipping written out in the module reads ``.grad``
    needs = ((BACKWARD, STEP, "clip_grad"), (BACKWARD, STEP, ".grad"), (BACKWARD, STEP, "clipper"))

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            reported: set[int] = set()
            for report in self._per_micro_batch(model, root):
                reported.add(id(report.node))
                yield report
            for report in self._in_accumulate(model, root):
                if id(report.node) not in reported:
                    reported.add(id(report.node))
                    yield report
            for report in self._after_step(model, root):
                if id(report.node) not in reported:
                    reported.add(id(report.node))
                    yield report
            for report in self._before_backward(model, root):
                if id(report.node) not in reported:
                    yield report

    def _per_micro_batch(self, model: LoopModel, root: Root) -> Iterator[Report]:
        """Clips that run on every micro-batch while the step waits for the accumulation boundary."""
        seen: set[int] = set()
        for step, loop in steps_with_loops(root):
            acc = accumulation(root, step, loop)
            if acc is None:
                continue
            for clip in root.events_of(EventKind.CLIP, loop):
                if id(clip) in seen or not _clips(clip) or not runs_every_micro_batch(clip, loop, acc):
                    continue
                if leaves_before(clip, step) or exclusive(clip, step) or _clips_another_model(model, clip, step):
                    continue
                if acc.style == "micro_loop" and _clips_loop_element(clip, acc.frame):
                    continue  # ``for name, sae in saes.items(): ...; clip_grad_norm_(sae.parameters())``: one model each
                named = _clipped_optimizer(clip)
                if named is not None and not same_object(named, step.target):
                    continue  # ``self.clip_gradients(opt_d, ...)``: judged against ``opt_d``'s own step
                seen.add(id(clip))
                yield Report(
                    clip.node,
                    f"`{model.code(clip.node)}` clips on every micro-batch but `{step.target}` only steps "
                    f"{accumulation_place(model, acc)}: it clips partial sums of the gradients; clip once, right before the step",
                    event=clip, against=(step,), setting=acc.count,
                )

    def _in_accumulate(self, model: LoopModel, root: Root) -> Iterator[Report]:
        """Clips inside a framework's accumulation context with no test of its sync flag around them."""
        for clip in root.events_of(EventKind.CLIP):
            context = _accumulate_frame(clip)
            if context is None or not _clips(clip) or any(f.kind is FrameKind.BRANCH and f.accumulation for f in clip.frames):
                continue
            if not root.events_of(EventKind.STEP, context) or not root.events_of(EventKind.BACKWARD, context):
                continue  # no step, or nothing backpropagated in the block: no partial sums to clip
            found = frameworks.accumulate_call(context)
            if found is None:
                continue
            declared = found[0]
            setting = framework_settings(model).accumulation_of(declared.settings)
            if setting.built and not setting.may_accumulate:
                return  # every batch syncs, so every batch may clip
            yield Report(clip.node, declared.clip_message(model.code(clip.node), model.line(context.node)))

    def _after_step(self, model: LoopModel, root: Root) -> Iterator[Report]:
        """Clips that come after the step in the same iteration, with nothing after them that could use them."""
        for clip in root.events_of(EventKind.CLIP):
            if not _clips(clip):
                continue
            loop = clip.loops[-1] if clip.loops else None
            if loop is None and (type(root.node) is not cst.FunctionDef or clip.call_chain):
                continue  # outside a loop: only a per-batch function's own code (``def train_from_torch(self, batch)``)
            events = root.events_in(loop) if loop is not None else root.events
            at = root.order(clip)
            if any(root.order(e) > at and e.kind in (EventKind.BACKWARD, EventKind.STEP) for e in events):
                continue
            steps = [
                e for e in events
                if e.kind is EventKind.STEP and root.order(e) < at and not exclusive(e, clip)
                and (home_loop(root, e) is loop if loop is not None else not e.loops)
            ]
            if not steps:
                continue
            step = steps[-1]
            zeros = root.events_of(EventKind.ZERO, loop) if loop is not None else [z for z in root.events if z.kind is EventKind.ZERO]
            if not any(clears(model, z, step.target) for z in zeros):
                continue
            if loop is None and (
                _clips_another_model(model, clip, step)
                or not any(e.kind is EventKind.BACKWARD and root.order(e) < root.order(step) for e in events)
            ):
                continue  # a function's own backward, clear and step: the clip after them is wasted on every call
            yield Report(
                clip.node,
                f"`{model.code(clip.node)}` clips after `{step.target}` stepped at line {model.line(step.node)}: "
                f"the step already used the unclipped gradients; clip between the backward and the step",
                event=clip, against=(step,),
            )


    def _before_backward(self, model: LoopModel, root: Root) -> Iterator[Report]:
        """Clips that run before the backward of their step, on gradients a clear already emptied; or first thing in a
        function that backpropagates right after (a backward helper: the clip never sees that backward's gradients)."""
        for clip in root.events_of(EventKind.CLIP):
            if not _clips(clip) or any(f.accumulation for f in clip.frames):
                continue
            if not clip.loops:
                report = _clip_opening_backward_helper(model, root, clip)
                if report is not None:
                    yield report
                continue
            loop = clip.loops[-1]
            events = root.events_in(loop)
            position = next(i for i, e in enumerate(events) if e is clip)
            later = [
                e for e in events[position + 1:]
                if e.kind in (EventKind.BACKWARD, EventKind.STEP, EventKind.CLIP) and not exclusive(e, clip)
            ]
            # a clip between the backward and the step (``clip_grad_norm_(parameters)``) is the one that acts
            between = [e for e in later[1:] if e.kind is not EventKind.CLIP][:1]
            if not later or later[0].kind is not EventKind.BACKWARD or not between or between[0].kind is not EventKind.STEP:
                continue  # the next thing is not "backward, then step": the clip is no stray before a backward
            backward, step = later[0], between[0]
            acting = next((e for e in later[1:] if e.kind is EventKind.CLIP and root.order(e) < root.order(step)), None)
            if step.target is None or any(f.accumulation for f in step.frames) or home_loop(root, step) is not loop:
                continue
            if _clips_another_model(model, clip, step):
                continue
            clear = _emptied_by(model, events, position, step.target)
            if clear is None:
                continue
            if acting is not None:
                outcome = (f"the clip at line {model.line(acting.node)}, after the backward, is the one that acts; drop "
                           f"this one, or clip what it meant to there")
            else:
                outcome = (f"`{step.target}` steps at line {model.line(step.node)} with unclipped gradients; clip "
                           f"between the backward and the step")
            yield Report(
                clip.node,
                f"`{model.code(clip.node)}` runs before the backward at line {model.line(backward.node)}, on the "
                f"gradients `{model.code(clear.node)}` at line {model.line(clear.node)} cleared: it clips nothing, and "
                f"{outcome}",
                event=clip, against=(backward, step),
            )


def _clip_opening_backward_helper(model: LoopModel, root: Root, clip: Event) -> Report | None:
    """``def backward(self, losses): loss = ...; clip_grad_norm_(params, m); loss.backward()``: a function whose first
    gradient event is the clip and whose next is a backward, with no step in it. Whatever the caller does around it,
    the clip acts on the gradients from before the call (zero after a clear, or earlier micro-batches' partial sums)
    and never on this backward's."""
    if type(root.node) is not cst.FunctionDef or clip.call_chain:
        return None
    kinds = (EventKind.BACKWARD, EventKind.STEP, EventKind.ZERO, EventKind.CLIP, EventKind.UNSCALE, HANDOFF)
    events = [e for e in root.events if e.kind in kinds]
    position = events.index(clip)
    if position != 0 or len(events) < 2 or events[1].kind is not EventKind.BACKWARD:
        return None
    if any(e.kind in (EventKind.STEP, EventKind.ZERO, HANDOFF) for e in events):
        return None  # the function steps or clears itself: the loop rules judge it
    if not any(r.events_of(EventKind.STEP) for r in model.roots):
        return None  # nothing in the module steps after it: no step applies the unclipped gradients here
    backward = events[1]
    if exclusive(backward, clip) or leaves_before(clip, backward):
        return None
    return Report(
        clip.node,
        f"`{model.code(clip.node)}` runs before the backward at line {model.line(backward.node)}: it clips the gradients "
        f"that were there before `{root.node.name.value}` was called, never this backward's, and the step that follows "
        f"applies them unclipped; clip after the backward",
        event=clip, against=(backward,),
    )


def _emptied_by(model: LoopModel, events: list[Event], position: int, optimizer: str) -> Event | None:
    """The clear of ``optimizer``'s gradients that comes last before ``events[position]``, read back around the
    iteration, when no backward or step comes between; None when one does, or when nothing clears."""
    for back in range(1, len(events)):
        event = events[position - back]  # a negative index reads the iteration's end: the previous iteration
        if event.kind in (EventKind.BACKWARD, EventKind.STEP, HANDOFF):
            return None
        if event.kind is EventKind.ZERO and clears(model, event, optimizer):
            if event.recovers or any(f.accumulation for f in event.frames) or leaves_before(event, events[position]):
                return None  # a clear that does not run on every iteration, or leaves before the clip
            return event
    return None


def _clips_another_model(model: LoopModel, clip: Event, step: Event) -> bool:
    """Whether the clip names a model the stepped optimizer is known not to be built from: a GAN's critic clipped in a
    helper the generator's micro-batch loop also calls (``self.model.fake_score.clip_grad_norm_(...)``, or
    ``clip_grad_norm_(critic.parameters(), ...)``, against an optimizer built from ``generator`` alone)."""
    sources = param_sources(model, step.target or "")
    clipped = _clipped_model(clip.node)
    return bool(sources) and clipped is not None and clipped not in sources


def _clips_loop_element(clip: Event, loop: Frame) -> bool:
    """Whether the clip names a model the loop binds on each iteration: a loop over models (``for name, sae in
    self.saes.items()``), each iteration backpropagating into and clipping its own model, is no loop over micro-batches
    of one gradient."""
    clipped = _clipped_model(clip.node)
    if clipped is None or type(loop.node) is not cst.For:
        return False
    return clipped in {n.value for n in walk(loop.node.target) if type(n) is cst.Name}


def _clipped_optimizer(clip: Event) -> str | None:
    """The optimizer a framework's clip method is handed first (Lightning's ``self.clip_gradients(opt_d, ...)`` clips
    the parameters ``opt_d`` holds), or None."""
    call = clip.node
    if type(call) is not cst.Call or callee_name(call) not in frameworks.CLIP_METHODS:
        return None
    first = next(iter(positional_args(call)), None) or keyword_arg(call, "optimizer")
    return dotted_name(first.value) if first is not None else None


def _clipped_model(call: cst.CSTNode) -> str | None:
    """The last name of the model a clip names: the receiver of a model's own ``clip_grad_norm_`` (FSDP's), or ``X`` of
    ``clip_grad_norm_(X.parameters(), ...)``."""
    if type(call) is not cst.Call or type(call.func) not in (cst.Attribute, cst.Name):
        return None
    if type(call.func) is cst.Attribute:
        owner = dotted_name(call.func.value)
        if call.func.attr.value.startswith("clip_grad") and owner is not None and owner.split(".")[-1] not in ("utils", "nn", "torch", "clip_grad"):
            return owner.split(".")[-1]
    first = next(iter(positional_args(call)), None)
    if first is not None and type(first.value) is cst.Call and type(first.value.func) is cst.Attribute:
        if first.value.func.attr.value == "parameters":
            name = dotted_name(first.value.func.value)
            return name.split(".")[-1] if name is not None else None
    return None


def _clips(clip: Event) -> bool:
    """Whether a clipping call can change gradients: not when its threshold is infinite (it only measures the norm)."""
    call = clip.node
    if type(call) is not cst.Call or clip.framework == "by_hand":
        return True  # the module's own clipping: its threshold is not an argument of this call
    args = positional_args(call)
    threshold = keyword_arg(call, "max_norm") or keyword_arg(call, "clip_value") or keyword_arg(call, "gradient_clip_val")
    if threshold is None:  # clip_grad_norm_(params, max_norm); model.clip_grad_norm_(max_norm) (FSDP)
        threshold = args[1] if len(args) >= 2 else (args[0] if len(args) == 1 else None)
    if threshold is not None and type(threshold.value) is cst.Name and threshold.value.value == "None":
        return False  # a project's clip_grad_value_(params, None) only measures the norm (torch's would raise)
    return threshold is None or not _is_infinite(threshold.value)


def _is_infinite(node: cst.BaseExpression) -> bool:
    """``float("inf")``, ``math.inf``, ``torch.inf``, ``np.inf``."""
    if type(node) is cst.Call and dotted_name(node.func) == "float":
        args = positional_args(node)
        return len(args) == 1 and type(args[0].value) is cst.SimpleString and args[0].value.evaluated_value.lower() in ("inf", "infinity")
    name = dotted_name(node)
    return name is not None and name.rsplit(".", 1)[-1] == "inf"


def _accumulate_frame(event: Event) -> Frame | None:
    """The innermost framework accumulation context around an event (``with accelerator.accumulate(...)``)."""
    return next((f for f in reversed(event.frames) if f.kind is FrameKind.WITH and f.context == "accumulate"), None)


class LossDividedTwice(Rule):
    """The loss is divided by the accumulation count by hand, and again by the framework it is handed to.

    **Why it matters.** Some frameworks divide the loss by the number of
    accumulated micro-batches themselves. accelerate's
    ``Accelerator.backward`` computes ``loss = loss /
    self.gradient_accumulation_steps`` before backpropagating (set by
    ``Accelerator(gradient_accumulation_steps=N)``); Lightning's automatic
    optimization divides what ``training_step`` returns by
    ``trainer.accumulate_grad_batches`` (``ClosureResult`` in
    ``loops/optimization/automatic.py``); DeepSpeed's ``engine.backward``
    divides by the config's ``gradient_accumulation_steps`` unless called
    with ``scale_wrt_gas=False``. Dividing by N as well makes the
    gradients N times too small: with SGD every step is N times too small
    (the learning rate is secretly divided by N); with Adam and its kin,
    which divide their update by the gradient's scale, the steps barely
    change, but clipping thresholds, ``eps`` and logged gradient norms see
    gradients N times too small. The message says which, for the optimizer
    the loop steps. Nothing fails.

    **Fix.** Hand the framework the undivided loss.

    **Bad**::

        from accelerate import Accelerator

        accelerator = Accelerator(gradient_accumulation_steps=args.accum)
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss / args.accum
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()

    **Good**::

        from accelerate import Accelerator

        accelerator = Accelerator(gradient_accumulation_steps=args.accum)
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()

    **Stays quiet when** the divisor is not visibly the count the framework
    uses: the same expression as the module's ``Accelerator(
    gradient_accumulation_steps=...)``, ``Trainer(accumulate_grad_batches=...)``
    or DeepSpeed config ``"gradient_accumulation_steps"`` (a literal 1 does
    not count), a read of that key from the configuration handed to
    ``deepspeed.initialize`` (``ds_config["gradient_accumulation_steps"]``,
    ``.get(...)``, a name assigned one: however the dict was made, also by
    ``json.load``), or the framework's own ``accelerator.gradient_accumulation_steps``,
    ``engine.gradient_accumulation_steps()`` or
    ``self.trainer.accumulate_grad_batches``, or, for ``accelerator.backward``,
    a name the module reads from the DeepSpeed config's
    ``"gradient_accumulation_steps"`` (accelerate hands the loss to the engine,
    which divides by that count:
    ``fixtures/realworld/gl007_count_read_from_deepspeed_config__accelerate.py``);
    the ``Accelerator`` is built
    elsewhere, configured through a plugin or the environment; a DeepSpeed
    config is read from a file; ``engine.backward(loss, scale_wrt_gas=False)``;
    the LightningModule sets ``automatic_optimization = False``; the backward
    belongs to a transformers ``Trainer`` subclass (its accelerator is built
    with ``num_steps=1`` and the Trainer divides by itself). The fix (unsafe:
    it changes every step's size) drops the division.
    """

    code = "GL007"
    name = "loss-divided-twice"
    summary = "the loss is divided by the accumulation count by hand and again by the framework"
    severity = Severity.WARNING
    fix = FixKind.UNSAFE
    # A framework backward that divides: a backward and the setting; a method whose returned loss the framework
    # divides: its own tokens (the setting, the method, the base class).
    needs = (
        *((BACKWARD, token) for token in frameworks.DIVIDED_COUNT_TOKENS),
        *(returned.tokens for returned in frameworks.RETURNED_LOSSES),
    )

    def check(self, model: LoopModel) -> Iterator[Report]:
        settings = framework_settings(model)
        owned = {id(f) for role in frameworks.OWNS_BACKWARDS_OF for cls in settings.classes_of(role) for f in class_methods(cls)}
        for root in model.roots:
            if id(root.node) in owned:
                continue  # a method the framework runs inside its own training step: it divides for itself
            for backward in root.events_of(EventKind.BACKWARD):
                declared = frameworks.dividing_backward(backward)
                if backward.call_chain or declared is None:
                    continue
                yield from self._framework_backward(model, root, backward, declared, settings)
        for returned in frameworks.RETURNED_LOSSES:
            for cls in settings.classes_of(returned.classes):
                yield from self._returned(model, cls, returned, settings)

    def _framework_backward(
        self, model: LoopModel, root: Root, backward: Event, declared: Backward, settings: FrameworkSettings
    ) -> Iterator[Report]:
        call = backward.node
        if type(call) is not cst.Call or backward.loss is None:
            return
        owner = dotted_name(receiver(call))
        count = declared.count
        if count.opted_out is not None and count.opted_out(call):
            return  # ``engine.backward(loss, scale_wrt_gas=False)``: the framework divides nothing this time
        setting = settings.accumulation_of(count.settings)
        counts = setting.counts
        framework = count.divides_again.format(call=model.code(call.func))
        at = root.order(backward)
        step = next(
            (e for e in root.events_of(EventKind.STEP) if root.order(e) > at and e.target_kind is ObjKind.OPTIMIZER), None,
        )
        effect = too_small(*stepped_update_scale(model, step)) if step is not None else too_small(UpdateScale.UNKNOWN, None)
        position = model.position(call)[:2]
        for division, divisor in _divisions(model, root.node, backward.loss, position):
            if (
                _matches(model, divisor, counts)
                or (owner is not None and count.own_count(divisor, owner))
                or (
                    _reads_config_count(model, root.node, divisor, setting.config_reads)
                    and (not counts or any(counts_more_than_one(c) for c in counts))  # not a count written as 1
                )
            ):
                yield _report(model, division, divisor, framework, effect)
                continue
            read = count.read_elsewhere(model, divisor) if count.read_elsewhere is not None else None
            if read is not None:
                # No fix: where the other engine does not run, the hand division is the only one.
                yield Report(division, count.read_elsewhere_message(model.code(divisor), model.line(read), model.code(call.func)))

    def _returned(self, model: LoopModel, cls: cst.ClassDef, returned: ReturnedLoss, settings: FrameworkSettings) -> Iterator[Report]:
        """Divisions of the loss a method returns to a framework that divides it by its count again."""
        if returned.manual(cls):
            return
        step = next((f for f in class_methods(cls) if f.name.value == returned.method), None)
        if step is None:
            return
        framework = returned.divides_again
        counts = settings.accumulation_of(returned.settings).counts
        for node in walk(step):
            if type(node) is not cst.Return or node.value is None:
                continue
            value = node.value
            if type(value) is cst.Dict:
                value = next((e.value for e in value.elements if type(e) is cst.DictElement and _is_key(e.key, "loss")), None)
                if value is None:
                    continue
            for division, divisor in _divisions(model, step, value, model.position(node)[:2]):
                if _matches(model, divisor, counts) or dotted_name(divisor) == returned.own_count:
                    yield _report(model, division, divisor, framework, too_small(UpdateScale.UNKNOWN, None))


def _report(model: LoopModel, division: cst.CSTNode, divisor: cst.BaseExpression, framework: str, effect: str) -> Report:
    return Report(
        division,
        f"the loss is divided by `{model.code(divisor)}` here and {framework}: {effect}",
        fix=drop_division(model, division),
    )


def _assignments_in(parsed: ParsedFile, scope: cst.CSTNode) -> dict[str, list[cst.CSTNode]]:
    """Every assignment under ``scope`` (nested functions included), by the dotted name it assigns.

    One walk per scope and file: a module-level loop with many backwards
    would otherwise walk the whole module once per backward.
    """
    return parsed.once((_assignments_in, id(scope)), lambda: _collect_assignments(parsed, scope))


def _collect_assignments(parsed: ParsedFile, scope: cst.CSTNode) -> dict[str, list[cst.CSTNode]]:
    found: dict[str, list[cst.CSTNode]] = {}
    for node in parsed.walk(scope):
        if type(node) is cst.Assign:
            for name in {dotted_name(t.target) for t in node.targets} - {None}:
                found.setdefault(name, []).append(node)
        elif type(node) in (cst.AugAssign, cst.AnnAssign):
            name = dotted_name(node.target)
            if name is not None:
                found.setdefault(name, []).append(node)
    return found


def _divisions(model: LoopModel, scope: cst.CSTNode, loss: cst.BaseExpression, before: tuple[int, int]) -> list[tuple[cst.CSTNode, cst.BaseExpression]]:
    """Where ``loss`` was divided on its way to ``before``: ``(division, divisor)`` pairs.

    The loss itself (``backward(loss / n)``), or the last assignment to its
    name before that position in the same function (``loss = x / n``,
    ``loss /= n``), when it is written in a block that holds the use: one in
    a branch of its own may not run on the way there.
    """
    if _is_division(loss):
        return [(loss, loss.right)]
    name = dotted_name(loss)
    if name is None:
        return []
    last: tuple[tuple[int, int], cst.CSTNode] | None = None
    for node in _assignments_in(model.file, scope).get(name, ()):
        at = model.position(node)[:2]
        if at < before and (last is None or at > last[0]):
            last = (at, node)
    if last is None or not _on_the_way(model.file, last[1], loss):
        return []
    node = last[1]
    if type(node) is cst.AugAssign:
        return [(node, node.value)] if type(node.operator) is cst.DivideAssign else []
    value = node.value
    return [(value, value.right)] if value is not None and _is_division(value) else []


def _on_the_way(parsed: ParsedFile, assignment: cst.CSTNode, use: cst.CSTNode) -> bool:
    """Whether ``use`` lies in the block that holds ``assignment`` (not in another branch of an ``if``)."""
    table = parsed.parent_map()
    block = table.get(assignment)
    while block is not None and type(block) not in (cst.IndentedBlock, cst.SimpleStatementSuite, cst.Module):
        block = table.get(block)
    node: cst.CSTNode | None = use
    while node is not None and node is not block:
        node = table.get(node)
    return node is not None


def _is_division(node: cst.CSTNode) -> bool:
    return type(node) is cst.BinaryOperation and type(node.operator) is cst.Divide


def _matches(model: LoopModel, divisor: cst.BaseExpression, counts: list[cst.BaseExpression]) -> bool:
    """Whether the divisor is written as one of the framework's accumulation settings (one that may exceed 1)."""
    text = model.code(divisor)
    return any(counts_more_than_one(c) and model.code(c) == text for c in counts)


def _reads_config_count(model: LoopModel, scope: cst.CSTNode, divisor: cst.BaseExpression, reads: list[tuple[str, str]]) -> bool:
    """Whether the divisor reads the count from a configuration handed to the framework: ``ds_config["..."]``,
    ``config.get("...")``, ``int(...)`` of one, or a name assigned one in the same scope (``gas = ds_config["..."]``)."""
    if not reads:
        return False
    candidates = [divisor]
    name = dotted_name(divisor)
    if name is not None:
        candidates += [node.value for node in _assignments_in(model.file, scope).get(name, ()) if type(node) is cst.Assign]
    for candidate in candidates:
        if type(candidate) is cst.Call and callee_name(candidate) in ("int", "float") and len(candidate.args) == 1:
            candidate = candidate.args[0].value
        if subscript_key(candidate) in reads:
            return True
    return False




def _is_key(node: cst.BaseExpression, key: str) -> bool:
    return type(node) is cst.SimpleString and node.evaluated_value == key


class NumItemsInBatchIgnored(Rule):
    """A transformers ``Trainer`` subclass overrides ``compute_loss``, ignores ``num_items_in_batch``, and the Trainer mis-scales what it returns.

    **Why it matters.** Two bugs of one family. Under gradient accumulation
    the right loss is the sum over every token of the accumulated
    micro-batches divided by their total number of tokens. The mean of each
    micro-batch's own token mean weighs a token of a short (heavily padded)
    micro-batch more than one of a long micro-batch: the bug transformers
    fixed in late 2024 by passing ``num_items_in_batch`` (the tokens of the
    whole accumulated batch) to ``compute_loss``. An override that accepts
    the argument and returns ``cross_entropy(...)`` with the default mean
    reduction brings that bug back.

    The second is N times worse. ``Trainer.__init__`` sets
    ``model_accepts_loss_kwargs`` from the model (its ``accepts_loss_kwargs``,
    else whether its forward takes arbitrary keyword arguments:
    transformers' causal LMs do), and ``training_step`` then takes the loss ``compute_loss`` returns
    as already normalised over the accumulated batch and skips its own
    division by the gradient accumulation steps: in transformers 4.49-4.52
    whenever ``model_accepts_loss_kwargs`` (``if not
    self.model_accepts_loss_kwargs and self.compute_loss_func is None``); in
    4.48 and from 4.53 on when ``num_items_in_batch`` was counted, that is
    when the first micro-batch has ``labels`` (``get_batch_samples`` /
    ``_get_num_items_in_batch``); and whenever a ``compute_loss_func`` is
    given. An override that computes its own loss (a preference, policy or
    distillation loss, or the model's own ``outputs.loss``, computed without
    ``num_items_in_batch``) returns a per-micro-batch value that nothing
    divides: each optimizer step is the accumulation count times too large.
    trl fixed its DPO, BCO, CPO, GRPO and KTO trainers by setting
    ``self.model_accepts_loss_kwargs = False`` after ``super().__init__``.
    (transformers 4.46.x-4.47.x divided no loss at all, whatever the
    subclass; transformers 5 reads a class attribute ``loss_is_scaled_for_ga``
    first when it is set.)

    **Fix.** For a token-mean loss: sum the per-token losses and divide by
    ``num_items_in_batch`` when it is given (keep the mean when it is None,
    outside training). For a loss of its own: set
    ``self.model_accepts_loss_kwargs = False`` after ``super().__init__``
    (the Trainer then divides), or divide by
    ``self.args.gradient_accumulation_steps`` in ``compute_loss``.

    **Bad**::

        import torch.nn.functional as F
        from transformers import AutoModelForCausalLM, Trainer


        class PreferenceTrainer(Trainer):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                chosen = model(inputs["chosen_ids"]).logits[:, -1].logsumexp(-1)
                rejected = model(inputs["rejected_ids"]).logits[:, -1].logsumexp(-1)
                loss = -F.logsigmoid(chosen - rejected).mean()
                return loss

    **Good**::

        import torch.nn.functional as F
        from transformers import AutoModelForCausalLM, Trainer


        class PreferenceTrainer(Trainer):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.model_accepts_loss_kwargs = False  # the loss is our own: let the Trainer divide it

            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                chosen = model(inputs["chosen_ids"]).logits[:, -1].logsumexp(-1)
                rejected = model(inputs["rejected_ids"]).logits[:, -1].logsumexp(-1)
                loss = -F.logsigmoid(chosen - rejected).mean()
                return loss

    The class may derive from the Trainer through classes of the module or
    through a base a factory of the module makes: ``class X(base_cls)`` with
    ``base_cls = get_trainer_class(args)`` (every ``return`` of which is a
    Trainer), ``base_cls = SFTTrainer if sft else Trainer``, or ``base_cls`` a
    parameter of the function that defines the class, every call of which
    hands it a Trainer. The token mean may be computed in a helper of the
    module (``self._token_mean(logits, labels)``, a static method, a module
    function).

    **Stays quiet when** the override uses ``num_items_in_batch`` anywhere
    or calls ``super().compute_loss``; its signature has no
    ``num_items_in_batch``; the class does not derive from
    ``transformers.Trainer``, ``Seq2SeqTrainer`` or trl's ``SFTTrainer`` in
    this module (trl's DPO, GRPO, KTO, reward and RLOO trainers set
    ``model_accepts_loss_kwargs = False`` themselves: the Trainer divides
    their losses); a factory may return another class. The token-mean finding also needs the returned loss to be
    visibly a mean cross-entropy (``F.cross_entropy``/``nll_loss``,
    ``CrossEntropyLoss``/``NLLLoss`` with the default reduction) over tokens
    whose number varies per batch (``ignore_index``, ``-100`` labels,
    shifted labels, ``vocab_size``: a classification loss over a fixed
    number of examples per batch is fine). Otherwise the skipped-division
    finding stays quiet when the module names ``model_accepts_loss_kwargs``,
    ``loss_is_scaled_for_ga`` or ``accepts_loss_kwargs`` in code anywhere
    (set on ``self``, on the trainer it builds, on a model, as a class
    attribute, through ``setattr``, or only read); the class or a Trainer subclass of the module it derives from
    defines ``training_step``, ``get_batch_samples`` or
    ``_get_num_items_in_batch``; nothing shows a model whose forward takes
    arbitrary keyword arguments: neither a ``...ForCausalLM`` / ``CAUSAL_LM`` name in the
    module nor an ``SFTTrainer`` base (a sequence classifier of transformers
    4.x takes none and the Trainer divides); the class (with its Trainer
    bases of the module) never reads ``.logits``, so the model it trains
    may not return a transformers output; the module defines a model of
    its own (a class whose ``forward`` takes no arbitrary keyword arguments, a reward
    head around a causal LM, say) that may be the one handed to the
    Trainer; ``compute_loss``
    reads ``gradient_accumulation_steps`` (``self.args.gradient_accumulation_steps``,
    ``self.current_gradient_accumulation_steps``); it returns nothing, ``None``
    or a visible sum (``.sum()``, ``torch.sum``, ``sum(...)``,
    ``reduction="sum"``).
    """

    code = "GL008"
    name = "num-items-in-batch-ignored"
    summary = "a Trainer's compute_loss ignores num_items_in_batch: a token mean, or a loss nothing divides by N"
    severity = Severity.WARNING
    fix = None  # the normalisation depends on how the loss is built
    needs = tuple(hook.tokens for hook in frameworks.LOSS_HOOKS)

    def check(self, model: LoopModel) -> Iterator[Report]:
        settings = framework_settings(model)
        for hook in frameworks.LOSS_HOOKS:
            owners = settings.classes_of(hook.classes)
            local = {c.name.value: c for c in owners}
            for cls in owners:
                yield from self._hook(model, hook, cls, local, settings)

    def _hook(
        self, model: LoopModel, hook: LossHook, cls: cst.ClassDef, local: dict[str, cst.ClassDef], settings: FrameworkSettings
    ) -> Iterator[Report]:
        function = next((f for f in class_methods(cls) if f.name.value == hook.method), None)
        if function is None:
            return
        parameter = _parameter(function, hook.count_parameter)
        if parameter is None or _uses_name(function, hook.count_parameter) or _calls_super(function, hook.method):
            return
        losses = _returned_losses(model, function)
        token_mean = next((loss for loss in losses if _is_mean_cross_entropy(model, function, loss)), None)
        undivided = _division_skipped(model, hook, cls, function, _returned_losses(model, function, keep_unresolved=True), local, settings)
        if token_mean is not None and any(_over_tokens(f) for f in _token_helpers(model, function)):
            yield Report(parameter.name, hook.token_mean_message(cls.name.value, model.line(token_mean), undivided))
        elif undivided:
            yield Report(function.name, hook.undivided_message(cls.name.value))


def _division_skipped(
    model: LoopModel,
    hook: LossHook,
    cls: cst.ClassDef,
    function: cst.FunctionDef,
    losses: list[cst.BaseExpression],
    local: dict[str, cst.ClassDef],
    settings: FrameworkSettings,
) -> bool:
    """Whether the framework visibly takes the hook's own loss as normalised and skips the division by the steps.

    The caller has checked that the hook ignores the count it is handed and
    does not call the parent's. Left: the loss is neither unknown, nor a
    sum, nor nothing, and the framework says it skips the division
    (:attr:`gradlint.frameworks.framework.LossHook.skips_division`).
    """
    if not losses or any(_is_sum(loss) or _is_none(loss) for loss in losses):
        return False
    return hook.skips_division(model, cls, function, local, settings)


def _is_none(value: cst.BaseExpression) -> bool:
    return type(value) is cst.Name and value.value == "None"


def _is_sum(loss: cst.BaseExpression) -> bool:
    """``x.sum()``, ``torch.sum(x)`` or a loss call with ``reduction="sum"``: not a mean the Trainer would divide."""
    if type(loss) is not cst.Call:
        return False
    if callee_name(loss) == "sum":
        return True
    reduction = keyword_arg(loss, "reduction")
    return reduction is not None and type(reduction.value) is cst.SimpleString and reduction.value.evaluated_value == "sum"


def _parameter(function: cst.FunctionDef, name: str) -> cst.Param | None:
    params = function.params
    return next((p for p in (*params.params, *params.kwonly_params) if p.name.value == name), None)


def _uses_name(function: cst.FunctionDef, name: str) -> bool:
    body = function.body
    return any(type(node) is cst.Name and node.value == name for node in walk(body, into_lambdas=True))


def _calls_super(function: cst.FunctionDef, method: str) -> bool:
    for node in walk(function.body):
        if type(node) is cst.Call and callee_name(node) == method and type(node.func) is cst.Attribute:
            owner = node.func.value
            if type(owner) is cst.Call and dotted_name(owner.func) == "super":
                return True
    return False


def _returned_losses(model: LoopModel, function: cst.FunctionDef, keep_unresolved: bool = False) -> list[cst.BaseExpression]:
    """The loss expressions ``compute_loss`` returns: ``loss``, ``(loss, outputs)``, ``(loss, outputs) if ... else loss``, names resolved.

    A name whose value cannot be followed (unpacked from a tuple, changed in
    place) is left out, or kept as the name with ``keep_unresolved``.
    """
    found: list[cst.BaseExpression] = []
    for node in model.file.walk(function.body):
        if type(node) is not cst.Return or node.value is None:
            continue
        pending = [node.value]
        while pending:
            value = pending.pop()
            if type(value) is cst.IfExp:
                pending.extend((value.body, value.orelse))
            elif type(value) is cst.Tuple and value.elements:
                pending.append(value.elements[0].value)
            else:
                resolved = _last_value(model, function, value, model.position(node)[:2])
                if resolved is not None:
                    found.append(resolved)
                elif keep_unresolved:
                    found.append(value)
    return found


def _last_value(model: LoopModel, function: cst.FunctionDef, value: cst.BaseExpression, before: tuple[int, int]) -> cst.BaseExpression | None:
    """``value`` itself, or for a name the value of its last assignment before ``before`` in the same block path."""
    name = dotted_name(value)
    if name is None or type(value) is not cst.Name:
        return value
    last: tuple[tuple[int, int], cst.Assign] | None = None
    for node in model.file.walk(function.body):
        if type(node) in (cst.AugAssign, cst.AnnAssign) and dotted_name(node.target) == name:
            return None  # changed in place or annotated: not followed
        if type(node) is cst.Assign and any(dotted_name(t.target) == name for t in node.targets):
            at = model.position(node)[:2]
            if at < before and (last is None or at > last[0]):
                last = (at, node)
    if last is None or not _on_the_way(model.file, last[1], value):
        return None
    return last[1].value


_MEAN_LOSSES = {"cross_entropy", "nll_loss"}
_MEAN_LOSS_CLASSES = {"CrossEntropyLoss", "NLLLoss"}


def _is_mean_cross_entropy(model: LoopModel, function: cst.FunctionDef, loss: cst.BaseExpression, depth: int = 0) -> bool:
    """``F.cross_entropy(...)`` or ``CrossEntropyLoss()(...)`` / ``loss_fct(...)`` with the default mean reduction,
    also returned by a helper of the module every return of which is one (``self._token_mean(logits, labels)``,
    a static method, a module function)."""
    if type(loss) is not cst.Call:
        return False
    name = callee_name(loss)
    if name in _MEAN_LOSSES:
        return _reduces_by_mean(loss)
    if type(loss.func) is cst.Call and callee_name(loss.func) in _MEAN_LOSS_CLASSES:
        return _reduces_by_mean(loss.func)
    if type(loss.func) is cst.Name:
        built = _last_value(model, function, loss.func, model.position(loss)[:2])
        if type(built) is cst.Call and callee_name(built) in _MEAN_LOSS_CLASSES and _reduces_by_mean(built):
            return True
    helper = _helper(model, loss, function)
    if helper is None or depth >= 2:
        return False
    returned = _returned_losses(model, helper, keep_unresolved=True)
    return bool(returned) and all(_is_mean_cross_entropy(model, helper, value, depth + 1) for value in returned)


def _helper(model: LoopModel, call: cst.Call, function: cst.FunctionDef) -> cst.FunctionDef | None:
    """The function of the module a call lands in: ``self.m(...)``, ``cls.m(...)``, ``Class.m(...)`` or a module function."""
    if model.index is None:
        return None
    found = model.index.resolve_function(call, function)
    if found is None and type(call.func) is cst.Attribute and type(call.func.value) is cst.Name:
        found = model.index.method_of(call.func.value.value, call.func.attr.value)
    return found if found is not function else None


def _token_helpers(model: LoopModel, function: cst.FunctionDef) -> list[cst.FunctionDef]:
    """``function`` and the helpers of the module it calls (one level): where the loss over tokens may be written."""
    found = [function]
    for node in walk(function.body):
        if type(node) is cst.Call:
            helper = _helper(model, node, function)
            if helper is not None and all(helper is not f for f in found):
                found.append(helper)
    return found


def _reduces_by_mean(call: cst.Call) -> bool:
    reduction = keyword_arg(call, "reduction")
    if reduction is None:
        return not any(a.star for a in call.args)
    return type(reduction.value) is cst.SimpleString and reduction.value.evaluated_value == "mean"


def _over_tokens(function: cst.FunctionDef) -> bool:
    """Whether the loss is visibly over tokens whose number varies: ``ignore_index``, ``-100``, shifted labels, ``vocab_size``."""
    for node in walk(function.body, into_lambdas=True):
        if type(node) is cst.Arg and node.keyword is not None and node.keyword.value == "ignore_index":
            return True
        if type(node) is cst.UnaryOperation and type(node.operator) is cst.Minus and number(node.expression) == 100:
            return True
        if type(node) is cst.Name and node.value in ("vocab_size", "shift_labels", "shift_logits"):
            return True
        if type(node) is cst.Attribute and node.attr.value == "vocab_size":
            return True
        if type(node) is cst.Slice and (number(node.lower) == 1 if node.lower is not None else False):
            return True
    return False


class LossDividedWithoutAccumulation(Rule):
    """The loss is divided by the accumulation count, but the optimizer steps and clears on every micro-batch.

    **Why it matters.** Dividing the loss by the number of micro-batches is
    right only when their gradients are summed before one step. When the
    same loop steps and clears the gradients after every backward, nothing is
    summed: each step uses one micro-batch's gradient divided by N, a step N
    times too small (with plain SGD, a learning rate N times too low), and N
    times more steps than the schedule was planned for.

    **Fix.** Step and clear under an accumulation guard
    (``if (i + 1) % accum == 0:``), or, when accumulation is not wanted, drop
    the division.

    **Bad**::

        for i, (x, y) in enumerate(loader):
            loss = loss_fn(model(x), y)
            if gradient_accumulation_steps > 1:
                loss /= gradient_accumulation_steps
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    **Good**::

        for i, (x, y) in enumerate(loader):
            loss = loss_fn(model(x), y)
            if gradient_accumulation_steps > 1:
                loss /= gradient_accumulation_steps
            loss.backward()
            if (i + 1) % gradient_accumulation_steps == 0:
                optimizer.step()
                optimizer.zero_grad()

    **Stays quiet when** the divisor's name does not say accumulation
    (``accum`` in it: a world size, a token count, a batch size divide for
    other reasons); the step or the clear is under any condition other than a
    setting fixed for the whole run (``if args.fp16:``), so some micro-batches
    may not step, or under a test of the count itself (``if accum == 1:``: it
    steps on every micro-batch only when there is nothing to accumulate); the
    loop has an accumulation guard or ``accelerator.accumulate``, or its
    backward is a framework's that decides the step itself (DeepSpeed,
    Lightning); the backward runs in an inner loop of micro-batches and
    the step after it (``fixtures/accumulation/micro_step_loop_correct.py``),
    or another backward of the loop does, before the last micro-batch's own
    (``fixtures/realworld/gl010_last_micro_batch_outside_inner_loop__lightning-thunder.py``);
    or the loss backpropagated is a sum built from divided parts
    (``loss += part / accum``) rather than the divided loss itself
    (``fixtures/accumulation/ok_loss_divided_with_accumulation.py``).

    The same when a framework's backward divides by the count its object
    was built with (``Accelerator(gradient_accumulation_steps=8)``, then
    ``accelerator.backward(loss)``) and the loop never enters the
    framework's accumulation context (``accumulate()``), the only place it
    holds the step back: the prepared optimizer steps and clears on every
    batch
    (``fixtures/realworld/gl010_framework_divides_outside_its_context__EAGLE.py``).
    A test of the context's sync flag there (``if accelerator.sync_gradients:
    clip``) holds nothing back, in a module that never enters the context
    (the flag changes only on entering it), nor does a skip of the batches
    already seen on resuming (``if resuming and step < resume_step:
    continue`` before the forward: it picks iterations, not micro-batches):
    ``fixtures/realworld/gl010_sync_flag_tested_outside_accumulate__Otter.py``.
    Also when the loop enters that context only once around itself (``with
    accelerator.accumulate(model): for mb in micro_batches: ...;
    optimizer.step()``): the framework decides at each entry whether the
    gradients sync, so on all but one entry in N nothing steps and the
    micro-batches pile up, and on that one every micro-batch steps
    (``fixtures/realworld/gl010_accumulate_entered_around_micro_batch_loop__lm-human-preference-details.py``).

    The same when the division is written on the gradients under the
    accumulation's boundary test (``if i % iter_size == 0: for p in params:
    p.grad /= iter_size``) while the step and the clear run on every
    micro-batch outside it
    (``fixtures/realworld/gl010_gradients_divided_under_guard_step_outside__action-detection.py``).

    The same when the backward runs in a function of another module of the
    run that builds the loss, divides it by a count the call hands it and
    backpropagates it (``loss, meta = grpo_microbatch_train_step(log_probs,
    mask, gradient_accumulation_steps, ...)``): the call is the backward and
    the count it hands is the division
    (``fixtures/crossfile/backward_in_microbatch_helper__cs336``).
    """

    code = "GL010"
    name = "loss-divided-without-accumulation"
    summary = "the loss is divided by the accumulation count but the step and the clear run on every micro-batch"
    severity = Severity.ERROR
    fix = None  # guard the step or drop the division: which one was meant is the author's call
    needs = ((BACKWARD, STEP, "accum"), (BACKWARD, STEP, ".grad"))

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            for backward in root.events_of(EventKind.BACKWARD):
                if backward.loss is None or not backward.loops:
                    continue
                if backward.framework is None or backward.divided_by is not None:
                    yield from self._every_micro_batch(model, root, backward, backward.loops[-1])
                elif not backward.call_chain:
                    yield from _framework_divides_outside_its_context(model, root, backward, backward.loops[-1])
            yield from _gradients_divided_under_guard(model, root)

    def _every_micro_batch(self, model: LoopModel, root: Root, backward: Event, loop: Frame) -> Iterator[Report]:
        if _accumulates(model, root, loop, backward):
            return  # the loop accumulates somewhere: GL003 and GL004 weigh it
        events = root.events_in(loop)
        if any(
            e.kind is EventKind.BACKWARD and any(f.kind is FrameKind.LOOP for f in frames_inside(e, loop)) for e in events
        ):
            return  # ``for _ in range(accum - 1): ...backward()`` then the last micro-batch's backward and the step
        at = root.order(backward)
        step = next((e for e in root.events_of(EventKind.STEP, loop) if root.order(e) > at), None)
        if step is None or step.framework is not None or step.target_kind is not ObjKind.OPTIMIZER:
            return
        if not _unconditional(step, loop, backward):
            return
        clear = next(
            (z for z in root.events_of(EventKind.ZERO, loop) if clears(model, z, step.target) and _unconditional(z, loop, backward)), None,
        )
        if clear is None:
            return
        division = _accumulation_division(model, backward, loop)
        if division is None:
            return
        node, divisor = division
        if _tests_count(step, loop, divisor) or _tests_count(clear, loop, divisor):
            return  # ``if accum == 1: optimizer.step()``: it steps every micro-batch only when the count is 1
        # Each event's own node: a helper's step is reported once, in the helper, whichever loop inlines it.
        if backward.divided_by is not None:
            divided = (
                f"the function called at line {model.line(backward.node)} divides its loss by `{model.code(divisor)}` "
                f"and backpropagates it"
            )
        else:
            divided = (
                f"the loss of the backward at line {model.line(backward.node)} is divided by `{model.code(divisor)}` "
                f"at line {model.line(node)}"
            )
        yield Report(
            step.node,
            f"`{model.code(step.node)}` steps on every micro-batch and `{model.code(clear.node)}` at line "
            f"{model.line(clear.node)} clears on every one, but {divided}: nothing "
            f"accumulates, so each step is "
            f"`{model.code(divisor)}` times too small; step and clear under an accumulation guard, or drop the division",
        )


def _accumulates(
    model: LoopModel, root: Root, loop: Frame, backward: Event, context: str = "accumulate", flag_needs_context: bool = False,
) -> bool:
    """Whether anything in the loop is under an accumulation guard or in the framework's accumulation context. A guard
    that also holds ``backward`` picks which iterations run at all, not which micro-batches step (``if resuming and
    step < resume_step: continue`` before the forward). With ``flag_needs_context`` (a framework's backward), a test of
    the context's sync flag (``if accelerator.sync_gradients:``) guards nothing in a module that never enters the
    context: the flag is set only on entering it (accelerate's ``GradientState`` starts it True), so it is the same on
    every batch."""
    for event in root.events_in(loop):
        for frame in frames_inside(event, loop):
            if frame.context == context:
                return True
            if not frame.accumulation or _holds(frame, backward):
                continue  # a guard around the backward too picks iterations, not micro-batches
            if flag_needs_context and _tests_sync_flag(frame) and not _enters(model, context):
                continue
            return True
    return False


def _tests_sync_flag(frame: Frame) -> bool:
    """Whether the frame is an ``if`` on a framework's sync flag (``if accelerator.sync_gradients:``)."""
    test = frame.node.test if type(frame.node) is cst.If else None
    return type(test) is cst.Attribute and test.attr.value in frameworks.SYNC_STEP_FLAGS


def _enters(model: LoopModel, context: str) -> bool:
    """Whether the module calls ``context`` anywhere, inside its functions too (read once per file)."""
    return model.file.once(("enters", context), lambda: any(
        type(n) is cst.Call and callee_name(n) == context for n in model.file.every_node(model.file.module)
    ))


def _holds(frame: Frame, event: Event | None) -> bool:
    """Whether ``frame`` is one of the frames around ``event``."""
    return event is not None and any(f is frame for f in event.frames)


def _framework_divides_outside_its_context(model: LoopModel, root: Root, backward: Event, loop: Frame) -> Iterator[Report]:
    """A framework's backward that divides the loss by the accumulation count of an object built with one that may
    exceed 1, in a loop that never enters the framework's accumulation context, guards nothing, and steps and clears
    a plain optimizer on every batch (``Accelerator(gradient_accumulation_steps=8)``, then ``accelerator.backward(loss);
    optimizer.step()``): outside the context the framework holds no step back, so nothing accumulates."""
    declared = frameworks.dividing_backward(backward)
    count = declared.count if declared is not None else None
    if count is None or count.held_back_only_in is None or count.unheld_message is None:
        return
    # the context entered once around the whole loop (``with accelerator.accumulate(model): for mb in ...:``)
    outer = next((backward.frames[:at] for at, f in enumerate(backward.frames) if f is loop), ())
    around = next((f for f in outer if f.context == count.held_back_only_in), None)
    if _accumulates(model, root, loop, backward, count.held_back_only_in, flag_needs_context=True):
        return
    setting = framework_settings(model).accumulation_of(count.settings)
    if setting.without_count:
        return  # some construction divides by nothing: the backward may be that one's
    counted = next((c for c in setting.counts if counts_more_than_one(c)), None)
    if counted is None:
        return
    at = root.order(backward)
    step = next((e for e in root.events_of(EventKind.STEP, loop) if root.order(e) > at), None)
    if step is None or step.framework is not None or step.target_kind is not ObjKind.OPTIMIZER or not _unconditional(step, loop, backward):
        return
    if not any(clears(model, z, step.target) and _unconditional(z, loop, backward) for z in root.events_of(EventKind.ZERO, loop)):
        return
    if around is not None and count.entered_around_message is not None:
        message = count.entered_around_message(
            model.code(step.node), model.line(around.node), model.line(loop.node), model.code(counted), model.line(counted),
        )
    else:
        message = count.unheld_message(
            model.code(step.node), model.code(backward.node), model.line(backward.node), model.code(counted), model.line(counted),
        )
    yield Report(step.node, message, event=step, against=(backward,))


def _gradients_divided_under_guard(model: LoopModel, root: Root) -> Iterator[Report]:
    """``if i % iter_size == 0: for p in params: p.grad /= iter_size`` in a loop that steps and clears on every
    micro-batch: the accumulation's division of the gradients is written, its step is not."""
    seen: set[int] = set()
    for step, loop in steps_with_loops(root):
        if id(step.node) in seen or step.framework is not None or step.target_kind is not ObjKind.OPTIMIZER:
            continue
        if not _unconditional(step, loop) or step.loops[-1] is not loop:
            continue
        events = root.events_in(loop)
        at = root.order(step)
        if not any(e.kind is EventKind.BACKWARD and root.order(e) < at for e in events):
            continue
        clear = next((z for z in root.events_of(EventKind.ZERO, loop) if clears(model, z, step.target) and _unconditional(z, loop)), None)
        if clear is None:
            continue
        found = _guard_dividing_gradients(root, loop)
        if found is None or any(e.kind is EventKind.STEP and e.inside(found[0]) for e in events):
            continue
        seen.add(id(step.node))
        guard, division = found
        yield Report(
            step.node,
            f"`{model.code(step.node)}` steps and `{model.code(clear.node)}` at line {model.line(clear.node)} clears on "
            f"every micro-batch, but the gradients are divided at line {model.line(division.node)} under "
            f"`if {model.code(guard.node.test)}:` (line {model.line(guard.node)}), the accumulation's boundary: nothing "
            f"accumulates, and the step on that micro-batch applies its own gradient divided; step and clear under that test",
            event=step,
        )


def _guard_dividing_gradients(root: Root, loop: Frame) -> tuple[Frame, Event] | None:
    """A division of the gradients in place (``p.grad /= k``, ``p.grad.div_(k)``: a GRAD_DIVIDE event) under an ``if``
    among the loop body's statements whose test is a remainder of a counter (``i % k == 0``): (that ``if``'s frame,
    the division)."""
    statements = getattr(getattr(loop.node, "body", None), "body", ())
    for division in root.events_of(GRAD_DIVIDE, loop):
        for frame in frames_inside(division, loop):
            if type(frame.node) is cst.If and remainder_test(frame.node.test) is not None and any(
                frame.node is statement for statement in statements
            ):
                return frame, division
    return None


def _unconditional(event: Event, loop: Frame, backward: Event | None = None) -> bool:
    """Whether an event runs on every iteration of ``loop`` (of those that run ``backward``, when given): no branch
    around it inside the loop but a fixed setting or one that also holds ``backward``, no inner loop, no ``except``
    handler."""
    return all(
        f.kind is FrameKind.WITH or (f.kind is FrameKind.BRANCH and f.fixed and f.branch in ("if", "else")) or _holds(f, backward)
        for f in frames_inside(event, loop)
    )


def _tests_count(event: Event, loop: Frame, divisor: cst.BaseExpression) -> bool:
    """Whether a branch around ``event`` inside ``loop`` tests the accumulation count (the divisor, or a name that says
    accumulation)."""
    for frame in frames_inside(event, loop):
        if frame.kind is FrameKind.BRANCH and type(frame.node) is cst.If:
            names = [n for n in walk(frame.node.test) if type(n) in (cst.Name, cst.Attribute)]
            if any(dotted_name(n) == dotted_name(divisor) or _names_accumulation(n) for n in names):
                return True
    return False


def _accumulation_division(model: LoopModel, backward: Event, loop: Frame) -> tuple[cst.CSTNode, cst.BaseExpression] | None:
    """Where the backpropagated loss was divided by an accumulation count in this iteration: ``backward(loss / accum)``,
    or the last assignment to its name before the backward inside ``loop`` (``loss /= accum``, ``loss = x / accum``),
    written on the way to the backward or under a test of the count itself (``if accum > 1:``). The name is looked
    up only when the backward itself lies in the loop's code (not in a helper the loop calls)."""
    if backward.divided_by is not None:  # a helper of another file divides by what the call hands it
        return (backward.node, backward.divided_by) if _names_accumulation(backward.divided_by) else None
    loss = backward.loss
    if _is_division(loss):
        return (loss, loss.right) if _names_accumulation(loss.right) else None
    if not lies_in(model, backward.node, loop.node):
        return None
    before = model.position(backward.node)[:2]
    name = dotted_name(loss)
    if name is None:
        return None
    last = None
    for node in _assignments_in(model.file, loop.node).get(name, ()):
        at = model.position(node)[:2]
        if at < before and (last is None or at > last[0]):
            last = (at, node)
    if last is None:
        return None
    node = last[1]
    if type(node) is cst.AugAssign and type(node.operator) is cst.DivideAssign:
        found = (node, node.value)
    elif type(node) is cst.Assign and _is_division(node.value):
        found = (node.value, node.value.right)
    else:
        return None
    if not _names_accumulation(found[1]):
        return None
    if _on_the_way(model.file, node, loss) or _under_test_of(model.file, node, found[1], loss):
        return found
    return None


def _names_accumulation(divisor: cst.BaseExpression) -> bool:
    """``gradient_accumulation_steps``, ``args.accum_iter``, ``self.grad_accum``: a name that says accumulation."""
    name = dotted_name(divisor)
    return name is not None and "accum" in name.rsplit(".", 1)[-1].lower()


def _under_test_of(parsed: ParsedFile, assignment: cst.CSTNode, divisor: cst.BaseExpression, use: cst.CSTNode) -> bool:
    """``if accum > 1: loss /= accum``: the assignment sits in an ``if`` (without ``else``) that tests the divisor
    itself, and that ``if`` lies in the block that holds the use."""
    table = parsed.parent_map()
    node = table.get(assignment)
    while node is not None and type(node) is not cst.If:
        if type(node) in (cst.For, cst.While, cst.FunctionDef, cst.With, cst.Try):
            return False
        node = table.get(node)
    if node is None or node.orelse is not None:
        return False
    text = dotted_name(divisor)
    if not any(dotted_name(n) == text for n in walk(node.test) if type(n) in (cst.Name, cst.Attribute)):
        return False
    return _on_the_way(parsed, node, use)


class StepOutsideAccumulationGuard(Rule):
    """An optimizer steps under an accumulation guard and again, unguarded, on every micro-batch.

    **Why it matters.** The guard says the optimizer should step once per
    accumulation, on the sum of the micro-batches' gradients. A second
    ``step()`` of the same optimizer outside the guard runs on every
    micro-batch: it applies each partial sum as it grows (the first
    micro-batch's gradient is applied ``N`` times over), and on the
    micro-batch that reaches the guard the optimizer steps twice. Training
    goes on without an error, with ``N`` times more updates than planned
    and a learning-rate schedule and momentum fed the wrong steps. It is
    usually a leftover of the loop before accumulation was added.

    **Fix.** Keep the guarded step and delete the other one (or move it
    under the guard).

    **Bad**::

        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
            optimizer.step()

    **Good**::

        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()

    **Stays quiet when** the other step is under any condition inside the
    loop but a setting fixed for the whole run (``if i == len(loader) - 1:``
    flushes a last partial accumulation once); the two steps sit in the two
    branches of one ``if`` (``if (i + 1) % accum == 0: ... else: ...``) or of
    a setting (``if accum > 1:``); the other step is in an ``except`` handler
    or inside ``accelerator.accumulate()`` (accelerate skips a prepared
    optimizer's ``step()`` until the micro-batch that syncs); the steps are a
    framework's (a DeepSpeed engine decides its own boundary) or of
    different optimizers.
    """

    code = "GL011"
    name = "step-outside-accumulation-guard"
    summary = "an optimizer steps under an accumulation guard and again on every micro-batch"
    severity = Severity.ERROR
    fix = None  # which of the two steps was meant is the author's call; the guarded one almost always
    needs = ((BACKWARD, STEP),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            reported: set[int] = set()
            for step, loop in steps_with_loops(root):
                if step.framework is not None or step.target_kind is not ObjKind.OPTIMIZER:
                    continue
                acc = accumulation(root, step, loop)
                if acc is None or acc.style != "guard" or not step.inside(acc.frame):
                    continue
                for other in root.events_of(EventKind.STEP, loop):
                    if other is step or id(other.node) in reported or not _steps_every_micro_batch(other, step, loop, acc):
                        continue
                    reported.add(id(other.node))
                    yield Report(
                        other.node,
                        f"`{model.code(other.node)}` steps `{step.target}` on every micro-batch, but `{step.target}` "
                        f"also steps {accumulation_place(model, acc)} (`{model.code(step.node)}`): between the "
                        f"boundaries this step applies the partial sums of the accumulating gradients, and at each "
                        f"boundary the optimizer steps twice; delete this step and keep the guarded one",
                    )


def _steps_every_micro_batch(other: Event, step: Event, loop: Frame, acc) -> bool:
    """Whether ``other`` is a plain step of ``step``'s optimizer that runs on every micro-batch of ``loop``."""
    if other.framework is not None or other.target_kind is not ObjKind.OPTIMIZER:
        return False
    if not same_object(other.target, step.target):
        return False
    if not runs_every_micro_batch(other, loop, acc) or not _unconditional(other, loop):
        return False
    if exclusive(other, step) or split_by_setting(other, step) or other.with_context("accumulate"):
        return False
    return not other.recovers


class ClipOnlyUnderAccumulationGuard(Rule):
    """Clipping sits under an accumulation guard, but the optimizer steps and clears on every micro-batch outside it.

    **Why it matters.** The guard (``if step % gradient_accumulation_steps == 0:``)
    says the gradients of N micro-batches should be summed and stepped once,
    clipped first. When the ``step()`` and the clear stay outside the guard,
    nothing accumulates: every micro-batch is its own step, so the setting
    changes nothing about the update, and only one step in N is clipped; the
    other N - 1 apply their gradients unclipped, which is exactly what clipping
    was there to prevent (a loss spike passes straight into the weights).

    **Fix.** Move the optimizer's ``step()`` and ``zero_grad()`` (and a
    per-step scheduler) under the guard, after the clip; or, when accumulation
    is not wanted, take the clip out of the guard so that every step is clipped.

    **Bad**::

        for i, batch in enumerate(loader):
            model(batch).backward()
            if (i + 1) % gradient_accumulation_steps == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()

    **Good**::

        for i, batch in enumerate(loader):
            (model(batch) / gradient_accumulation_steps).backward()
            if (i + 1) % gradient_accumulation_steps == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()

    **Stays quiet when** the guard's test names no accumulation count
    (``accum`` in a name it tests: ``if step % log_every == 0:`` is another
    matter); an optimizer steps, or is handed to a call the module cannot see
    into, inside the guard; a step after the clip runs under any condition but
    a setting fixed for the whole run or a test that the optimizer exists
    (``if optimizer1 is not None:``), or is a framework's, or is not cleared on
    every micro-batch as well; no step follows the clip in the iteration
    (``fixtures/accumulation/gl015_clip_only_under_guard_correct.py``).
    """

    code = "GL015"
    name = "clip-only-under-accumulation-guard"
    summary = "clipping sits under an accumulation guard but the optimizer steps and clears on every micro-batch"
    severity = Severity.ERROR
    fix = None  # move the step under the guard, or the clip out of it: which one was meant is the author's call
    needs = ((BACKWARD, STEP, "clip", "accum"),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            for clip in root.events_of(EventKind.CLIP):
                guard = _accumulation_guard(clip)
                if guard is None or not clip.loops:
                    continue
                loop = next((f for f in reversed(clip.frames[: clip.frames.index(guard)]) if f.kind is FrameKind.LOOP), None)
                if loop is None:
                    continue
                guarded = [e for e in root.events_in(loop) if guard in e.frames and e.kind in (EventKind.STEP, HANDOFF)]
                if guarded:
                    continue  # something steps, or may step, under the guard: the accumulation may be real
                at = root.order(clip)
                after = [e for e in root.events_of(EventKind.STEP, loop) if root.order(e) > at]
                if not after or not all(_steps_and_clears_every_micro_batch(model, root, step, loop) for step in after):
                    continue
                others = "".join(f", `{s.target}` at line {model.line(s.node)}" for s in after[1:] if s.target != after[0].target)
                yield Report(
                    after[0].node,
                    f"`{after[0].target}` steps and is cleared on every micro-batch{others} too, but the clip at line "
                    f"{model.line(clip.node)} runs only under `if {model.code(guard.node.test)}:`: nothing accumulates, and "
                    f"the steps in between apply unclipped gradients; move the steps and the clears under that guard, "
                    f"after the clip (or take the clip out of it)",
                    event=after[0], against=(clip,),
                )


def _accumulation_guard(event: Event) -> Frame | None:
    """The innermost accumulation guard around ``event`` whose test names an accumulation count."""
    for frame in reversed(event.frames):
        if frame.kind is FrameKind.BRANCH and frame.accumulation and type(frame.node) is cst.If and frame.branch == "if":
            if any(_names_accumulation(n) for n in walk(frame.node.test) if type(n) in (cst.Name, cst.Attribute)):
                return frame
            return None
    return None


def _steps_and_clears_every_micro_batch(model: LoopModel, root: Root, step: Event, loop: Frame) -> bool:
    """Whether an optimizer's own step runs, and its clear too, on every iteration of ``loop``: no condition around
    either but a fixed setting or ``if <the optimizer> is not None:``."""
    if step.framework is not None or step.target_kind is not ObjKind.OPTIMIZER:
        return False

    def unconditional(event: Event) -> bool:
        for frame in frames_inside(event, loop):
            if frame.kind is FrameKind.WITH or (frame.kind is FrameKind.BRANCH and frame.fixed and frame.branch in ("if", "else")):
                continue
            if frame.kind is FrameKind.BRANCH and frame.branch == "if" and type(frame.node) is cst.If and _exists(frame.node.test, step.target):
                continue
            return False
        return True

    if not unconditional(step):
        return False
    return any(clears(model, z, step.target) and unconditional(z) for z in root.events_of(EventKind.ZERO, loop))


def _exists(test: cst.BaseExpression, target: str | None) -> bool:
    """``optimizer1 is not None``: a test that the optimizer was built, the same on every batch."""
    return (
        type(test) is cst.Comparison and len(test.comparisons) == 1 and type(test.comparisons[0].operator) is cst.IsNot
        and dotted_name(test.comparisons[0].comparator) == "None" and target is not None and dotted_name(test.left) == target
    )


class ShiftedAccumulationWindow(Rule):
    """The accumulation guard's remainder is zero one micro-batch off the window's end: every window is shifted.

    **Why it matters.** ``for i, batch in enumerate(loader):`` counts from 0,
    so ``if i % accum == 0: optimizer.step()`` is true first on the very
    first micro-batch: the first step applies one micro-batch of a loss
    divided by ``accum``, each later window ends one micro-batch late, and
    the micro-batches after the last multiple of ``accum`` in each pass over
    the loader are never stepped (their gradients are wiped by the next
    pass's first clear, or added into its first step). The same with
    ``enumerate(loader, start=1)`` and ``(i + 1) % accum == 0``: windows of
    ``accum - 1``. Nothing fails; the loss curve looks normal. The test may
    be a flag bound once above the guard (``should_step = i % accum == 0``,
    then ``if should_step:``:
    ``fixtures/accumulation/gl014_shifted_window_through_step_flag__hifi-gan.py``).

    **Fix.** Test the remainder of the number of micro-batches seen so far:
    ``(i + 1) % accum == 0`` when ``i`` counts from 0, ``i % accum == 0``
    when it counts from 1.

    **Stays quiet when**

    - the step runs before the backward of its iteration (``if i % accum ==
      0: optimizer.step(); optimizer.zero_grad()`` at the top of the loop
      steps the window that has just ended);
    - the guard holds more than the remainder (``... and i > 0``; a test
      that an object is there, ``self.optimizer is not None and ...``, is
      no more, nor is an ``or`` with a test of the pass's end, ``... or i
      >= n_batches - 1``, which only steps what is left:
      ``fixtures/realworld/gl014_shifted_guard_with_pass_end_clause__cellmap-segmentation-challenge.py``),
      or the index starts at a value that is not a
      literal (``start=start_step``; ``start=start_step + 1`` is read with
      ``start_step`` at its literal default, ``def train_epoch(...,
      start_step=0)``: a fresh run), or the loop body assigns the index, or
      a test inside the guard reads the counter again (``if not (accum > 1
      and total_step == 0):``: the windows are no longer the guard's);
    - a counter kept by hand (``step = 0`` before the loop, ``step += 1`` in
      it) is judged only when it is set to a literal (a restore from a
      checkpoint under an ``if`` aside) and incremented once in every
      iteration, with no ``continue`` between the guard and the increment;
      one kept on ``self`` (``self.step``, read by a helper the loop calls)
      also only when no method but ``__init__`` sets it elsewhere
      (``fixtures/realworld/gl014_counter_on_self_shifted_guard__fastNLP.py``);
      in a method run once per batch (a callback's ``on_batch_end``), one that
      ``__init__`` sets to a literal, the method increments before the guard and
      only the guard sets back to that literal (every window then counts as
      the first: ``fixtures/realworld/gl014_callback_counter_set_back_in_guard__catalyst.py``);
      any other counter is not judged (``fixtures/accumulation/ok_accumulation_window_offsets.py``);
    - the count is a literal that makes the offset right (``(i + 3) % 2 ==
      0`` from 0), or exceeds 1 only where a framework's engine steps at its
      own boundary (accelerate's count read from a DeepSpeed config, else 1:
      ``fixtures/realworld/gl302_count_from_deepspeed_config__accelerate.py``).

    **Bad**::

        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / accum).backward()
            if i % accum == 0:
                optimizer.step()
                optimizer.zero_grad()

    **Good**::

        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
    """

    code = "GL014"
    name = "shifted-accumulation-window"
    summary = "the step's guard is zero one micro-batch off the window's end (`i % k == 0` with `i` from 0)"
    severity = Severity.ERROR
    fix = None  # the test to write depends on what the counter counts, which the author knows
    needs = ((BACKWARD, STEP),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            for step, loop, acc in single_branch_guards(root):
                guard = acc.frame
                shift = _window_shift(model, guard.node, loop, step.call_chain)
                if shift is None or frameworks.count_above_one_only_under_own_engine(model, shift[3]):
                    continue
                index, counter, offset, count, ends_pass = shift
                if _counter_tested_again(step, loop, guard, index):
                    continue  # ``if not (accum > 1 and step == 0):`` inside the guard: the windows are not the guard's
                start = counter.start
                off = start + offset - 1  # > 0: each window ends that many micro-batches early; < 0: late
                plural = "es" if abs(off) > 1 else ""
                tested = (
                    model.code(next(t for t in boolean_terms(guard.node.test, cst.Or) if remainder_test(t) is not None))
                    if ends_pass else model.code(guard.node.test)
                )
                if counter.reset_at is not None:
                    if off < 0:
                        continue  # set back to its start at each window's end: how long a window is depends on k
                    yield Report(
                        guard.node.test,
                        f"`{step.target}` steps at line {model.line(step.node)} where `{model.code(guard.node.test)}`, "
                        f"with `{index}` counted from {start}{_kept_by_hand(model, counter)} and set back at line "
                        f"{model.line(counter.reset_at)} after each step: every window holds "
                        f"`{model.code(count)} - {off}` micro-batches, not `{model.code(count)}` (at a count of "
                        f"{off + 1} every micro-batch steps); test "
                        f"`{index} % {model.code(count)} == 0`",
                        event=step,
                    )
                    continue
                if off < 0:
                    shape = (f"the first window holds {-off} micro-batch{plural} and every later one ends {-off} "
                             f"micro-batch{plural} late")
                else:
                    shape = (f"every window ends {off} micro-batch{plural} early (the first holds "
                             f"{model.code(count)} - {off})")
                counted = index if start == 1 else f"({index} + {1 - start})" if start < 1 else f"({index} - {start - 1})"
                if type(loop.node) is cst.While:  # driven by hand, it may stop right after a step: no pass's end to miss
                    effect = "so the first step sums fewer micro-batches than the others"
                elif ends_pass:
                    effect = ("so the first step of a pass sums fewer micro-batches than the others (the guard's test of the "
                              "pass's end only steps what is left)")
                else:
                    effect = ("so the last micro-batches of a pass wait for the next pass's first step (or, after the last "
                              "pass, are never stepped)")
                yield Report(
                    guard.node.test,
                    f"`{step.target}` steps at line {model.line(step.node)} where `{tested}`, with "
                    f"`{index}` counted from {start}{_kept_by_hand(model, counter)}{_fresh_run(counter)}: {shape}, "
                    f"{effect}; test `{counted} % {model.code(count)} == 0`",
                    event=step,
                )


def _counter_tested_again(step: Event, loop: Frame, guard: Frame, counter: str) -> bool:
    """Whether a branch between the guard and the step tests the counter again (``if total_step > 0:``)."""
    inner = frames_inside(step, loop)
    after = inner[next((i for i, f in enumerate(inner) if f is guard), len(inner)) + 1:]
    return any(
        f.kind is FrameKind.BRANCH and type(f.node) is cst.If
        and any(type(n) is cst.Name and n.value == counter for n in walk(f.node.test))
        for f in after
    )


def _fresh_run(counter: CounterStart) -> str:
    if counter.from_default is None:
        return ""
    return f" on a fresh run (`{counter.from_default}` at its default)"


def _kept_by_hand(model: LoopModel, counter: CounterStart) -> str:
    if counter.set_at is None or counter.incremented_at is None:
        return ""
    where = "after" if counter.after_guard else "before"
    return (f" (set at line {model.line(counter.set_at)}, incremented {where} the guard at line "
            f"{model.line(counter.incremented_at)})")


def _window_shift(
    model: LoopModel, guard: cst.If, loop: Frame, via: tuple[cst.Call, ...] = ()
) -> tuple[str, CounterStart, int, cst.BaseExpression] | None:
    """(counter, its start, the offset added to it, the count, whether the guard also steps at the pass's end) for a
    guard ``(i + c) % k == 0`` on a micro-batch counter (``loop``'s own index, or one kept by hand) that is zero off
    the window's end: ``start + c`` is the number of micro-batches seen when the remainder is taken, which must be 1
    past each window's last; None for any other test. An ``or`` with a test of the pass's end (``... or i >=
    n_batches - 1``) keeps the remainder's windows, and steps what is left at the end."""
    test = remainder_test(guard.test) or flag_remainder_test(model, guard.test, function_holding(model, guard))
    ends_pass = test is None and (test := remainder_or_pass_end_test(guard.test)) is not None
    counter = counter_start(model, loop, guard, test.counter, via) if test is not None else None
    if counter is None or not window_offset(counter.start, test):
        return None
    return test.counter, counter, test.offset, test.count, ends_pass


class LossGivenAsItsOwnGradient(Rule):
    """A loss is backpropagated with itself, scaled, as the gradient argument: ``loss.backward(loss / k)``.

    **Why it matters.** The argument of ``Tensor.backward`` is the gradient
    of the output, not a divisor: ``loss.backward(loss / k)`` multiplies
    every gradient by the loss's value over ``k`` (it backpropagates the
    square of the loss over ``2 k``). Meant as "divide the loss by the accumulation
    count", it scales each micro-batch's gradients by its own loss, so
    large losses count quadratically and the step size follows the loss.
    Nothing fails.

    **Fix.** Divide the loss, then backpropagate it: ``(loss / k).backward()``.

    **Stays quiet when**

    - the receiver is not a loss by its name (``out.backward(out)`` on a
      non-scalar output is the gradient of half its squared norm, which may
      be meant), or the call is an optimizer's or a framework's ``backward``
      (``optimizer.backward(loss / k)``, ``accelerator.backward(loss)``),
      whose argument is the loss.

    **Bad**::

        for i, batch in enumerate(loader):
            loss = model(batch)
            loss.backward(loss / GRADIENT_ACCUMULATE_EVERY)
            if (i + 1) % GRADIENT_ACCUMULATE_EVERY == 0:
                optimizer.step()
                optimizer.zero_grad()

    **Good**::

        for i, batch in enumerate(loader):
            loss = model(batch)
            (loss / GRADIENT_ACCUMULATE_EVERY).backward()
            if (i + 1) % GRADIENT_ACCUMULATE_EVERY == 0:
                optimizer.step()
                optimizer.zero_grad()
    """

    code = "GL016"
    name = "loss-given-as-its-own-gradient"
    summary = "`loss.backward(loss / k)`: the argument is the gradient, so every gradient is scaled by the loss"
    severity = Severity.ERROR
    fix = None  # what the author meant (divide by k, or nothing) is theirs to say
    needs = ((BACKWARD, "loss"),)  # the receiver is named for a loss

    def check(self, model: LoopModel) -> Iterator[Report]:
        seen: set[int] = set()
        for root in model.roots:
            for backward in root.events_of(EventKind.BACKWARD, None):
                call = backward.node
                if id(call) in seen or type(call) is not cst.Call or type(call.func) is not cst.Attribute:
                    continue
                if call.func.attr.value != "backward" or backward.framework is not None:
                    continue
                loss = dotted_name(call.func.value)
                if loss is None or "loss" not in loss.split(".")[-1].lower():
                    continue
                given = keyword_arg(call, "gradient") or next(iter(positional_args(call)), None)
                if given is None or not _scales_itself(given.value, loss):
                    continue
                seen.add(id(call))
                yield Report(
                    call,
                    f"`{model.code(call)}` hands `{model.code(given.value)}` to `backward` as the gradient of "
                    f"`{loss}`, not as the loss: every gradient is multiplied by the loss's value (it backpropagates "
                    f"`{loss}` squared); divide the loss and backpropagate that: `({model.code(given.value)}).backward()`",
                    event=backward,
                )


def _scales_itself(gradient: cst.BaseExpression, loss: str) -> bool:
    """``loss``, ``loss / k``, ``loss * w``, ``w * loss`` or ``-loss``: the loss itself, maybe scaled."""
    while type(gradient) is cst.UnaryOperation:
        gradient = gradient.expression
    if type(gradient) is cst.BinaryOperation and type(gradient.operator) in (cst.Divide, cst.Multiply):
        sides = (gradient.left,) if type(gradient.operator) is cst.Divide else (gradient.left, gradient.right)
        return any(dotted_name(side) == loss for side in sides)
    return dotted_name(gradient) == loss
