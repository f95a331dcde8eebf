"""What becomes of the micro-batches left over at the end of a pass over the data (GL021).

An accumulation guard that counts micro-batches from the start of each pass
(``for i, batch in enumerate(loader)`` inside an epoch loop) closes a window
every ``k`` micro-batches; when the pass's length is not a multiple of ``k``,
its last micro-batches are backpropagated and then either added into the next
pass's first step or thrown away by a clear, unless something steps them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import libcst as cst

from gradlint import frameworks
from gradlint.counters import CounterStart, RemainderTest, counter_start, flag_remainder_test, remainder_test, window_offset
from gradlint.events import EventKind
from gradlint.findings import Severity
from gradlint.model import GRAD_DIVIDE, HANDOFF, Event, Frame, FrameKind, LoopModel, Root
from gradlint.queries import (
    Accumulation,
    accumulation,
    calls_unseen_inherited_method,
    clears,
    frames_inside,
    function_holding,
    handoff_may_step,
    leaves_before,
    lies_in,
    opposite_sides_of_settings,
    probe_events,
    same_object,
    steps_with_loops,
)
from gradlint.rule import BACKWARD, STEP, Report, Rule
from gradlint.syntax import boolean_terms, callee_name, dotted_name, number, walk


class LastWindowOfPassNotStepped(Rule):
    """The accumulation guard starts counting again with every pass over the data, and nothing steps what is left at a pass's end.

    **Why it matters.** ``for i, batch in enumerate(loader)`` restarts ``i``
    at 0 on every epoch, so ``if (i + 1) % accum == 0:`` steps after
    micro-batches ``accum``, ``2 accum``, ... of each pass. When the loader's
    length is not a multiple of ``accum``, the last ``len(loader) % accum``
    micro-batches of every pass are backpropagated and never stepped on their
    own: their gradients are added into the next pass's first step (which
    then sums more micro-batches than the loss was divided by), or thrown away
    by a clear at the start of the next pass. With fewer batches than
    ``accum`` in a pass, the optimizer never steps at all. Nothing fails.

    The guard may test a flag bound once to the remainder test
    (``should_step = (i + 1) % accum == 0``:
    ``fixtures/accumulation/gl021_last_window_through_step_flag.py``).

    A framework's per-batch hook counts the same way when the framework
    hands it the batch's index within the epoch: Lightning's
    ``training_step(self, batch, batch_idx)`` under manual optimization,
    stepping under ``(batch_idx + 1) % k == 0`` with the loss divided by
    ``k`` and no other method of the class stepping
    (``fixtures/realworld/gl021_lightning_batch_idx_window_restarts_each_epoch__so-vits-svc-fork.py``;
    ``... or self.trainer.is_last_batch`` closes the epoch's last window:
    ``fixtures/realworld/ok_gl021_lightning_window_closed_on_last_batch__so-vits-svc-fork.py``).

    **Fix.** Close the window at the pass's end as well: ``if (i + 1) % accum
    == 0 or i + 1 == len(loader):`` (and divide that short window's loss by its
    own length if it must weigh the same), or step what is left after the
    micro-batch loop.

    **Stays quiet when**

    - the guard holds more than the remainder (``... or i == len(loader) -
      1``), unless that other term holds only for a pass shorter than one
      window (``or (steps_in_epoch <= accum and step + 1 ==
      steps_in_epoch)``, transformers' ``Trainer`` before 4.28:
      ``fixtures/realworld/gl021_last_step_clause_for_short_epochs_only__LMOps.py``),
      or the counter runs across passes (a clear at a pass's start then
      is GL003's finding), or its start is not a literal;
    - the optimizer is stepped anywhere else in the pass (a flush after the
      micro-batch loop; not a step on the other side of a setting, such as
      a DeepSpeed engine's), or handed to code the module cannot see there, or
      the pass calls a method of ``self`` that a base class of another module
      defines (it may step ``self``'s optimizer);
    - the micro-batch loop is not inside another loop (one pass: at most
      ``accum - 1`` micro-batches at the very end of training), unless
      its function runs one pass per call: a loop of another file of the
      run calls it (``for epoch in ...: run_glide_finetune_epoch(...)``:
      ``fixtures/crossfile/epoch_function_called_by_the_script__glide-finetune``;
      a counter set back to 0 in a method the epoch loop calls restarts
      with each pass too:
      ``fixtures/realworld/ok_gl003_counter_set_in_epoch_function__qlib.py``); or it iterates a
      ``range`` (whose length the code sets), or an endless iterator
      (``itertools.cycle``, a name saying ``infinite``);
    - the micro-batch loop clears the optimizer before its backward (under
      whatever test, unless the clear leaves the iteration, ``if not
      finite: zero_grad(); continue``:
      ``fixtures/accumulation/gl021_nan_skip_clear_before_backward.py``):
      the micro-batches left at a pass's end meet that
      clear first, and whether it is right is GL003's question
      (``fixtures/realworld/gl003_clear_under_flag_handed_to_step_helper__SDXL-Training-Improvements.py``),
      or clears it on every iteration under no test (``if do_step:
      optimizer.step()`` then ``optimizer.zero_grad()``: nothing accumulates,
      ``fixtures/accumulation/boolean_flag_zero_outside_guard.py``);
    - the guard's window is shifted (GL014 reports it, the same micro-batches
      included), or the count exceeds 1 only where a framework's engine steps
      at its own boundary;
    - the function asserts that something is a multiple of the count
      (``assert prior.num_steps % accumulate_gradients == 0``): the author
      states that a pass holds whole windows
      (``fixtures/realworld/ok_gl021_pass_length_asserted_multiple__TFM-Playground.py``).

    **Bad**::

        for epoch in range(epochs):
            for i, (x, y) in enumerate(loader):
                (loss_fn(model(x), y) / accum).backward()
                if (i + 1) % accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()

    **Good**::

        for epoch in range(epochs):
            for i, (x, y) in enumerate(loader):
                (loss_fn(model(x), y) / accum).backward()
                if (i + 1) % accum == 0 or i + 1 == len(loader):
                    optimizer.step()
                    optimizer.zero_grad()
    """

    code = "GL021"
    name = "last-window-of-pass-not-stepped"
    summary = "the accumulation guard restarts every pass and nothing steps the micro-batches left at a pass's end"
    severity = Severity.WARNING
    fix = None  # whether the short window is stepped or its loss reweighted is the author's call
    needs = ((BACKWARD, STEP),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        reported: set[int] = set()
        for root in model.roots:
            yield from _per_batch_hook_windows(model, root, reported)
            for step, loop, acc, guard in _guarded_steps(root, steps_with_loops(root)):
                if id(guard) in reported:
                    continue
                window = _per_pass_window(model, loop, guard)
                passes = _pass_loop(step, loop) or _pass_function(model, root, step, loop)
                if window is None or passes is None:
                    continue
                in_pass = root.events if passes.node is root.node else root.events_in(passes)
                if _stepped_elsewhere(model, step, in_pass, acc.frame):
                    continue
                if calls_unseen_inherited_method(model, step, passes):
                    continue  # ``self.finish_epoch()`` of a base class in another module may step what is left
                test, counter = window
                if counter.set_at is not None and not _set_each_pass(model, counter.set_at, loop, passes):
                    continue  # counted across passes: the windows run on into the next pass
                if frameworks.count_above_one_only_under_own_engine(model, test.count):
                    continue
                if _asserted_multiple(model, passes.node, test.count):
                    continue  # ``assert prior.num_steps % accumulate_gradients == 0``: the author rules the short window out
                if _cleared_before_backward(model, root, step, loop, acc.backwards) or _cleared_every_time(model, root, step, loop):
                    continue  # what is left at a pass's end meets that clear first: its fate is the clear's (GL003's) business
                cleared = _cleared_in_pass(model, step, loop, in_pass)
                if cleared is None and not _divided_by_the_count(root, acc.backwards, loop):
                    continue  # carried into the next window and normalised there: one larger batch, weighed right
                reported.add(id(guard))
                yield Report(
                    guard.test, _message(model, step, loop, passes, guard, test, counter, cleared), event=step,
                    setting=test.count,
                )


def _guarded_steps(root: Root, steps: Iterable[tuple[Event, Frame]]) -> Iterator[tuple[Event, Frame, Accumulation, cst.If]]:
    """``(step, loop, accumulation, guard)`` for each plain optimizer step under the ``if`` branch of an accumulation
    guard, with a backward of the window before it."""
    for step, loop in steps:
        if step.framework is not None or step.target is None:
            continue
        acc = accumulation(root, step, loop)
        if acc is None or acc.style != "guard" or type(acc.frame.node) is not cst.If or acc.frame.branch != "if":
            continue
        if any(root.order(b) < root.order(step) for b in acc.backwards):
            yield step, loop, acc, acc.frame.node


def _per_batch_hook_windows(model: LoopModel, root: Root, reported: set[int]) -> Iterator[Report]:
    """A framework's per-batch hook (Lightning's ``training_step`` under manual optimization) that steps under
    ``(batch_idx + 1) % k == 0`` on the index the framework hands it, which starts from 0 again every epoch
    (:data:`gradlint.frameworks.PASS_INDEX`), with nothing else of the class stepping at an epoch's end."""
    hook = root.node
    loops = root.loops()
    if type(hook) is not cst.FunctionDef or hook.name.value not in frameworks.PASS_INDEX or not loops:
        return
    loop = loops[0]
    if loop.node is not hook or loop.called_by is None:
        return
    params = hook.params.params
    position = frameworks.PASS_INDEX[hook.name.value]
    if len(params) <= position:
        return
    index = params[position].name.value
    for step, _, acc, guard in _guarded_steps(root, [(s, loop) for s in root.events_of(EventKind.STEP, loop)]):
        test = remainder_test(guard.test) or flag_remainder_test(model, guard.test, hook)
        if id(guard) in reported or test is None or test.counter != index or window_offset(0, test) != 0:
            continue
        if _steps_beside(model, hook):
            continue
        if _asserted_multiple(model, hook, test.count) or not _divided_by_the_count(root, acc.backwards, loop):
            continue  # undivided, what is left joins the next window as one larger batch, weighed right
        reported.add(id(guard))
        count = model.code(test.count)
        yield Report(
            guard.test,
            f"`{step.target}` steps at line {model.line(step.node)} only where `{model.code(guard.test)}` holds, and "
            f"`{index}` is the batch's index within the epoch, from 0 again each epoch: when the epoch's length is "
            f"not a multiple of `{count}`, its last micro-batches are added into the next epoch's first step, which "
            f"then sums more micro-batches than the loss was divided by; close each epoch's last window too (`... or "
            f"self.trainer.is_last_batch`)",
            event=step, setting=test.count,
        )


def _steps_beside(model: LoopModel, hook: cst.FunctionDef) -> bool:
    """Whether another method of the hook's class calls a ``step()`` (an epoch-end hook may step what is left)."""
    owner = model.index.class_of.get(hook) if model.index is not None else None
    if owner is None:
        return True
    for method in model.index.class_methods.get(owner, {}).values():
        if method is not hook and any(type(n) is cst.Call and callee_name(n) == "step" for n in walk(method.body)):
            return True
    return False


def _asserted_multiple(model: LoopModel, passes: cst.CSTNode, count: cst.BaseExpression) -> bool:
    """Whether the function holding the pass loop (or the module, outside functions) asserts that something is a
    multiple of the guard's count (``assert prior.num_steps % accumulate_gradients == 0``): the author states that a
    pass holds whole windows; what a loader yields is not in view to contradict it."""
    wanted = dotted_name(count)
    if wanted is None:
        return False
    scope = function_holding(model, passes) or model.module
    asserts = model.file.once((_asserted_multiple, id(scope)), lambda: [n for n in model.file.walk(scope) if type(n) is cst.Assert])
    for node in asserts:
        test = node.test
        if (
            type(test) is cst.Comparison and len(test.comparisons) == 1 and type(test.comparisons[0].operator) is cst.Equal
            and number(test.comparisons[0].comparator) == 0 and type(test.left) is cst.BinaryOperation
            and type(test.left.operator) is cst.Modulo and dotted_name(test.left.right) == wanted
        ):
            return True
    return False


def _per_pass_window(model: LoopModel, loop: Frame, guard: cst.If) -> tuple[RemainderTest, CounterStart] | None:
    """The guard's remainder test and its counter when the counter starts again with every pass over ``loop``'s data
    (the loop's own index, or a counter set to a literal inside the pass) and the windows are aligned."""
    node = loop.node
    if type(node) is not cst.For or type(node.iter) is not cst.Call and type(node.iter) not in (cst.Name, cst.Attribute):
        return None
    if _endless_or_counted(node.iter):
        return None
    test = (
        remainder_test(guard.test) or _remainder_flushing_short_passes_only(model, guard.test)
        or flag_remainder_test(model, guard.test, function_holding(model, guard))
    )
    counter = counter_start(model, loop, guard, test.counter) if test is not None else None
    if counter is None or window_offset(counter.start, test) != 0:
        return None
    return test, counter


def _remainder_flushing_short_passes_only(model: LoopModel, test: cst.BaseExpression) -> RemainderTest | None:
    """The remainder test of ``(step + 1) % k == 0 or (steps_in_epoch <= k and step + 1 == steps_in_epoch)``: the other
    term steps at the end of a pass only when the whole pass is shorter than one window (it compares something with
    ``k`` by ``<=`` or ``<``), so a longer pass still leaves its last micro-batches unstepped."""
    read = [(term, remainder_test(term)) for term in boolean_terms(test, cst.Or)]
    remainders = [r for _, r in read if r is not None]
    if len(read) < 2 or len(remainders) != 1:
        return None
    count = model.code(remainders[0].count)
    others_below_count = all(
        any(
            type(c) is cst.Comparison and len(c.comparisons) == 1
            and type(c.comparisons[0].operator) in (cst.LessThanEqual, cst.LessThan)
            and model.code(c.comparisons[0].comparator) == count
            for c in boolean_terms(term, cst.And)
        )
        for term, r in read if r is None
    )
    return remainders[0] if others_below_count else None


def _endless_or_counted(iterated: cst.BaseExpression) -> bool:
    """``range(n)`` (its length is the code's), ``itertools.cycle(loader)``, ``enumerate(infinite_loader)``."""
    for inner in walk(iterated):
        if type(inner) is cst.Call and callee_name(inner) in ("range", "cycle", "repeat", "count", "islice"):
            return True
        if type(inner) in (cst.Name, cst.Attribute):
            name = dotted_name(inner)
            if name is not None and any(w in name.lower() for w in ("infinite", "forever", "endless", "cycle")):
                return True
    return False


def _pass_loop(step: Event, loop: Frame) -> Frame | None:
    """The loop around ``loop`` that runs it once per pass over the data (an epoch loop), if any."""
    loops = step.loops
    position = next((i for i, f in enumerate(loops) if f is loop), None)
    if not position:
        return None
    outer = loops[position - 1]
    return outer if type(outer.node) in (cst.For, cst.While) else None


def _pass_function(model: LoopModel, root: Root, step: Event, loop: Frame) -> Frame | None:
    """The function holding ``loop`` (as a loop frame) when a call of the function is one pass over the data: ``loop``
    is its outermost loop, a loop of another file of the run calls it (``for epoch in range(n):
    run_glide_finetune_epoch(...)`` in the training script), and nothing in this module calls it (a caller here
    inlines it and is judged there)."""
    function = root.node
    if type(function) is not cst.FunctionDef or not step.loops or step.loops[0] is not loop or loop.called_by is not None:
        return None
    name = function.name.value
    if name not in model.called_in_loop or name in _called_in_module(model):
        return None
    return Frame(FrameKind.LOOP, function, called_by=f"the caller of `{name}`, once per pass")


def _set_each_pass(model: LoopModel, set_at: cst.CSTNode, loop: Frame, passes: Frame) -> bool:
    """Whether the counter's literal assignment runs once per pass: written in the pass, or in the function holding the
    micro-batch loop when a pass calls that function (``def train_epoch(self): cur_step = 0; for batch in data: ...``
    run from ``for epoch in range(n): self.train_epoch()``)."""
    if lies_in(model, set_at, passes.node):
        return True
    holder = function_holding(model, set_at)
    return holder is not None and holder is function_holding(model, loop.node) and holder is not function_holding(model, passes.node)


def _called_in_module(model: LoopModel) -> frozenset[str]:
    """The last names of everything the module calls (read once)."""
    return model.file.once(_called_in_module, lambda: frozenset(
        name for n in model.file.every_node(model.file.module) if type(n) is cst.Call and (name := callee_name(n)) is not None
    ))


def _stepped_elsewhere(model: LoopModel, step: Event, in_pass: list[Event], guard: Frame) -> bool:
    """Whether the pass (its events ``in_pass``) steps the optimizer anywhere but under the guard, or hands it to code
    the module cannot see (not counting a step on the other side of a setting: ``if self.deepspeed:
    self.deepspeed.step()`` beside a guarded ``optimizer.step()`` in the ``else`` of that setting)."""
    for event in in_pass:
        if event is step or event.inside(guard) or opposite_sides_of_settings(model, event, step):
            continue
        if event.kind is EventKind.STEP and (event.target is None or same_object(event.target, step.target)):
            return True
        if event.kind == HANDOFF and same_object(event.target, step.target) and handoff_may_step(event.node):
            return True
    return False


def _cleared_in_pass(model: LoopModel, step: Event, loop: Frame, in_pass: list[Event]) -> Event | None:
    """A clear of the step's optimizer in the pass (its events ``in_pass``) but outside the micro-batch loop (at the
    start of each pass): it throws away what the last pass left."""
    return next(
        (z for z in in_pass if z.kind is EventKind.ZERO and not z.inside(loop) and clears(model, z, step.target)),
        None,
    )


def _cleared_before_backward(model: LoopModel, root: Root, step: Event, loop: Frame, backwards: list[Event]) -> bool:
    """Whether the micro-batch loop clears the step's optimizer before a backward of the same iteration
    (``if not accumulate or is_last: opt.zero_grad()`` in a step helper, a window-start clear): the micro-batches
    left at a pass's end are then not simply added into the next pass's first step."""
    probes = probe_events(root)  # a probe's own clear wipes only what the probe backpropagated
    return any(
        id(z) not in probes and clears(model, z, step.target) and not leaves_before(z, step)
        and any(root.order(z) < root.order(b) < root.order(step) for b in backwards)
        for z in root.events_of(EventKind.ZERO, loop)
    )


def _cleared_every_time(model: LoopModel, root: Root, step: Event, loop: Frame) -> bool:
    """Whether the micro-batch loop clears the step's optimizer on every iteration, under no test (``optimizer.step()``
    under ``if do_step:``, then ``optimizer.zero_grad()``): nothing is left at a pass's end, nor accumulated at all."""
    probes = probe_events(root)
    return any(
        id(z) not in probes and clears(model, z, step.target)
        and not any(f.kind is FrameKind.BRANCH for f in frames_inside(z, loop))
        for z in root.events_of(EventKind.ZERO, loop)
    )


def _divided_by_the_count(root: Root, backwards: list[Event], loop: Frame) -> bool:
    """Whether each micro-batch's loss is divided before its backward and no gradient is divided by hand in the loop:
    then a window that takes in the last pass's leftovers sums more micro-batches than its loss was divided by. (A
    loss normalised at the step by a running count, ``scale_grads(model, 1 / num_tokens)``, weighs them right.)"""
    return bool(backwards) and all(b.normalised for b in backwards) and not root.events_of(GRAD_DIVIDE, loop)


def _message(model: LoopModel, step: Event, loop: Frame, passes: Frame, guard: cst.If, test: RemainderTest,
             counter: CounterStart, cleared: Event | None) -> str:
    count = model.code(test.count)
    iterated = _iterated(loop.node)
    length = f"len({iterated})" if iterated is not None else "the pass's length"
    if counter.set_at is not None:
        restart = f"`{test.counter}` is set back to {model.code(counter.set_at.value)} at line {model.line(counter.set_at)}"
    else:
        restart = f"`{test.counter}` counts from {counter.start} again each time the loop at line {model.line(loop.node)} starts"
    if cleared is not None:
        fate = f"cleared at line {model.line(cleared.node)} without a step"
    else:
        fate = "added into the next pass's first step, which then sums more micro-batches than the loss was divided by"
    if iterated is not None and counter.set_at is None:
        seen = f"{test.counter} + {1 - counter.start}" if counter.start < 1 else test.counter
        close = f"`... or {seen} == len({iterated})`"
    else:
        close = "a step after the micro-batch loop"
    terms = boolean_terms(guard.test, cst.Or)
    where = f"`{next((model.code(t) for t in terms if remainder_test(t) is not None), model.code(guard.test))}`"
    if len(terms) > 1:
        where = where[:-1] + " or ...` (its other terms hold only for a pass shorter than one window)"
    if type(passes.node) is cst.FunctionDef:
        each = f"once per call of `{passes.node.name.value}`, one pass over the data"
    else:
        each = f"once per pass of the loop at line {model.line(passes.node)}"
    return (f"`{step.target}` steps at line {model.line(step.node)} only where {where}, and "
            f"{restart}, {each}: when {length} is not a multiple "
            f"of `{count}`, the last {length} % {count} micro-batches of each pass are {fate}; close each pass's last "
            f"window too ({close})")


def _iterated(node: cst.CSTNode) -> str | None:
    """``loader`` for ``for i, b in enumerate(loader)`` or ``for b in loader``."""
    if type(node) is not cst.For:
        return None
    iterated = node.iter
    if type(iterated) is cst.Call and callee_name(iterated) == "enumerate" and iterated.args:
        iterated = iterated.args[0].value
    return dotted_name(iterated)
