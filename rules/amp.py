"""Rules about mixed precision with a ``GradScaler`` (GL101–GL108)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from gradlint import frameworks
from gradlint.events import EventKind
from gradlint.findings import FixKind, Severity
from gradlint.fixes import amp as fixes
from gradlint.model import GRAD_READ, Event, Frame, FrameKind, LoopModel
from gradlint.kinds import ObjKind
from gradlint.objects import kind_of_constructor, last_name
from gradlint.optimizer_updates import UpdateScale, stepped_update_scale
from gradlint.queries import (
    branch_sides,
    Accumulation,
    probe_events,
    accumulation,
    accumulation_place,
    backwards_reaching,
    exclusive,
    function_holding,
    home_loop,
    in_other_branch,
    innermost_loop,
    leaves_before,
    loop_phrase,
    opposite_sides_of_settings,
    region,
    runs_every_micro_batch,
    same_object,
    stepping_loop,
    steps_with_loops,
)
from gradlint.rule import BACKWARD, SCALER, STEP, Report, Rule, Settled, call_of
from gradlint.rules.accumulation import _clips as clips_gradients
from gradlint.syntax import (
    boolean_terms,
    callee_name,
    dotted_name,
    keyword_arg,
    leaves_block,
    method_name,
    parameter_names,
    positional_args,
    receiver,
    walk,
)

_SCALER_EVENTS = (EventKind.UNSCALE, EventKind.SCALER_UPDATE)


def _uses_scaler(event: Event) -> bool:
    return event.kind in _SCALER_EVENTS or (event.kind is EventKind.STEP and event.via_scaler is not None)


def _unscales(event: Event) -> bool:
    """Whether gradients are unscaled here: ``scaler.unscale_(opt)``, or ``scaler.step(opt)``, which unscales first."""
    return event.kind is EventKind.UNSCALE or (event.kind is EventKind.STEP and event.via_scaler is not None)


def _scaler_name(event: Event) -> str:
    return event.via_scaler or event.target or "scaler"


def _presence(test: cst.BaseExpression, scaler: str) -> tuple[bool | None, bool | None]:
    """What a branch test tells about an optional scaler, when it holds and when it fails: True (the scaler is
    there), False (it is None) or None (nothing). Read from ``scaler``, ``scaler is not None``, ``not scaler``,
    ``self.scaler is None`` and their ``and``/``or`` combinations."""
    kind = type(test)
    if kind is cst.UnaryOperation and type(test.operator) is cst.Not:
        when_true, when_false = _presence(test.expression, scaler)
        return when_false, when_true
    if kind is cst.BooleanOperation:
        (left_true, left_false), (right_true, right_false) = _presence(test.left, scaler), _presence(test.right, scaler)
        if type(test.operator) is cst.And:  # holds: both hold; fails: either fails
            return (left_true if left_true is not None else right_true), (left_false if left_false == right_false else None)
        return (left_true if left_true == right_true else None), (left_false if left_false is not None else right_false)
    if kind is cst.Comparison and len(test.comparisons) == 1:
        comparison = test.comparisons[0]
        if type(comparison.comparator) is cst.Name and comparison.comparator.value == "None" and _names(test.left, scaler):
            if type(comparison.operator) in (cst.Is, cst.Equal):
                return False, True
            if type(comparison.operator) in (cst.IsNot, cst.NotEqual):
                return True, False
        return None, None
    if kind in (cst.Name, cst.Attribute) and _names(test, scaler):
        return True, False
    return None, None


def _names(node: cst.BaseExpression, scaler: str) -> bool:
    name = dotted_name(node)
    return name is not None and last_name(name) == last_name(scaler)


def _without_scaler(event: Event, scaler: str) -> bool:
    """Whether ``event`` runs only when ``scaler`` is None (``if scaler is None: loss.backward()``, the ``else`` of
    ``if scaler:``): no call through the scaler meets it, since a call through None raises."""
    for frame in event.frames:
        if frame.kind is not FrameKind.BRANCH or type(frame.node) is not cst.If or frame.branch not in ("if", "else"):
            continue
        when_true, when_false = _presence(frame.node.test, scaler)
        if (when_true if frame.branch == "if" else when_false) is False:
            return True
    return False


def _backward_of_an_owner(event: Event) -> bool:
    """``accel.backward(loss)``: an object's own ``backward`` handed the loss, which may scale it with a scaler of its
    own (audiotools' and accelerate's ``Accelerator.backward`` run ``self.scaler.scale(loss).backward()``)."""
    call = event.node
    return (
        type(call) is cst.Call and type(call.func) is cst.Attribute and call.func.attr.value == "backward"
        and any(arg.keyword is None for arg in call.args)  # handed the loss, not only ``retain_graph=...``
        and event.loss is not None and not _is_receiver_of(call, event.loss)
    )


def _is_receiver_of(call: cst.Call, loss: cst.CSTNode) -> bool:
    """``loss.backward(gradient)``, or ``torch.autograd.backward(loss)``: the plain backward."""
    receiver_name = dotted_name(call.func.value) or ""
    return call.func.value is loss or receiver_name.split(".")[-1] == "autograd"


def _loss_handed_in(model: LoopModel, backward: Event) -> bool:
    """``def _backward(self, loss): loss.backward(); self.scaler.step(opt)`` read on its own: the loss is the
    function's parameter and no caller of this module is in view, so the caller may have scaled it
    (equiformer's trainer runs ``loss = self.scaler.scale(loss) if self.scaler else loss`` before the call). Where a
    caller inlines the function, its argument tells."""
    if backward.call_chain or type(backward.loss) is not cst.Name:
        return False
    function = function_holding(model, backward.node)
    return function is not None and backward.loss.value in parameter_names(function)


class BackwardWithoutScaler(Rule):
    """A ``GradScaler`` steps the optimizer, but the loss is backpropagated without ``scaler.scale()``.

    **Why it matters.** ``scaler.step()`` unscales the gradients by the loss
    scale before stepping. If the loss was never scaled, the gradients are
    divided by a scale they never got (65536 by default): the updates are
    tiny, and float16 gradients may underflow to zero.

    **Fix.** ``scaler.scale(loss).backward()``.

    **Stays quiet when**

    - another backward of the same loop is scaled (the scaler is optional:
      ``if scaler: ... else: loss.backward()``; also with keyword arguments,
      ``scaler.scale(loss).backward(retain_graph=...)``:
      ``fixtures/realworld/ok_gl101_scaled_backward_with_retain_graph__torch4keras.py``), or the backward runs only
      when the scaler is None (``if scaler is None: loss.backward()``);
    - a framework backpropagates (``accelerator.backward``, Lightning, a
      DeepSpeed engine), or an object's own ``backward`` is handed the loss
      (``accel.backward(loss)``: audiotools' ``Accelerator`` scales it with
      its own scaler), or the loss is rebound to ``scaler.scale(loss)``
      (also through ``typing.cast``, or ``scaler.scale(loss) if scaler else
      loss``);
    - the loss is the parameter of a helper no caller in view inlines
      (``def _backward(self, loss): loss.backward(); self.scaler.step(opt)``):
      its caller may have scaled it. Where a caller of the module inlines
      the helper, the loss it hands in decides;
    - the backward is a probe: a helper that backpropagates, reads the
      gradients and clears them before returning, stepping nothing
      (``fixtures/realworld/gl002_probe_backward_in_first_step_helper__MeZO.py``).

    **Bad**::

        loss.backward()
        scaler.step(optimizer)
        scaler.update()

    **Good**::

        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """

    code = "GL101"
    name = "backward-without-scaler"
    summary = "a GradScaler is in use but the loss is backpropagated without scaler.scale()"
    severity = Severity.ERROR
    fix = FixKind.SAFE
    # A scaler in use: scaler.step(), scaler.update() or scaler.unscale_().
    needs = ((BACKWARD, STEP, SCALER), (BACKWARD, call_of("update"), SCALER), (BACKWARD, call_of("unscale_"), SCALER))

    def check(self, model: LoopModel) -> Iterator[Report]:
        settled = Settled()
        for root in model.roots:
            done: set[int] = set()  # regions whose every unscaled backward is settled
            for user in (e for e in root.events if _uses_scaler(e)):
                loop = innermost_loop(user)
                if id(loop) in done:
                    continue
                events = region(root, user)
                scaler = _scaler_name(user)
                probes = probe_events(root)
                backwards = [
                    e for e in events
                    if e.kind is EventKind.BACKWARD and e.framework is None and not _without_scaler(e, scaler)
                    and id(e) not in probes and not _backward_of_an_owner(e) and not _loss_handed_in(model, e)
                ]
                if any(b.scaled for b in backwards):
                    done.add(id(loop))
                    continue
                for backward in backwards:
                    if backward.node in settled:
                        continue
                    yield settled.note(
                        Report(
                            backward.node,
                            f"`{scaler}` is used at line {model.line(user.node)} but this backward is not scaled: "
                            f"use `{scaler}.scale({model.code(backward.loss) if backward.loss is not None else 'loss'}).backward()`",
                            fix=fixes.scale_backward(model, backward, user),
                        )
                    )
                if all(b.node in settled for b in backwards):
                    done.add(id(loop))


class StepBypassesScaler(Rule):
    """The loss is backpropagated through ``scaler.scale()``, but the optimizer is stepped directly.

    **Why it matters.** The gradients are still multiplied by the loss scale,
    so ``optimizer.step()`` applies updates thousands of times too large, and
    steps with inf/NaN gradients are not skipped.

    **Fix.** ``scaler.step(optimizer)`` followed by ``scaler.update()``.

    **Stays quiet when**

    - the direct step and the scaled backward sit in complementary branches
      (``if amp: scaler.step(opt) else: opt.step()``), also when each branch
      calls its own method, or on opposite sides of the same settings in
      different ``if``s (the backward under ``if args.fp16:`` and ``if
      args.amp == "pytorch":`` in a helper, the step in the ``else`` of ``if
      args.fp16 and args.amp == "pytorch":``);
    - the optimizer is also stepped through the scaler, or steps a closure,
      or its ``step`` is handed the scaler (``self.optim.step(scaler=self.grad_scaler)``:
      a project's optimizer wrapper calls ``scaler.step(self.optimizer)`` itself);
    - the scaled backward feeds a given gradient
      (``features.backward(scaler.scale(f_grad))``): it reaches only that
      graph, and which optimizers own it is unknown;
    - the scale is a constant kept on purpose and the optimizer divides it
      away: the scaler is built with an explicit scale
      (``GradScaler(1024)``), nothing but ``scale(loss)`` ever uses it (no
      ``update()``, so the scale never changes), and the optimizer is Adam or
      one of its kin, whose update ``m / (sqrt(v) + eps)`` is the same for a
      gradient 1024 times larger. Half-precision kernels such as
      tiny-cuda-nn's are trained this way. With SGD, a default scale, or a
      scale that ``update()`` grows until it overflows, it is flagged.

    **Bad**::

        scaler.scale(loss).backward()
        optimizer.step()

    **Good**::

        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """

    code = "GL102"
    name = "step-bypasses-scaler"
    summary = "a scaled backward is followed by optimizer.step() instead of scaler.step(optimizer)"
    severity = Severity.ERROR
    fix = FixKind.SAFE
    needs = ((BACKWARD, STEP, SCALER),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            reaching: dict[int, list[Event]] = {}
            bypassing: dict[int, list[Event]] = {}  # per stepping loop: its direct steps of optimizers no scaler steps
            for backward in root.events_of(EventKind.BACKWARD):
                if not backward.scaled or backward.upstream:
                    continue  # ``features.backward(scaler.scale(grad))`` reaches only that graph: which optimizers, unknown
                loop = stepping_loop(root, backward)
                if id(loop) not in bypassing:
                    steps = root.events_of(EventKind.STEP, loop)
                    scaled = {last_name(s.target) for s in steps if s.via_scaler is not None and s.target is not None}
                    bypassing[id(loop)] = [
                        s for s in steps
                        if s.via_scaler is None and s.framework not in ("closure", "handed") and (s.target is None or last_name(s.target) not in scaled)
                    ]
                for step in bypassing[id(loop)]:
                    if id(step) not in reaching:
                        reaching[id(step)] = backwards_reaching(root.events, step, position=root.order(step))
                    if not any(b is backward for b in reaching[id(step)]) or opposite_sides_of_settings(model, backward, step):
                        continue  # another backward (or none) feeds this step
                    scaler = _scaler_of(backward, model)
                    if _constant_scale_divided_away(model, scaler, step):
                        continue
                    yield Report(
                        step.node,
                        f"the backward at line {model.line(backward.node)} is scaled by `{scaler}` but "
                        f"`{step.target}.step()` bypasses it: use `{scaler}.step({step.target})` so the gradients "
                        f"are unscaled and inf/NaN steps are skipped",
                        fix=fixes.step_through_scaler(model, step, backward),
                    )


def _constant_scale_divided_away(model: LoopModel, scaler: str, step: Event) -> bool:
    """``GradScaler(1024)`` used only to multiply the loss, and an Adam-like optimizer stepped directly.

    The scale never changes (nothing in the module but ``scaler.scale(...)``
    reads the scaler, so no ``update()`` runs and no one else is handed it),
    it was chosen (an explicit scale, not the default 65536 meant to be
    grown and backed off), and the optimizer's update divides the gradient's
    scale away.
    """
    if model.index is None:
        return False
    name = last_name(scaler)
    built = model.index.constructions.get(name, ())
    if not built or not all(_explicit_scale(call) for call in built):
        return False
    text = model.index.file.text
    for use in re.finditer(rf"(?<![\w.]){re.escape(scaler)}\b|\.{re.escape(name)}\b", text):
        after = text[use.end():use.end() + 8]
        if not (after.startswith(".scale(") or re.match(r"\s*=[^=]", after)):
            return False
    return stepped_update_scale(model, step)[0] is UpdateScale.NORMALISED


def _explicit_scale(call: cst.Call) -> bool:
    """``GradScaler(1024)``, ``GradScaler("cuda", init_scale=1024)``: a scaler built with a scale of its own."""
    if last_name(callee_name(call)) != "GradScaler":
        return False
    if keyword_arg(call, "init_scale") is not None:
        return True
    return any(type(arg.value) not in (cst.SimpleString, cst.FormattedString) for arg in positional_args(call))


def _scaler_of(backward: Event, model: LoopModel) -> str:
    """The scaler in ``scaler.scale(loss).backward()`` or ``features.backward(scaler.scale(grad))``."""
    scale = fixes.scale_call(backward.node)
    if scale is None and type(backward.node) is cst.Call and type(backward.node.func) is cst.Attribute:
        # ``scaled_loss = grad_scaler.scale(loss)`` above, then ``scaled_loss.backward()``
        loss = dotted_name(backward.node.func.value)
        values = model.index.assignments.get(function_holding(model, backward.node), {}).get(loss, []) if model.index and loss else []
        scale = next((v for v in values if type(v) is cst.Call and callee_name(v) == "scale"), None)
    return (dotted_name(receiver(scale)) or "scaler") if scale is not None else "scaler"


class ClipBeforeUnscale(Rule):
    """Gradients are clipped while they are still multiplied by the loss scale.

    **Why it matters.** After ``scaler.scale(loss).backward()`` every gradient
    is multiplied by the loss scale (65536 at first). Clipping to a norm of
    1.0 then clips almost every step, by the wrong amount, and changes as the
    scale changes.

    **Fix.** Call ``scaler.unscale_(optimizer)`` before clipping.

    **Stays quiet when**

    - ``scaler.unscale_(optimizer)`` runs between the scaled backward and the
      clip on every path (also under the backward's own condition, ``if amp:``
      around both, under ``if scaler is not None:``, or under an ``or`` one of
      whose terms the clip's own test requires: ``if clip_norm or clip_value:
      scaler.unscale_(opt)`` before ``if clip_value: clip_grad_value_(...)``), or the clip only runs
      on the unscaled branch (the ``else`` of ``if scaler is not None:``, or of
      a test the scaled backward sits on the other side of, also as an ``if``
      expression, ``scaler.scale(loss).backward() if self.amp else
      loss.backward()``:
      ``fixtures/amp/ok_gl103_backward_chosen_by_if_expression__universal-llm-trainer.py``); or the loss is
      scaled only under the test, as written, that the skipped ``unscale_``
      runs under (``if self.using_amp: sum_losses =
      self._scaler.scale(sum_losses)`` ... ``if self.using_amp:
      self._scaler.unscale_(...)``:
      ``fixtures/realworld/ok_gl103_scaled_and_unscaled_under_one_setting__sockeye.py``);
    - the clip is a framework's (``accelerator.clip_grad_norm_`` unscales
      first), or clips nothing (an infinite ``max_norm``: GL107 reads it as a
      statistic).

    An ``unscale_`` that runs only under a setting of its own (``if
    max_grad_norm > 0: scaler.unscale_(opt)``) leaves a later clip under
    another setting clipping scaled gradients on the other path: flagged, and
    the message names that path.

    **Bad**::

        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)

    **Good**::

        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)

    Also flagged: a step function that clips and then calls
    ``scaler.step(opt)`` with no ``unscale_`` before the clip, called from a
    loop of the run (in this module or another of its package) that does
    the scaled backward, or handed the scaler it steps through by a caller of
    the run (``def step(self, loss, scaler=None)``, called as
    ``updater.step(loss, scaler=self.scaler)``); its own backward may run
    only without the scaler (``if scaler is None: loss.backward()``). And a
    callback that clips, which a function of the run runs by name right
    after its scaled backward and before it unscales
    (``self.call_hook("after_backward")``, ``for hook in self._hooks:
    hook.after_backward(self)``, in an engine class of another module). And
    clipping by hooks: a call of a function of the run that registers, on
    every parameter of a model, a hook that clamps the gradient it is handed
    (``p.register_hook(lambda grad: grad.clamp(-c, c))``, allennlp's
    ``enable_gradient_clipping``), in a module that steps through a grad
    scaler: the hooks run inside the scaled backward, before any
    ``unscale_`` can (quiet when the hook's bound reads the loss scale, the
    call runs under a test of the scaler, or every scaler is built with
    ``enabled=False``).

    **Stays quiet when** an ``unscale_`` runs between the scaled backward and
    the clip (in the step function or the callback, or in any function of
    the run that calls the step function), the clip is accelerate's or
    another framework's (they unscale first), or the backward that reaches
    the clip is not scaled.
    """

    code = "GL103"
    name = "clip-before-unscale"
    summary = "gradients are clipped before scaler.unscale_(optimizer)"
    severity = Severity.ERROR
    fix = FixKind.SAFE
    needs = ((BACKWARD, "clip", SCALER), (STEP, "clip", SCALER))  # the second: a step function whose caller scales the backward

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            for event in root.events:
                if event.kind is EventKind.CLIP and event.framework is None and not _clips_nothing(event):
                    position = root.order(event)
                    reaching = _backwards_reaching_unscaled(model, root, event, position)
                    scaled = _still_scaled(model, root, reaching, event)
                    if scaled is not None:
                        last_backward, skipped = scaled
                        scaler = _scaler_of(last_backward, model)
                        if skipped:
                            yield Report(
                                event.node,
                                f"gradients are clipped while still scaled by `{scaler}` (backward at line "
                                f"{model.line(last_backward.node)}) {_where_skipped(model, skipped[0], event)}: call "
                                f"`{model.code(skipped[0].node)}` on every path before the clip",
                                event=event, against=(last_backward, skipped[0]),
                            )
                            continue
                        yield Report(
                            event.node,
                            f"gradients are clipped while still scaled by `{scaler}` (backward at line "
                            f"{model.line(last_backward.node)}): call `{scaler}.unscale_(optimizer)` first",
                            fix=fixes.unscale_before_clip(model, root.events[position:], event, last_backward),
                            event=event, against=(last_backward,),
                        )
                    else:
                        yield from _clip_before_scaler_step(model, root, event, position, reaching)
                        if not reaching:
                            yield from _clip_in_scaled_callback(model, root, event, position)
        yield from _clipped_by_hooks(model)


def _clipped_by_hooks(model: LoopModel) -> Iterator[Report]:
    """A call of a function of the run that clips gradients by hooks on a model's parameters
    (``register_hook(lambda grad: grad.clamp(-c, c))``, :mod:`gradlint.scaler_release_facts`), in a module that
    steps through a grad scaler: the hooks run inside the scaled backward, before any ``unscale_`` can.

    Quiet when every scaler of the module is built with ``enabled=False``, when the call runs under a test of the
    scaler (``if scaler is None:``), or when the call is inside the very function that registers the hooks.
    """
    if not model.clamp_hooks or model.index is None:
        return
    steps = [e for r in model.roots for e in r.events if e.kind is EventKind.STEP and e.via_scaler is not None]
    if not steps or all(_built_disabled(model, s.via_scaler) for s in steps):
        return
    scaler, step = steps[0].via_scaler, steps[0]
    parents = model.parents or {}
    for call in model.file.every_node(model.module):
        if type(call) is not cst.Call or callee_name(call) not in model.clamp_hooks or not call.args:
            continue
        function = parents.get(call)
        under_scaler_test = False
        while function is not None and type(function) is not cst.FunctionDef:
            if type(function) in (cst.If, cst.While, cst.IfExp) and _mentions(function.test, scaler):
                under_scaler_test = True
            function = parents.get(function)
        if under_scaler_test or (function is not None and function.name.value in model.clamp_hooks):
            continue
        yield Report(
            call,
            f"`{model.code(call)}` clips gradients by hooks on the parameters, which run inside the backward, while "
            f"this module steps through `{scaler}` (`{model.code(step.node)}` at line {model.line(step.node)}): the "
            f"hooks clip gradients still multiplied by the loss scale, before any `unscale_` can run; clip after "
            f"`{scaler}.unscale_(optimizer)` instead (`clip_grad_value_`), or scale the hook's bound by "
            f"`{scaler}.get_scale()`",
        )


def _built_disabled(model: LoopModel, scaler: str) -> bool:
    """Whether every construction the module assigns to the scaler's name passes ``enabled=False``."""
    built = [v for v in model.index.assigned_anywhere(scaler) if type(v) is cst.Call]
    return bool(built) and all(
        any(a.keyword is not None and a.keyword.value == "enabled" and type(a.value) is cst.Name and a.value.value == "False" for a in v.args)
        for v in built
    )


def _same_condition(model: LoopModel, a: Frame, b: Frame) -> bool:
    """Whether two branch frames hold on the same passes: one branch, or the same side of two ``if``s with one test
    (``if clip: scaler.unscale_(opt)`` ... ``if clip: clip_grad_norm_(...)``)."""
    if a is b:
        return True
    return (
        a.branch == b.branch and a.branch in ("if", "else") and type(a.node) is cst.If and type(b.node) is cst.If
        and model.code(a.node.test) == model.code(b.node.test)
    )


def _implies(model: LoopModel, given: Frame, needed: Frame) -> bool:
    """Whether every pass through branch ``given`` also passes ``needed``: the same condition, or ``needed`` is the
    ``if`` of a test one of whose ``or`` terms is a term of ``given``'s ``and`` (``if clip_norm or clip_value:
    scaler.unscale_(opt)`` ... ``if clip_value: clip_grad_value_(...)``)."""
    if _same_condition(model, needed, given):
        return True
    if needed.branch != "if" or given.branch != "if" or type(needed.node) is not cst.If or type(given.node) is not cst.If:
        return False
    any_of = {_term_code(model, t) for t in boolean_terms(needed.node.test, cst.Or)}
    each_of = {_term_code(model, t) for t in boolean_terms(given.node.test, cst.And)}
    return not any_of.isdisjoint(each_of)


def _term_code(model: LoopModel, term: cst.BaseExpression) -> str:
    """A term's source text without the parentheses written around it."""
    code = model.code(term)
    for _ in term.lpar:
        code = code[1:-1].strip()
    return code


def _conditions(model: LoopModel, event: Event, around: Event) -> list[Frame]:
    """The branches ``event`` runs under that ``around`` does not imply: when those fail, only ``around`` runs."""
    return [
        f for f in event.frames
        if f.kind is FrameKind.BRANCH and not any(_implies(model, g, f) for g in around.frames)
    ]


def _covers(model: LoopModel, unscale: Event, read: Event, backward: Event | None = None) -> bool:
    """Whether an ``unscale_`` (or a scaler's step) runs on every path to ``read``; with ``backward``, on every path
    from that scaled backward to ``read``: its extra conditions are the backward's own (``if amp:`` around both), or
    say that the scaler is there (``if scaler is not None:``), which a scaled backward implies."""
    if exclusive(unscale, read) or (backward is not None and exclusive(unscale, backward)):
        return False
    extra = _conditions(model, unscale, read)
    if backward is None:
        return not extra
    scaler = unscale.via_scaler
    return all(
        any(_implies(model, g, f) for g in backward.frames)
        or (scaler is not None and f.branch != "if" and _says_present(f, scaler))
        or _each_term_holds(model, f, scaler, [*read.frames, *backward.frames])
        for f in extra
    )


def _each_term_holds(model: LoopModel, frame: Frame, scaler: str | None, around: list[Frame]) -> bool:
    """Whether every ``and`` term of an ``if`` holds wherever the branches ``around`` hold: a term that says the scaler
    is there (a scaled backward implies it), or an ``or`` one of whose terms is a term of one of those branches' tests
    (``if scaler and (clip_norm or clip_value): scaler.unscale_(opt)`` ... ``if clip_norm: clip_grad_norm_(...)``)."""
    if frame.branch != "if" or type(frame.node) is not cst.If:
        return False
    held = {
        _term_code(model, t) for g in around if g.branch == "if" and type(g.node) is cst.If
        for t in boolean_terms(g.node.test, cst.And)
    }
    for term in boolean_terms(frame.node.test, cst.And):
        if scaler is not None and _presence(term, scaler)[0] is True:
            continue
        if held.isdisjoint(_term_code(model, t) for t in boolean_terms(term, cst.Or)):
            return False
    return True


def _says_present(frame: Frame, scaler: str) -> bool:
    """Whether a branch runs only when ``scaler`` is not None (``if scaler is not None:``, the ``else`` of ``if not scaler:``)."""
    if type(frame.node) is not cst.If or frame.branch not in ("if", "else"):
        return False
    when_true, when_false = _presence(frame.node.test, scaler)
    return (when_true if frame.branch == "if" else when_false) is True


def _contradicts(model: LoopModel, a: Event, b: Event) -> bool:
    """Whether two events sit on opposite sides of the same test (``if args.fp16:`` / a later ``if args.fp16: ...
    else:``; also an ``if`` expression, ``scaler.scale(loss).backward() if self.amp else loss.backward()``): no pass
    runs both."""
    return any(
        f.kind is FrameKind.BRANCH and g.kind is FrameKind.BRANCH and f.branch in ("if", "else") and g.branch in ("if", "else")
        and f.branch != g.branch and type(f.node) in (cst.If, cst.IfExp) and type(g.node) in (cst.If, cst.IfExp)
        and model.code(f.node.test) == model.code(g.node.test)
        for f in a.frames for g in b.frames
    )


def _backwards_reaching_unscaled(model: LoopModel, root, read: Event, position: int) -> list[Event]:
    """The backwards whose gradients ``read`` may see, latest first, read back to an ``unscale_`` that runs on every
    path to it (one under a condition of its own does not end the reading)."""
    return backwards_reaching(root.events, read, stop=lambda e: _unscales(e) and _covers(model, e, read), position=position)


def _still_scaled(model: LoopModel, root, reaching: list[Event], read: Event) -> tuple[Event, list[Event]] | None:
    """The latest scaled backward among ``reaching`` whose gradients reach ``read`` unscaled on some path, and the
    ``unscale_`` calls of its scaler between them that run on other paths only; None when every one is unscaled."""
    at = root.order(read)
    for backward in reaching:
        if not backward.scaled:
            continue
        scaler = _scaler_of(backward, model)
        if _without_scaler(read, scaler) or _contradicts(model, backward, read):
            continue  # ``read`` runs only where this backward does not (``else`` of ``if scaler is not None:``)
        between = [
            e for e in root.events[root.order(backward) + 1 : at]
            if _unscales(e) and (e.via_scaler is None or same_object(e.via_scaler, scaler))
        ]
        if any(_covers(model, e, read, backward) for e in between):
            continue
        unscales = [e for e in between if e.kind is EventKind.UNSCALE]
        if _scaled_only_where_unscaled(model, backward, unscales):
            continue
        return backward, unscales
    return None


def _scaled_only_where_unscaled(model: LoopModel, backward: Event, unscales: list[Event]) -> bool:
    """Whether the backward's loss is scaled only under an ``if`` whose test, as written, is also the test around each
    of the ``unscale_`` calls that may be skipped (``if self.using_amp: sum_losses = self._scaler.scale(sum_losses)``
    ... ``if self.using_amp: self._scaler.unscale_(self.optimizer)``): where the unscale is skipped, nothing was
    scaled."""
    name = dotted_name(backward.loss) if backward.loss is not None else None
    if name is None or not unscales or model.index is None:
        return False
    function = function_holding(model, backward.node)
    scaling = [
        v for v in model.index.assignments.get(function, {}).get(name, [])
        if type(v) is cst.Call and method_name(v) == "scale"
    ]
    if not scaling:
        return False
    tests = set.intersection(*({test for test, in_body in branch_sides(model, v, function) if in_body} for v in scaling))
    return bool(tests) and all(
        any(f.kind is FrameKind.BRANCH and type(f.node) is cst.If and f.branch == "if" and model.code(f.node.test) in tests for f in u.frames)
        for u in unscales
    )


def _where_skipped(model: LoopModel, unscale: Event, read: Event) -> str:
    """Where a conditional ``unscale_`` does not run, for messages."""
    condition = next(iter(_conditions(model, unscale, read)), None)
    if condition is None or type(condition.node) is not cst.If:
        return f"on the paths where `{model.code(unscale.node)}` at line {model.line(unscale.node)} does not run"
    test = model.code(condition.node.test)
    holds = "false" if condition.branch == "if" else "true"
    return (
        f"on the path where `{test}` (line {model.line(condition.node)}) is {holds}, which skips "
        f"`{model.code(unscale.node)}` at line {model.line(unscale.node)}"
    )


def _clips_nothing(clip: Event) -> bool:
    """``clip_grad_norm_(params, float("inf"))``: an infinite threshold clips nothing (the norm it returns is a
    statistic, which GL107 reads)."""
    return not clips_gradients(clip)


def _clip_before_scaler_step(model: LoopModel, root, clip: Event, position: int, reaching: list[Event]) -> Iterator[Report]:
    """A step function that clips and then steps through a ``GradScaler``, its scaled backward left to a caller.

    ``scaler.step(opt)`` means the gradients arrive scaled; with no
    ``unscale_`` before the clip, they are clipped scaled. Only for a
    function some loop of the run calls, or one handed the scaler it steps
    through by a caller of the run (``def step(self, loss, scaler=None)``);
    quiet when a caller of this module inlines it (the caller's view
    decides), or when some function of the run that calls it also calls
    ``unscale_``. The backwards of the function itself that reach the clip
    (``reaching``) must all run only without the scaler (``if scaler is
    None: loss.backward()``): with the scaler, the caller's backward does.
    Quiet too when a backward of the function runs between the clip and the
    step: the clip ran before the gradients the step takes existed.
    """
    function = root.node
    if type(function) is not cst.FunctionDef:
        return
    if function.name.value in model.unscaled_by_caller:
        return
    if any(e.kind is EventKind.UNSCALE for e in root.events[:position]):
        return
    if any(r is not root and any(e.node is clip.node for e in r.events) for r in model.roots):
        return
    for later in root.events[position + 1 :]:
        if later.kind is EventKind.UNSCALE and not exclusive(later, clip):
            return
        if later.kind is EventKind.BACKWARD and not exclusive(later, clip):
            return  # the step's gradients come from a backward after the clip: it clipped none of them (GL006's finding)
        if later.kind is EventKind.STEP and later.via_scaler is not None and not exclusive(later, clip):
            scaler = later.via_scaler
            if _without_scaler(clip, scaler) or not all(_without_scaler(b, scaler) for b in reaching):
                return
            if function.name.value not in model.called_in_loop and not (
                function.name.value in model.handed_scaler and _is_parameter(scaler, function)
            ):
                return
            yield Report(
                clip.node,
                f"gradients are clipped before `{later.via_scaler}.step({later.target})` at line {model.line(later.node)} "
                f"with no `unscale_` first, here or in any caller of `{function.name.value}`: the backward its callers "
                f"scale leaves them multiplied by the loss scale; call `{later.via_scaler}.unscale_({later.target})` first",
                event=clip, against=(later,),
            )
            return


def _clip_in_scaled_callback(model: LoopModel, root, clip: Event, position: int) -> Iterator[Report]:
    """A callback that clips, which a function of the run runs by name between its scaled backward and its
    ``unscale_`` (``self.call_hook("after_backward")``, ``for h in self._hooks: h.after_backward()``).

    Quiet when the callback unscales (or steps through a scaler) before the
    clip itself, or when a caller of this module inlines it.
    """
    function = root.node
    if type(function) is not cst.FunctionDef:
        return
    name = function.name.value
    runners = sorted(fact.split(":", 1)[1] for fact in model.scaled_dispatch if fact.split(":", 1)[0] == name)
    if not runners:
        return
    if any(_unscales(e) for e in root.events[:position]):
        return
    if any(r is not root and any(e.node is clip.node for e in r.events) for r in model.roots):
        return
    yield Report(
        clip.node,
        f"`{runners[0]}` (a function of the run) runs the `{name}` callbacks right after its scaled backward, before "
        f"it unscales the gradients: the gradients clipped here are still multiplied by the loss scale; call "
        f"`scaler.unscale_(optimizer)` in `{runners[0]}` before the callbacks run",
    )


def _is_parameter(name: str, function: cst.FunctionDef) -> bool:
    """Whether ``name`` is a parameter of ``function`` (other than ``self``)."""
    params = function.params
    return name in {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)} - {"self", "cls"}


class ScalerWithoutUpdate(Rule):
    """``scaler.step()`` is called in a loop that never calls ``scaler.update()``.

    **Why it matters.** ``update()`` is what lowers the loss scale after an
    overflow and raises it again later. Without it the scale is frozen: after
    one overflow every following step is skipped, and training silently stops.

    **Fix.** Call ``scaler.update()`` once per step, after ``scaler.step()``.

    **Stays quiet when**

    - the training loop that runs the step (in this function or in a caller
      of it) calls ``scaler.update()``;
    - the step is not in a training loop of its own (a per-batch method, or a
      loop over optimizers): its caller is judged where it is inlined;
      unless the scaler is an attribute of ``self`` that nothing in the
      module updates, hands on, or uses but to scale, unscale and step (an
      agent's update method stepping ``self.loga_sclr``:
      ``fixtures/realworld/gl104_attribute_scaler_never_updated__sac-td3-cudagraphs.py``);
    - the scaler is a parameter of the function that holds the step's loop
      (``train_step(self, data, optimizer, loss_scaler=None)`` with an inner
      loop over generator steps): its caller may update it after each call.

    **Bad**::

        scaler.scale(loss).backward()
        scaler.step(optimizer)

    **Good**::

        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """

    code = "GL104"
    name = "scaler-without-update"
    summary = "scaler.step() with no scaler.update()"
    severity = Severity.ERROR
    fix = FixKind.SAFE
    needs = ((STEP, SCALER),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        updated = _steps_updated_somewhere(model)
        settled = Settled()
        for root in model.roots:
            for step in root.events:
                if step.kind is not EventKind.STEP or step.via_scaler is None:
                    continue
                loop = home_loop(root, step)
                if loop is None:
                    if step.node not in settled and _never_updated_in_module(model, step):
                        function = function_holding(model, step.node)
                        yield settled.note(Report(
                            step.node,
                            f"`{step.via_scaler}.step({step.target})` runs on every call of "
                            f"`{function.name.value}` but nothing in this module calls `{step.via_scaler}.update()`: "
                            f"the loss scale never adapts",
                            fix=fixes.add_scaler_update(model, step),
                        ))
                    continue  # a per-step helper (or a loop over optimizers): the training loop that calls it is checked where it is inlined
                if step.node in updated or step.node in settled:
                    continue  # a caller's training loop updates the scaler after calling this code
                if _handed_in_to_the_loops_function(model, step, loop):
                    continue
                yield settled.note(Report(
                    step.node,
                    f"`{step.via_scaler}.step({step.target})` runs {loop_phrase(model, loop)} "
                    f"but `{step.via_scaler}.update()` never does: the loss scale never adapts",
                    fix=fixes.add_scaler_update(model, step),
                ))


def _never_updated_in_module(model: LoopModel, step: Event) -> bool:
    """Whether a step through a scaler held as an attribute of ``self`` (``self.loga_sclr.step(self.loga_opt)`` in an
    agent's update method) meets no ``update()`` of that scaler anywhere in the module, and the scaler is never handed
    to a call or read except to scale, unscale and step: no code of the module, whoever calls it, adapts its scale."""
    scaler = step.via_scaler
    function = function_holding(model, step.node)
    if scaler is None or not scaler.startswith("self.") or function is None:
        return False
    return last_name(scaler) not in _names_updated_or_handed_on(model)


def _names_updated_or_handed_on(model: LoopModel) -> frozenset[str]:
    """The last names of the objects the module calls a method of other than to scale, unscale and step
    (``update()``, or any other use that may stand for it), or hands to a call (the callee may update them): read
    once per file."""

    def read() -> frozenset[str]:
        found: set[str] = set()
        for node in model.file.every_node(model.module):
            if type(node) is not cst.Call:
                continue
            func = node.func
            if type(func) is cst.Attribute and func.attr.value not in ("scale", "unscale_", "step", "get_scale", "is_enabled"):
                found.add(last_name(dotted_name(func.value) or ""))
            found.update(last_name(dotted_name(a.value) or "") for a in node.args)
        return frozenset(found)

    return model.file.once(_names_updated_or_handed_on, read)


def _handed_in_to_the_loops_function(model: LoopModel, step: Event, loop: Frame) -> bool:
    """Whether the scaler is a parameter of the function that holds both the step and its loop: a per-batch method
    (``train_step(self, data, optimizer, loss_scaler=None)``) whose caller may update the scaler after each call."""
    function = function_holding(model, step.node)
    return (
        function is not None and step.via_scaler in parameter_names(function)
        and function_holding(model, loop.node) is function
    )


def _steps_updated_somewhere(model: LoopModel) -> set:
    """The scaler steps that some root runs in a training loop (one that backpropagates) which also updates that scaler."""
    updated = set()
    for root in model.roots:
        for step in root.events:
            if step.kind is not EventKind.STEP or step.via_scaler is None:
                continue
            for loop in step.loops:
                if EventKind.BACKWARD not in root.kinds_in(loop):
                    continue
                if any(same_object(e.target, step.via_scaler) for e in root.events_of(EventKind.SCALER_UPDATE, loop)):
                    updated.add(step.node)
                    break
    return updated


class ScalerUnscalePerMicroBatch(Rule):
    """``scaler.unscale_(optimizer)`` or ``scaler.update()`` runs on micro-batches that do not step.

    **Why it matters.** A ``GradScaler`` expects one ``unscale_`` per
    optimizer and one ``update()`` per optimizer step. torch's
    ``GradScaler.unscale_`` raises ``RuntimeError: unscale_() has already
    been called on this optimizer since the last update()`` on the second
    micro-batch of an accumulation; if ``update()`` runs on every micro-batch
    too, nothing raises but the gradients already unscaled are summed with
    new, scaled ones, and the scale changes in the middle of the
    accumulation. ``update()`` alone on a micro-batch that neither stepped
    nor unscaled fails with ``No inf checks were recorded prior to
    update.``

    **Fix.** Unscale (and clip) and update under the same guard as
    ``scaler.step(optimizer)``: ``unscale_`` right before the clip,
    ``update()`` right after the step.

    Also flagged: a function with no loop of its own that unscales on every
    call and steps and updates through the scaler only ``if flag:``, a
    parameter of the function (``optimize_parameters(self, it,
    apply_gradient)``): a call with the flag off unscales with no update
    after, and the next call's ``unscale_`` raises
    (``fixtures/realworld/gl105_unscale_every_call_step_on_flag__traiNNer.py``).

    **Bad**::

        for i, (x, y) in enumerate(loader):
            scaler.scale(loss_fn(model(x), y) / accum).backward()
            scaler.unscale_(optimizer)
            if (i + 1) % accum == 0:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()

    **Good**::

        for i, (x, y) in enumerate(loader):
            scaler.scale(loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                scaler.unscale_(optimizer)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()

    A framework's clip that unscales through the framework's own scaler on
    every call is such an ``unscale_``: accelerate's
    ``accelerator.clip_grad_norm_`` inside ``accelerator.accumulate()`` with
    no ``if accelerator.sync_gradients:`` around it, when the module builds
    the ``Accelerator`` with ``mixed_precision="fp16"`` and an accumulation
    count above 1 (besides GL006, which reports the partial sums it clips).

    **Stays quiet when** the optimizer is not stepped through the same
    scaler; the unscale or update sits under an accumulation guard, in the
    other branch of the step's ``if`` (also of an ``if accumulation_steps >
    1:`` that picks the mode once), or leaves the loop before the step (a
    skipped batch); a framework's clip, when the module does not show the
    framework's scaler on (bfloat16, or a precision read from elsewhere). The fix moves a per-micro-batch ``update()`` that is a
    statement of its own in a block around the step to right after the step;
    a per-micro-batch ``unscale_`` is not moved, since the clipping that
    reads the unscaled gradients has to move with it.
    """

    code = "GL105"
    name = "scaler-unscale-per-micro-batch"
    summary = "scaler.unscale_() or scaler.update() runs on micro-batches that do not step the optimizer"
    severity = Severity.ERROR
    fix = FixKind.SAFE
    needs = (
        (BACKWARD, STEP, call_of("unscale_"), SCALER), (BACKWARD, STEP, call_of("update"), SCALER),
        *((BACKWARD, STEP, *tokens) for tokens in frameworks.UNSCALING_CLIP_TOKENS),
    )

    def check(self, model: LoopModel) -> Iterator[Report]:
        for root in model.roots:
            yield from _unscaling_clips(model, root)
            yield from _unscale_when_flag_skips_step(model, root)
            seen: set[int] = set()
            for step, loop in steps_with_loops(root):
                if step.via_scaler is None:
                    continue
                acc = accumulation(root, step, loop)
                if acc is None:
                    continue
                region_frame = loop if acc.style == "guard" else acc.frame
                for event in root.events_in(region_frame):
                    if id(event) in seen or not _belongs_to(event, step):
                        continue
                    if not runs_every_micro_batch(event, loop, acc) or leaves_before(event, step) or exclusive(event, step):
                        continue
                    seen.add(id(event))
                    yield self._report(model, event, step, acc)

    def _report(self, model: LoopModel, event: Event, step: Event, acc: Accumulation) -> Report:
        where = accumulation_place(model, acc)
        if event.kind is EventKind.UNSCALE:
            return Report(
                event.node,
                f"`{model.code(event.node)}` runs on every micro-batch but `{step.via_scaler}.step({step.target})` only "
                f"runs {where}: the second micro-batch raises `unscale_() has already been called on this optimizer "
                f"since the last update()`; unscale once, right before clipping and the step",
                event=event, against=(step,),
            )
        return Report(
            event.node,
            f"`{model.code(event.node)}` runs on every micro-batch but `{step.via_scaler}.step({step.target})` only "
            f"runs {where}: the loss scale changes in the middle of the accumulation (and with nothing unscaled it "
            f"raises); update once, right after the step",
            fix=fixes.move_update_after_step(model, event, step),
            event=event, against=(step,),
        )


def _unscale_when_flag_skips_step(model: LoopModel, root) -> Iterator[Report]:
    """A function with no loop of its own that backpropagates, unscales on every call and steps and updates through
    the scaler only when a parameter says so (``def optimize_parameters(self, it, apply_gradient):`` ... ``if
    apply_gradient: scaler.step(opt); scaler.update()``): a call with the flag off unscales with no update after,
    and the next call's ``unscale_`` raises. Whatever the caller's cadence, the flag exists to be off sometimes."""
    function = root.node
    if type(function) is not cst.FunctionDef:
        return
    own = [e for e in root.events if not e.call_chain and not any(type(f.node) in (cst.For, cst.While) for f in e.loops)]
    for step in own:
        if step.kind is not EventKind.STEP or step.via_scaler is None:
            continue
        flag = next((f for f in step.frames if _tests_parameter(f, function)), None)
        if flag is None:
            continue
        scaler = step.via_scaler
        updates = [e for e in own if e.kind is EventKind.SCALER_UPDATE and same_object(e.target, scaler)]
        if any(not e.inside(flag) for e in updates):
            continue  # an update runs on the calls that do not step
        for unscale in own:
            if unscale.kind is not EventKind.UNSCALE or not same_object(unscale.via_scaler, scaler):
                continue
            if unscale.inside(flag) or root.order(unscale) > root.order(step) or any(
                f.kind is FrameKind.BRANCH and _mentions(f.node.test, flag.node.test.value) for f in unscale.frames if type(f.node) is cst.If
            ):
                continue
            if not any(e.kind is EventKind.BACKWARD and e.scaled and root.order(e) < root.order(unscale) for e in root.events):
                continue
            name = flag.node.test.value
            yield Report(
                unscale.node,
                f"`{model.code(unscale.node)}` runs on every call of `{function.name.value}` but "
                f"`{scaler}.step({step.target})` only when `{name}` is true: a call that does not step unscales with "
                f"no `update()` after, and the next call's `unscale_` raises `unscale_() has already been called on "
                f"this optimizer since the last update()`; unscale under `if {name}:`, right before clipping and the step",
                event=unscale, against=(step,),
            )
            break


def _tests_parameter(frame: Frame, function: cst.FunctionDef) -> bool:
    """An ``if`` branch whose test is a bare parameter of the function (``if apply_gradient:``)."""
    return (
        frame.kind is FrameKind.BRANCH and frame.branch == "if" and type(frame.node) is cst.If
        and type(frame.node.test) is cst.Name and _is_parameter(frame.node.test.value, function)
    )


def _unscaling_clips(model: LoopModel, root) -> Iterator[Report]:
    """A framework's clip inside its accumulation block, on every micro-batch, where the framework's clip unscales
    through its ``GradScaler`` on each call and the module shows the scaler on (``frameworks``' ``UnscalingClip``)."""
    for clip in root.events_of(EventKind.CLIP):
        if clip.framework is None or any(f.kind is FrameKind.BRANCH and f.accumulation for f in clip.frames):
            continue
        block = next((f for f in reversed(clip.frames) if f.kind is FrameKind.WITH and f.context == "accumulate"), None)
        found = frameworks.accumulate_call(block) if block is not None else None
        unscaling = found[0].unscaling_clip if found is not None else None
        if unscaling is None or unscaling.by != clip.framework:
            continue
        if not root.events_of(EventKind.STEP, block) or not root.events_of(EventKind.BACKWARD, block):
            continue  # no step or no backward in the block: nothing accumulates there
        shown = unscaling.scaler_on(model)
        if shown is not None:
            yield Report(clip.node, unscaling.message(model.code(clip.node), model.line(block.node), model.line(shown)))


def _belongs_to(event: Event, step: Event) -> bool:
    """An ``unscale_`` of the stepped optimizer through the step's scaler, or an ``update()`` of that scaler."""
    if event.kind is EventKind.UNSCALE:
        return same_object(event.via_scaler, step.via_scaler) and (event.target is None or same_object(event.target, step.target))
    return event.kind is EventKind.SCALER_UPDATE and same_object(event.target, step.via_scaler)


class ScalerUpdateSkipped(Rule):
    """``scaler.update()`` is skipped on iterations that have already unscaled (or stepped) through the scaler.

    **Why it matters.** A ``GradScaler`` keeps a stage per optimizer
    (``_per_optimizer_states``): ``unscale_(opt)`` moves it to UNSCALED,
    ``step(opt)`` to STEPPED, and only ``update()`` sets every optimizer back
    to READY. A check that skips the step when the gradient norm is not
    finite (``if torch.isfinite(norm): scaler.step(opt); scaler.update()``)
    skips the ``update()`` too: the next iteration's ``unscale_(opt)`` raises
    ``RuntimeError: unscale_() has already been called on this optimizer
    since the last update()`` (a next ``step(opt)`` without ``unscale_``
    raises ``step() has already been called since the last update()``), and
    the loss scale never backs off after the overflow that caused the skip.

    **Fix.** Call ``scaler.update()`` on every iteration that unscaled,
    outside the check: ``scaler.step(opt)`` already skips a step whose
    gradients hold inf/NaN, and ``update()`` then lowers the scale.

    **Stays quiet when**

    - another ``update()`` of the scaler runs on the other path (the
      ``else`` of the check, or after it);
    - the condition is an accumulation guard (GL105 judges those) or a
      setting; only a test of the gradients' norm or finiteness
      (``torch.isfinite(grad_norm)``, ``grad_norm < max_norm``, a name
      assigned from ``clip_grad_norm_``) counts as a skip;
    - the ``unscale_`` runs under the same check as the ``update()``;
    - the check builds the scaler anew before leaving (``self.scaler =
      GradScaler(enabled=True)``): the next ``unscale_`` meets a scaler with
      no state
      (``fixtures/realworld/gl105_one_time_probe_and_rebuilt_scaler__zalo_ai_2025.py``).

    **Bad**::

        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if torch.isfinite(grad_norm):
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad()

    **Good**::

        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)  # skips the step itself when a gradient is inf/NaN
        scaler.update()
        optimizer.zero_grad()
    """

    code = "GL106"
    name = "scaler-update-skipped"
    summary = "scaler.update() is skipped on iterations that unscale_ or step through the scaler"
    severity = Severity.ERROR
    fix = None
    needs = ((BACKWARD, call_of("update"), SCALER),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        reported: set[int] = set()
        for root in model.roots:
            for loop in root.loops():
                if EventKind.BACKWARD not in root.kinds_in(loop):
                    continue
                events = root.events_in(loop)
                for setter in events:
                    if not _unscales(setter) or setter.via_scaler is None or innermost_loop(setter) is not loop:
                        continue
                    updates = [e for e in events if e.kind is EventKind.SCALER_UPDATE]
                    found = _skipped_update(model, root, setter, updates)
                    if found is not None and id(found[0].node) not in reported:
                        update, check = found
                        reported.add(id(update.node))
                        yield Report(update.node, _skipped_message(model, setter, update, check))
                        continue
                    leaving = _leaving_check(model, root, setter, updates) if found is None else None
                    if leaving is not None and id(leaving.node) not in reported:
                        reported.add(id(leaving.node))
                        yield Report(leaving.node, _left_message(model, setter, leaving))


def _skipped_update(model: LoopModel, root, setter: Event, updates: list[Event]) -> tuple[Event, Frame] | None:
    """The first ``update()`` of the setter's scaler after it, and the skip check around it, when every such update
    runs only if a gradient check passes and none runs on the check's other side."""
    later = _later_updates(root, setter, updates)
    if not later:
        return None
    checks = []
    for update in later:
        check = next((f for f in _conditions(model, update, setter) if _is_gradient_check(model, f)), None)
        if check is None:
            return None
        checks.append(check)
    if any(in_other_branch(u, check) for u in later for check in checks):
        return None
    return later[0], checks[0]


def _later_updates(root, setter: Event, updates: list[Event]) -> list[Event]:
    at = root.order(setter)
    return [
        u for u in updates
        if root.order(u) > at and same_object(u.target, setter.via_scaler) and not exclusive(u, setter) and not leaves_before(setter, u)
    ]


def _leaving_check(model: LoopModel, root, setter: Event, updates: list[Event]) -> Frame | None:
    """A gradient check between the setter and its scaler's ``update()`` that leaves the iteration
    (``if not torch.isfinite(norm): optimizer.zero_grad(); continue``) without updating."""
    later = _later_updates(root, setter, updates)
    if not later:
        return None
    for event in root.events[root.order(setter) + 1 : root.order(later[0])]:
        for frame in _conditions(model, event, setter):
            if frame.exits and _is_gradient_check(model, frame) and not any(u.inside(frame) for u in later):
                if _rebuilds(model, frame.node, setter.via_scaler):
                    continue  # ``self.scaler = GradScaler(...)`` before leaving: the next unscale_ meets a fresh scaler
                return frame
    return None


def _rebuilds(model: LoopModel, check: cst.CSTNode, scaler: str | None) -> bool:
    """Whether the block assigns the scaler anew (``self.scaler = GradScaler(enabled=True)``)."""
    if scaler is None:
        return False
    return any(
        type(node) is cst.Assign and type(node.value) is cst.Call
        and any(dotted_name(t.target) == scaler for t in node.targets)
        for node in model.file.walk(check.body if type(check) is cst.If else check)
    )


def _left_message(model: LoopModel, setter: Event, check: Frame) -> str:
    scaler = setter.via_scaler
    raises = (
        "the next `unscale_` raises `unscale_() has already been called on this optimizer since the last update()`"
        if setter.kind is EventKind.UNSCALE else "the next `step` raises `step() has already been called since the last update()`"
    )
    exit_ = next(
        (n for n in model.file.walk(check.node.body) if type(n) in (cst.Continue, cst.Break, cst.Return)), None,
    ) if type(check.node) is cst.If else None
    leaves = f" (`{model.code(exit_)}` at line {model.line(exit_)})" if exit_ is not None else ""
    return (
        f"this check leaves the iteration{leaves} after `{model.code(setter.node)}` at line {model.line(setter.node)} without "
        f"`{scaler}.update()`: {raises}, and the loss scale never backs off; call `{scaler}.update()` before leaving, "
        f"or let `{scaler}.step` skip the non-finite step itself"
    )


# Parts of a name that say it holds a gradient norm or whether the gradients are finite.
_CHECK_PARTS = frozenset({"norm", "finite", "isfinite", "nonfinite", "nan", "inf", "overflow", "overflowed"})
_CHECK_CALLS = frozenset({"isfinite", "isnan", "isinf"})


def _is_gradient_check(model: LoopModel, frame: Frame) -> bool:
    """A branch whose test checks the gradients of this iteration: ``torch.isfinite(norm)``, ``grad_norm < limit``,
    ``not overflow``, or a name assigned from a clip (``norm = clip_grad_norm_(...)``). Accumulation guards and
    settings (``if accumulation_steps > 1:``) are no such check."""
    if frame.kind is not FrameKind.BRANCH or frame.accumulation or frame.fixed or type(frame.node) is not cst.If:
        return False
    for node in model.file.walk(frame.node.test):
        if type(node) is cst.Call and (callee_name(node) or "") in _CHECK_CALLS:
            return True
        if type(node) in (cst.Name, cst.Attribute):
            name = dotted_name(node)
            if name is not None and _CHECK_PARTS & set(last_name(name).lower().split("_")):
                return True
    return False


def _skipped_message(model: LoopModel, setter: Event, update: Event, check: Frame) -> str:
    scaler = setter.via_scaler
    test = model.code(check.node.test)
    when = f"when `{test}` holds" if check.branch == "if" else f"when `{test}` does not hold"
    if setter.kind is EventKind.UNSCALE:
        then = (
            f"`{model.code(setter.node)}` at line {model.line(setter.node)} runs on every iteration: after a skipped "
            f"update the next `unscale_` raises `unscale_() has already been called on this optimizer since the last update()`"
        )
    else:
        then = (
            f"`{scaler}.step({setter.target})` at line {model.line(setter.node)} runs on every iteration: after a "
            f"skipped update the next `step` raises `step() has already been called since the last update()`"
        )
    return (
        f"`{model.code(update.node)}` runs only {when} (line {model.line(check.node)}), but {then}, and the loss scale "
        f"never backs off after the overflow that skipped it; call `{scaler}.update()` on every iteration, outside the "
        f"check (`{scaler}.step` already skips a step with inf/NaN gradients)"
    )


class ScaledGradientStatistic(Rule):
    """A gradient statistic (a norm, a histogram) is read while the gradients are still multiplied by the loss scale.

    **Why it matters.** After ``scaler.scale(loss).backward()`` every
    gradient is multiplied by the loss scale (65536 at first, changing as
    the scaler adapts). A gradient norm logged from ``p.grad.norm()``, from
    ``clip_grad_norm_(params, float("inf"))`` or a histogram of ``p.grad``
    taken before ``scaler.unscale_(optimizer)`` is that many times too
    large, and jumps whenever the scale does. The usual way it happens:
    ``unscale_`` runs only under the clipping setting (``if max_grad_norm >
    0: scaler.unscale_(opt); clip_grad_norm_(...)``) while the statistic is
    read on every iteration, or read before the ``unscale_``.

    The statistic may be read by a function of another file of the run
    that is handed the model and reads its gradients' values
    (``debug_utils.log_gradient_stats(self.model, ...)``,
    ``check_gradient_explosion(model)`` taking ``clip_grad_norm_(...,
    float("inf"))``), or handed its parameters (``collect_host_gradients_async(model.get_host_parameters())``,
    also from a helper of the loop's module): the call is the read
    (``fixtures/crossfile/gradient_stats_helper_before_unscale__languini``,
    ``fixtures/crossfile/gradient_telemetry_of_handed_parameters_before_unscale__esper-lite``; unscaled on
    every path first: ``fixtures/crossfile/gradient_stats_helper_before_unscale__languini_correct``).

    **Fix.** Call ``scaler.unscale_(optimizer)`` on every path, before the
    statistic is read; ``scaler.step`` does not unscale a second time.

    **Stays quiet when**

    - an ``unscale_`` of the scaler runs on every path between the scaled
      backward and the read (also under the same condition as both, or under
      an ``or`` one of whose terms the read's own test requires: ``if
      log_grad_norm or max_grad_norm > 0: scaler.unscale_(opt)`` before ``if
      log_grad_norm: ...``);
    - the module never calls ``unscale_`` on that scaler: a norm of scaled
      gradients read on purpose (to watch for overflow) is left alone;
    - ``isfinite``/``isnan`` checks, which the scale does not change.

    **Bad**::

        scaler.scale(loss).backward()
        if max_grad_norm > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_grad_norm)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        wandb.log({"grad_norm": grad_norm})
        scaler.step(optimizer)
        scaler.update()

    **Good**::

        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_grad_norm)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        wandb.log({"grad_norm": grad_norm})
        scaler.step(optimizer)
        scaler.update()
    """

    code = "GL107"
    name = "statistic-of-scaled-gradients"
    summary = "a gradient statistic (norm, histogram) is read while the gradients are still scaled"
    severity = Severity.WARNING
    fix = None
    needs = ((BACKWARD, call_of("unscale_"), SCALER),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        found = []
        for root in model.roots:
            unscales = root.events_of(EventKind.UNSCALE)
            if not unscales:
                continue
            for read in root.events:
                if read.kind == GRAD_READ or (read.kind is EventKind.CLIP and read.framework is None and _clips_nothing(read)):
                    scaled = _scaled_statistic(model, root, read, unscales)
                    if scaled is not None:
                        found.append((len(read.call_chain), read, scaled))
        reported: set[int] = set()
        for _, read, (root, backward, skipped, later) in sorted(found, key=lambda item: item[0]):
            at = read.call_chain[0] if read.call_chain else read.node  # where the root reads it: the helper's call
            if id(read.node) in reported or id(at) in reported:
                continue  # one finding per read: from the root that reads it most directly
            reported.update((id(read.node), id(at)))
            yield _statistic_report(model, read, at, backward, skipped, later)


def _scaled_statistic(model: LoopModel, root, read: Event, unscales: list[Event]) -> tuple | None:
    """``(root, backward, skipped unscales, later unscale)`` when a scaled backward reaches ``read`` with no
    ``unscale_`` on every path between, the root unscales that scaler elsewhere, and no step through the scaler
    comes between (a statistic after the step reads what the step unscaled)."""
    position = root.order(read)
    scaled = _still_scaled(model, root, _backwards_reaching_unscaled(model, root, read, position), read)
    if scaled is None:
        return None
    backward, skipped = scaled
    scaler = _scaler_of(backward, model)
    between = root.events[root.order(backward) + 1 : position]
    if any(e.kind is EventKind.STEP and e.via_scaler is not None and same_object(e.via_scaler, scaler) and not exclusive(e, read) for e in between):
        return None
    loop = stepping_loop(root, backward)
    known = [u for u in (root.events_of(EventKind.UNSCALE, loop) if loop is not None else unscales) if same_object(u.via_scaler, scaler)]
    if not known:
        return None  # no unscale_ of this scaler: a statistic of scaled gradients may be meant
    later = next((u for u in known if root.order(u) > position), known[0])
    return root, backward, skipped, later


def _statistic_report(model: LoopModel, read: Event, at: cst.CSTNode, backward: Event, skipped: list[Event], later: Event) -> Report:
    scaler = _scaler_of(backward, model)
    inside = f" (at line {model.line(read.node)}: `{model.code(read.node)}`)" if at is not read.node else ""
    if skipped:
        where = _where_skipped(model, skipped[0], read)
        fix = f"call `{model.code(skipped[0].node)}` on every path before it"
    else:
        where = f"before `{model.code(later.node)}` at line {model.line(later.node)}"
        fix = f"read it after `{model.code(later.node)}`"
    return Report(
        at,
        f"`{model.code(at)}`{inside} reads gradients still scaled by `{scaler}` (backward at line "
        f"{model.line(backward.node)}) {where}: the statistic is multiplied by the loss scale; {fix}",
    )


class ScalerRebuiltEveryStep(Rule):
    """A ``GradScaler`` is built anew on every iteration of the loop that steps through it.

    **Why it matters.** The scaler's state is its loss scale and its count of
    steps since the last overflow. ``update()`` halves the scale after an
    overflow and doubles it after ``growth_interval`` clean steps, on the
    scaler object. A scaler built inside the training loop (or inside the
    per-batch method a loop calls) starts again from ``init_scale`` on every
    step: the scale never adapts, ``update()`` works on an object thrown away
    a moment later, and a scale that overflows skips every single step.

    **Fix.** Build the scaler once, before the loop (``self.scaler =
    GradScaler()`` in ``__init__``), and step and update that one.

    **Stays quiet when**

    - the scaler is built in an outer loop (once per epoch) and stepped in an
      inner one: it adapts within the epoch;
    - the constructor sits under a test of the scaler itself (``if scaler is
      None: scaler = GradScaler()``: built once, lazily), or in a branch that
      leaves the iteration (``if has_nan_grad: scaler = GradScaler();
      continue``: a recovery on the batches that fail, not every step);
    - the scaler is built with ``enabled=False``, or the function loads a
      state into it (``scaler.load_state_dict(...)``) before it steps;
    - a function that builds and steps a scaler is called by no loop of the
      run and is not one whole optimization step (a scaled backward, a step
      and an update through the scaler, no loop of its own): such a step
      runs once per batch wherever its caller is, unless the module calls
      it outside every loop, or it is a test.

    **Bad**::

        for batch in loader:
            scaler = torch.amp.GradScaler("cuda")
            scaler.scale(model(batch)).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()

    **Good**::

        scaler = torch.amp.GradScaler("cuda")
        for batch in loader:
            scaler.scale(model(batch)).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    """

    code = "GL108"
    name = "scaler-rebuilt-every-step"
    summary = "a `GradScaler` built on every iteration of the loop that steps it: the loss scale never adapts"
    severity = Severity.ERROR
    fix = None
    needs = ((STEP, SCALER), (call_of("update"), SCALER))

    def check(self, model: LoopModel) -> Iterator[Report]:
        index, parents = model.index, model.parents
        if index is None or parents is None:
            return
        for root in model.roots:
            function = root.node
            if type(function) is not cst.FunctionDef:
                continue
            for name, built in _scaler_constructions(index, function):
                loop = _built_once_per(built, name, function, parents)
                if loop is False:
                    continue
                used = _stepped_through(root, name, loop)
                if used is None or _loads_state(model, function, name):
                    continue
                where = f"in the loop at line {model.line(loop)}" if loop is not None else _runs_per_batch(model, root, function)
                if where is None:
                    continue
                yield Report(
                    built,
                    f"`{model.code(built)}` builds a new grad scaler {where}, and `{model.code(used.node)}` at line "
                    f"{model.line(used.node)} steps through it: the loss scale starts again from its initial value on "
                    f"every step and `update()` adapts a scaler that is thrown away; build `{name}` once, before the loop",
                )


def _scaler_constructions(index, function: cst.FunctionDef) -> Iterator[tuple[str, cst.Call]]:
    """``(name, call)`` for each grad scaler constructor assigned to a name in ``function`` (not ``enabled=False``)."""
    for name, values in index.assignments.get(function, {}).items():
        for value in values:
            if type(value) is not cst.Call or not any(
                kind_of_constructor(q) is ObjKind.SCALER for q in index.qualified_names(value.func)
            ):
                continue
            if any(a.keyword is not None and a.keyword.value == "enabled" and type(a.value) is cst.Name and a.value.value == "False" for a in value.args):
                continue
            yield name, value


def _built_once_per(built: cst.Call, name: str, function: cst.FunctionDef, parents) -> cst.CSTNode | None | bool:
    """The innermost loop of ``function`` around a constructor (None: none), or False when the constructor runs
    only under a test of the scaler itself (built once, lazily) or sits in a nested function or class."""
    node, loop = built, None
    while node is not function:
        node = parents.get(node)
        if node is None or type(node) in (cst.FunctionDef, cst.ClassDef, cst.Lambda) and node is not function:
            return False
        if loop is None and type(node) in (cst.For, cst.While):
            loop = node
        if type(node) in (cst.If, cst.While) and _mentions(node.test, name):
            return False
        if type(node) is cst.IfExp and _mentions(node.test, name):
            return False
        if type(node) is cst.If and leaves_block(node.body):
            return False  # ``if has_nan_grad: ...; scaler = GradScaler(); continue``: a recovery, not every step
    return loop


def _mentions(test: cst.BaseExpression, name: str) -> bool:
    target = last_name(name)
    return any(
        type(n) in (cst.Name, cst.Attribute) and (dotted := dotted_name(n)) is not None and last_name(dotted) == target
        for n in walk(test, into_lambdas=True)
    )


def _own_loop(event: Event) -> cst.CSTNode | None:
    """The innermost loop statement of the event's own function around it (not a whole function read as one)."""
    for frame in reversed(event.loops):
        if type(frame.node) in (cst.For, cst.While):
            return frame.node
    return None


def _stepped_through(root, name: str, loop: cst.CSTNode | None) -> Event | None:
    """The first ``scaler.step`` or ``scaler.update()`` of ``name`` written in the root's own function whose
    innermost loop is ``loop``: the same iteration that built the scaler."""
    for event in root.events:
        if event.call_chain:
            continue
        scaler = event.via_scaler if event.kind is EventKind.STEP else event.target if event.kind is EventKind.SCALER_UPDATE else None
        if scaler is not None and same_object(scaler, name) and last_name(scaler) == last_name(name) and _own_loop(event) is loop:
            return event
    return None


def _loads_state(model: LoopModel, function: cst.FunctionDef, name: str) -> bool:
    """Whether the function loads a saved state into the scaler (``scaler.load_state_dict(...)``)."""
    return any(
        type(node) is cst.Call and callee_name(node) == "load_state_dict" and (owner := receiver(node)) is not None
        and dotted_name(owner) == name
        for node in model.file.walk(function)
    )


def _runs_per_batch(model: LoopModel, root, function: cst.FunctionDef) -> str | None:
    """How the function runs once per batch, for the message, or None: read so by the model, called from some loop
    of the run, or a whole optimization step (a scaled backward, a step and an update through the scaler, no loop of
    its own) that no code of this module calls outside a loop and that is no test. Training takes many steps: a
    function that is one step runs once per batch wherever its caller is."""
    name = function.name.value
    if any(frame.called_by is not None and frame.node is function for frame in (f for e in root.events for f in e.loops)):
        return f"on every call of `{name}`, which runs once per batch"
    if name in model.called_in_loop:
        return f"on every call of `{name}`, which a loop of the run calls"
    if name.startswith("test") or any(e.loops for e in root.events):
        return None
    kinds = {e.kind for e in root.events if not e.call_chain}
    scaled = any(e.kind is EventKind.BACKWARD and e.scaled for e in root.events)
    if not scaled or EventKind.SCALER_UPDATE not in kinds or not any(e.kind is EventKind.STEP and e.via_scaler for e in root.events):
        return None
    if _called_outside_a_loop(model, name):
        return None
    return f"on every call of `{name}`, one whole optimization step (scaled backward, step, update), so once per batch"


def _called_outside_a_loop(model: LoopModel, name: str) -> bool:
    """Whether some call of ``name`` in the module runs outside every loop."""
    return model.index is None or name in model.index.called_outside_loops()
