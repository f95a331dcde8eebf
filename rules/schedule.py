"""Rules about learning-rate schedulers (GL301, GL308)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from gradlint import frameworks
from gradlint.events import EventKind
from gradlint.findings import FixKind, Severity
from gradlint.frameworks.framework import AccumulateContext
from gradlint.kinds import ObjKind
from gradlint.model import Event, LoopModel
from gradlint.queries import (
    accumulation,
    accumulation_place,
    frames_inside,
    once_per_pass,
    runs_every_micro_batch,
    split_by_setting,
    steps_with_loops,
)
from gradlint.fixes.schedule import move_scheduler_step
from gradlint.rule import BACKWARD, STEP, Report, Rule, Settled
from gradlint.syntax import callee_name, class_methods, dotted_name, number, terminal, tracked_name, walk


class SchedulerStepsPerMicroBatch(Rule):
    """An LR scheduler steps on every micro-batch while the optimizer steps only under an accumulation guard.

    **Why it matters.** A per-step schedule (``OneCycleLR``,
    ``get_linear_schedule_with_warmup``, ``LambdaLR`` or ``CosineAnnealingLR``
    counted in steps, ...) is written in optimizer steps. Stepped on every
    micro-batch, it advances N times per optimizer step: warm-up ends N times
    too early, the decay finishes after 1/N of training, and ``OneCycleLR``
    raises once it runs past its total. A scheduler stepped once per epoch,
    outside the batch loop, is fine.

    **Fix.** Step the scheduler under the same guard as the optimizer, right
    after ``optimizer.step()``.

    **Stays quiet when**

    - the scheduler steps under the accumulation guard, or takes an argument
      (a metric or an epoch), or steps once per pass over the data: under an
      ``if`` that needs the epoch's last batch, a framework's flag
      (Lightning's ``self.trainer.is_last_batch``,
      ``fixtures/schedule/ok_scheduler_on_last_batch_lightning.py``) or the
      loop's index at the last position of what it iterates
      (``if i + 1 == len(loader):``,
      ``fixtures/schedule/ok_scheduler_on_last_batch_of_loader.py``), alone or
      in an ``and``; or beside a step under a test that runs once per
      pass, after the batch loop that counts its counter has ended (``if
      accum_counter % accum_steps != 0: optimizer.step()`` flushing the
      epoch's last window, ``scheduler.step()`` after it:
      ``fixtures/realworld/ok_gl301_flush_and_schedule_after_batch_loop__pl_tts.py``;
      stepped inside the batch loop instead:
      ``fixtures/realworld/gl301_schedule_inside_batch_loop_with_flush__pl_tts.py``);
    - the loop runs in accelerate's ``accumulate()``: its prepared schedulers
      skip the micro-batches that do not step (outside it, with
      ``accelerator.backward`` under a guard of the loop's own, they step
      every time: ``AcceleratedScheduler.step`` waits only while
      ``sync_gradients`` is False, which only ``accumulate()`` sets;
      ``fixtures/realworld/gl301_prepared_scheduler_outside_accumulate__fluxflow-training.py``). Inside
      ``with accelerator.accumulate(...)`` it reports a scheduler stepped beside
      the optimizer only when that scheduler is certainly plain: built in the
      module (a ``torch.optim.lr_scheduler`` class or a ``get_*schedule*`` of
      transformers/diffusers), handed to no ``prepare``/``prepare_scheduler``
      (any position, tuples, ``self.`` attributes: names are matched by their
      last part) nor to any function that could prepare it, no ``prepare``
      of the module takes ``*args``, and the optimizer is prepared (or handed
      to a helper together with the accelerator). It stays quiet under a test
      of its own, such as ``if accelerator.sync_gradients:``;
    - the scheduler steps in the branch of ``if accumulation_steps > 1:``
      that does not accumulate (the test is a setting: one branch runs for
      the whole training);
    - the module counts the schedule's length in micro-batches: a
      ``..._steps`` it assigns is the number of batches of an epoch
      (``len(loader)``, ``epoch_len``, ``n_batches_per_epoch``:
      ``fixtures/realworld/ok_gl301_schedule_sized_in_batches_per_epoch__emmental.py``) times the epochs, with no accumulation
      count in it (``lr_decay_steps = epoch_len * max_epochs``, also with
      the epochs read by key, ``len(loader) * config.get("num_epochs")``;
      ``fixtures/realworld/gl006_clip_in_step_method__EveryDream2trainer.py``,
      ``fixtures/realworld/gl004_loss_divided_by_accumulator_object__student_aware_distillation.py``),
      or the samples of an epoch over the batch size of one iteration times
      the epochs (``cfg.num_image // cfg.total_batch_size * cfg.num_epoch``
      with ``total_batch_size = batch_size * world_size``:
      ``fixtures/realworld/ok_gl301_schedule_sized_in_micro_batches_from_image_count__GeneFace.py``;
      through a name the module assigns such a count, ``max_iters = epochs *
      iters_per_epoch`` with ``iters_per_epoch = len(train_dataset) //
      (num_gpus * batch_size)``:
      ``fixtures/realworld/ok_gl301_schedule_sized_in_iterations_per_epoch__MuGCDA.py``;
      a batch size that holds the accumulation count sizes it in optimizer
      steps: ``fixtures/realworld/gl301_schedule_sized_in_steps_stepped_per_micro_batch__GeneFace.py``):
      or the scheduler is handed a length multiplied by the accumulation
      count (``num_training_steps=args.max_train_steps *
      args.gradient_accumulation_steps``: counted in micro-batches,
      ``fixtures/realworld/ok_gl301_schedule_length_times_accumulation_count__Latte.py``),
      or the scheduler is built over a setting that also bounds the loop
      (``for it in range(args.max_iter + 1)``) or is compared with the loop's
      variable or a counter it adds one to (``if it < args.cos_max_iter:
      scheduler.step()`` beside ``CosineAnnealingLR(optimizer,
      args.cos_max_iter - args.warm_iter)``:
      ``fixtures/realworld/ok_gl301_schedule_sized_by_the_loops_bound__JoyVASA.py``;
      a length divided by the accumulation count is in optimizer steps:
      ``fixtures/realworld/gl301_schedule_sized_in_steps_stepped_every_iteration__JoyVASA.py``):
      stepped once per micro-batch, such a schedule runs at the pace it was
      planned for.

    Also flagged: a scheduler stepped under a remainder test of the step's
    own counter by another count (``if count % scheduling_step == 0:``
    beside a step under ``if count % grad_accum_step == 0:``, with a plain
    backward), outside the step's test: it steps on micro-batches the
    optimizer does not, unless one count is a multiple of the other
    (``fixtures/realworld/gl301_scheduler_on_own_cadence__torchdistill.py``).

    **Bad**::

        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
            scheduler.step()

    **Good**::

        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    """

    code = "GL301"
    name = "scheduler-steps-per-micro-batch"
    summary = "an LR scheduler is stepped every micro-batch while the optimizer steps under an accumulation guard"
    severity = Severity.ERROR
    fix = FixKind.SAFE
    needs = ((BACKWARD, STEP),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        settled = Settled()
        horizon_in_micro_batches: bool | None = None  # read off the module once, on the first accumulating step
        for root in model.roots:
            framework_decides: dict[int, bool] = {}
            for step, loop in steps_with_loops(root):
                scheds = root.events_of(EventKind.SCHED_STEP, loop)
                if not scheds:
                    continue
                for sched, declared in _unprepared_in_accumulate(model, step, scheds):
                    if sched.node not in settled:
                        yield settled.note(Report(sched.node, declared.scheduler_message(sched.target, step.target)))
                acc = accumulation(root, step, loop)
                if acc is None:
                    continue
                if horizon_in_micro_batches is None:
                    horizon_in_micro_batches = _horizon_in_micro_batches(model)
                if horizon_in_micro_batches:
                    continue
                if any(b.framework is None for b in acc.backwards):  # a plain backward: no framework holds the scheduler back
                    for sched in scheds:
                        cadence = None if sched.has_args or sched.node in settled else _other_cadence(model, sched, step, loop)
                        if cadence is not None:
                            yield settled.note(Report(sched.node, cadence, event=sched, against=(step,)))
                if id(loop) not in framework_decides:
                    # inside a framework's accumulation context its prepared schedulers skip the micro-batches that do not
                    # step; outside it (``accelerator.backward`` under a hand-written guard) they step every time
                    events = root.events_in(loop)
                    framework_decides[id(loop)] = any(e.with_context("accumulate") for e in events)
                if framework_decides[id(loop)]:
                    continue
                for sched in scheds:
                    if sched.node in settled:
                        continue
                    if (
                        not sched.has_args and runs_every_micro_batch(sched, loop, acc) and not split_by_setting(sched, step)
                        and not once_per_pass(sched, loop) and not _sized_by_the_loop(model, sched, loop)
                        and not _length_times_the_count(model, sched.target)
                    ):
                        yield settled.note(
                            Report(
                                sched.node,
                                f"`{sched.target}.step()` runs on every micro-batch but `{step.target}` only steps "
                                f"{accumulation_place(model, acc)}: the schedule advances once per micro-batch and runs that many "
                                f"times too fast; step it right after `{step.target}.step()`",
                                fix=move_scheduler_step(model, sched, step),
                                event=sched, against=(step,),
                            )
                        )


def _sized_by_the_loop(model: LoopModel, sched: Event, loop) -> bool:
    """Whether the scheduler's length is the count of the loop's own iterations: a setting that both appears among
    the arguments of the scheduler's construction (``CosineAnnealingLR(optimizer, args.cos_max_iter - args.warm_iter)``)
    and bounds the loop (``for it in range(args.max_iter + 1)``) or is compared with the loop's variable or a counter
    it adds one to (``if it < args.cos_max_iter: scheduler.step()``). Such a schedule is written in micro-batches, the
    loop's iterations, and stepping it once per micro-batch runs it at the pace it was planned for."""
    if model.index is None or not sched.target or type(loop.node) not in (cst.For, cst.While):
        return False
    horizon = _schedule_lengths(model, sched.target)
    return bool(horizon) and not horizon.isdisjoint(_loop_bounds(loop.node))


def _length_times_the_count(model: LoopModel, scheduler: str | None) -> bool:
    """Whether a call that builds ``scheduler`` is handed a length multiplied by the accumulation count
    (``get_scheduler(..., num_training_steps=args.max_train_steps * args.gradient_accumulation_steps)``): the
    schedule is counted in micro-batches, and stepping it on every one runs it at the pace it was planned for."""
    if model.index is None or not scheduler:
        return False
    return any(
        type(node) is cst.BinaryOperation and type(node.operator) is cst.Multiply and any(
            type(side) in (cst.Name, cst.Attribute) and _ACCUMULATION_NAME.search(dotted_name(side).rsplit(".", 1)[-1])
            for side in (node.left, node.right)
        )
        for value in _constructions(model, scheduler) for arg in value.args for node in walk(arg.value)
    )


def _constructions(model: LoopModel, name: str) -> Iterator[cst.Call]:
    """The calls the module assigns to ``name``, in any function."""
    for table in model.index.assignments.values():
        for value in table.get(name, ()):
            if type(value) is cst.Call:
                yield value


def _schedule_lengths(model: LoopModel, scheduler: str) -> set[str]:
    """The settings named as plain arguments (alone, or added to or taken from another) of the calls that build
    ``scheduler``, following a scheduler handed to another (``GradualWarmupScheduler(..., after_scheduler)``)."""
    found: set[str] = set()
    pending, seen = [scheduler], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for value in _constructions(model, name):
            for arg in value.args:
                for term in _sum_terms(arg.value):
                    term_name = dotted_name(term) if type(term) in (cst.Name, cst.Attribute) else None
                    if term_name is None:
                        continue
                    if model.info(term_name).kind is ObjKind.SCHEDULER:
                        pending.append(term_name)
                    elif "." in term_name and not _ACCUMULATION_NAME.search(term_name.rsplit(".", 1)[-1]):
                        found.add(term_name)  # a setting (``args.max_iter``), not a local the module computes
    return found


def _sum_terms(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """``a - b + 1`` -> ``[a, b, 1]``; anything else is one term (a product counts for nothing alone)."""
    if type(value) is cst.BinaryOperation and type(value.operator) in (cst.Add, cst.Subtract):
        return _sum_terms(value.left) + _sum_terms(value.right)
    return [value]


def _loop_bounds(loop: cst.For | cst.While) -> set[str]:
    """The settings that bound a loop's iterations: ``range(args.max_iter + 1)``'s stop, and any setting compared
    with the loop's variable or with a counter the loop adds one to (``it < args.cos_max_iter``)."""
    bounds: set[str] = set()
    counters: set[str] = set()
    if type(loop) is cst.For:
        counters |= {n.value for n in walk(loop.target) if type(n) is cst.Name}
        if type(loop.iter) is cst.Call and callee_name(loop.iter) == "range" and loop.iter.args:
            stop = loop.iter.args[-1 if len(loop.iter.args) > 1 else 0].value
            for term in _sum_terms(stop):
                name = dotted_name(term) if type(term) in (cst.Name, cst.Attribute) else None
                if name is not None:
                    bounds.add(name)
    for node in walk(loop.body):
        if type(node) is cst.AugAssign and type(node.operator) is cst.AddAssign and number(node.value) == 1:
            name = dotted_name(node.target)
            if name is not None:
                counters.add(name)
    for node in walk(loop.body):
        if type(node) is not cst.Comparison or len(node.comparisons) != 1:
            continue
        sides = [node.left, node.comparisons[0].comparator]
        names = [dotted_name(side) if type(side) in (cst.Name, cst.Attribute) else None for side in sides]
        if names[0] in counters and names[1] is not None:
            bounds.add(names[1])
        elif names[1] in counters and names[0] is not None:
            bounds.add(names[0])
    return bounds - counters


_LENGTH_NAME = re.compile(r"(^|_)(decay|total|training|train|max|num)_?(train_|training_)?(steps?|iters?|iterations?)$")
# The batches of one epoch: ``epoch_len``, ``num_batches``, ``n_batches_per_epoch``
_EPOCH_LENGTH = re.compile(r"^(epoch_len|((n|num)_)?batches(_per_epoch)?)$")
# A name that says it holds (or is made from) the accumulation count: ``gradient_accumulation_steps``, ``grad_acc``
_ACCUMULATION_NAME = re.compile(r"accum|(^|_)acc(_|$)|grad(ient)?_?acc", re.IGNORECASE)


def _horizon_in_micro_batches(model: LoopModel) -> bool:
    """Whether the module sets a schedule length as the batches of an epoch times the epochs, without the
    accumulation count: ``args.lr_decay_steps = int(self.epoch_len * args.max_epochs * 1.5)``,
    ``cfg.total_step = cfg.num_image // cfg.total_batch_size * cfg.num_epoch``."""
    if model.index is None:
        return False
    tables = model.index.assignments.values()
    for table in tables:
        for name, values in table.items():
            if not _LENGTH_NAME.search(name.rsplit(".", 1)[-1].lower()):
                continue
            for value in values:
                if isinstance(value, cst.BaseExpression) and _batches_times_epochs(value, tables):
                    return True
    return False


def _batches_times_epochs(value: cst.BaseExpression, tables) -> bool:
    names = [dotted_name(n) or "" for n in walk(value) if type(n) in (cst.Name, cst.Attribute)]
    # a setting read by its key counts as its name: ``self.config.get('num_epochs', 3)``
    keys = [n.evaluated_value for n in walk(value) if type(n) is cst.SimpleString and isinstance(n.evaluated_value, str)]
    last = [n.rsplit(".", 1)[-1].lower() for n in names] + [k.lower() for k in keys]
    if any(_ACCUMULATION_NAME.search(n) for n in last):
        return False
    batches = (
        _batches_of_an_epoch(value, tables)
        or any(_EPOCH_LENGTH.match(n) for n in last)
        or any(  # ``iters_per_epoch = len(train_dataset) // (num_gpus * batch_size)``, then ``epochs * iters_per_epoch``
            _batches_of_an_epoch(v, tables) and not _names_accumulation(v)
            for n in names for table in tables for v in table.get(n, ()) if isinstance(v, cst.BaseExpression)
        )
    )
    return batches and any("epoch" in n and not _EPOCH_LENGTH.match(n) for n in last)


def _batches_of_an_epoch(value: cst.BaseExpression, tables) -> bool:
    """``len(loader)``, or the samples of an epoch over the batch size of one iteration, in ``value``."""
    return any(type(n) is cst.Call and callee_name(n) == "len" for n in walk(value)) or _samples_over_batch_size(value, tables)


def _names_accumulation(value: cst.BaseExpression) -> bool:
    """Whether a name ``value`` reads says it holds the accumulation count."""
    return any(
        _ACCUMULATION_NAME.search((dotted_name(n) or "").rsplit(".", 1)[-1])
        for n in walk(value) if type(n) in (cst.Name, cst.Attribute)
    )


def _samples_over_batch_size(value: cst.BaseExpression, tables) -> bool:
    """``num_image // total_batch_size`` in the value: the batches of an epoch, when the batch size it divides by is
    no batch of several micro-batches (no name of the divisor, nor any value the module assigns to one, names the
    accumulation count: ``total_batch_size = batch_size * world_size``, not ``... * gradient_acc``)."""
    for node in walk(value):
        if type(node) is not cst.BinaryOperation or type(node.operator) not in (cst.FloorDivide, cst.Divide):
            continue
        divisor = [dotted_name(n) for n in walk(node.right) if type(n) in (cst.Name, cst.Attribute)]
        divisor = [n for n in divisor if n]
        if not any(n.rsplit(".", 1)[-1].lower() in ("batch_size", "total_batch_size", "batchsize") for n in divisor):
            continue
        made_of = [
            v for table in tables for n in divisor for v in table.get(n, ()) if isinstance(v, cst.BaseExpression)
        ]
        return not any(_names_accumulation(v) for v in made_of)
    return False


def _unprepared_in_accumulate(model: LoopModel, step: Event, scheds: list[Event]) -> Iterator[tuple[Event, AccumulateContext]]:
    """The argument-less scheduler steps beside ``step`` in one framework accumulation block (``accelerator.accumulate``)
    that no ``prepare`` of the module can have wrapped (its prepared schedulers skip non-stepping micro-batches)."""
    for block in step.frames:
        found = frameworks.accumulate_owner(block)
        if found is None or found[1] is None:
            continue
        declared, owner = found
        for sched in scheds:
            if sched.has_args or not sched.inside(block) or not sched.target or not step.target:
                continue
            if any(not step.inside(f) for f in frames_inside(sched, block)):
                continue  # under a test of its own (``if accelerator.sync_gradients:``)
            scheduler, optimizer = terminal(cst.parse_expression(sched.target)), terminal(cst.parse_expression(step.target))
            if scheduler and optimizer and model.index is not None and declared.certainly_unprepared(model.index, scheduler, optimizer, owner):
                yield sched, declared


def _other_cadence(model: LoopModel, sched: Event, step: Event, loop) -> str | None:
    """The message when the scheduler steps under a remainder test of the step's own micro-batch counter by another
    count (``count % scheduling_step == 0`` beside a step under ``count % grad_accum_step == 0``), outside the step's
    guard: it then steps on micro-batches the optimizer does not, unless one count is a multiple of the other."""
    step_terms = _remainder_terms(step, loop)
    sched_terms = _remainder_terms(sched, loop)
    if not step_terms or not sched_terms:
        return None
    step_counts = {count for _, count, _ in step_terms}
    for counter, count, written in sched_terms:
        if count in step_counts:
            return None  # also tested against the step's count: it steps with the optimizer
    for counter, count, written in sched_terms:
        for step_counter, step_count, step_written in step_terms:
            if counter == step_counter and count != step_count:
                return (
                    f"`{sched.target}.step()` runs when `{written}` but `{step.target}` steps when `{step_written}`: "
                    f"the schedule advances on micro-batches the optimizer does not step (unless `{count}` is a "
                    f"multiple of `{step_count}`), so it runs at another pace than the optimizer's steps; step it "
                    f"under the optimizer's test as well"
                )
    return None


def _remainder_terms(event: Event, loop) -> list[tuple[str, str, str]]:
    """``(counter, count, code)`` for each ``counter % count == 0`` term (``not counter % count``) of the ``and``
    chains of the ``if`` branches around ``event`` inside ``loop``; names compared by their last part."""
    found = []
    for frame in frames_inside(event, loop):
        if frame.branch != "if" or type(frame.node) is not cst.If:
            continue
        for term in _and_terms(frame.node.test):
            read = _remainder(term)
            if read is not None:
                found.append((*read, cst.Module([]).code_for_node(term)))
    return found


def _and_terms(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    if type(test) is cst.BooleanOperation and type(test.operator) is cst.And:
        return _and_terms(test.left) + _and_terms(test.right)
    return [test]


def _remainder(term: cst.BaseExpression) -> tuple[str, str] | None:
    """``c % n == 0`` or ``not c % n`` → (last name of c, last name of n)."""
    if type(term) is cst.UnaryOperation and type(term.operator) is cst.Not:
        modulo = term.expression
    elif (
        type(term) is cst.Comparison and len(term.comparisons) == 1 and type(term.comparisons[0].operator) is cst.Equal
        and type(term.comparisons[0].comparator) is cst.Integer and term.comparisons[0].comparator.value == "0"
    ):
        modulo = term.left
    else:
        return None
    if type(modulo) is not cst.BinaryOperation or type(modulo.operator) is not cst.Modulo:
        return None
    left = modulo.left
    if type(left) is cst.BinaryOperation and type(left.operator) in (cst.Add, cst.Subtract) and type(left.right) is cst.Integer:
        left = left.left  # ``(step + 1) % n``: the same counter
    counter, count = dotted_name(left), dotted_name(modulo.right)
    if counter is None or count is None:
        return None
    return counter.rsplit(".", 1)[-1], count.rsplit(".", 1)[-1]


class SchedulerNeverStepped(Rule):
    """A framework leaves the schedulers to the module, and the module never steps them.

    **Why it matters.** Lightning steps the schedulers ``configure_optimizers``
    returns only under automatic optimization. A LightningModule that sets
    ``self.automatic_optimization = False`` steps its optimizers by hand, and
    must step its schedulers by hand too (``self.lr_schedulers()`` hands them
    back). If nothing does, the warm-up never happens and the decay never
    starts: the whole run trains at the initial learning rate, and nothing
    fails.

    **Fix.** Step them where the optimizers step, or at the end of each epoch
    for an epoch-wise schedule: ``sch_g, sch_d = self.lr_schedulers();
    sch_g.step()``.

    Reported at the last optimizer step of ``training_step``, where the
    schedulers' steps belong (or at ``configure_optimizers``' return when
    ``training_step`` steps no optimizer the rule can name).

    **Stays quiet when** the class calls ``self.lr_schedulers()`` anywhere,
    or steps anything named as a scheduler, or one of the objects
    ``configure_optimizers`` returns as schedulers; when it sets a parameter
    group's ``"lr"`` itself (it anneals the rate by hand:
    ``fixtures/realworld/ok_gl308_lr_annealed_by_hand__Open-MAGVIT2.py``); or
    automatic optimization is on (``fixtures/schedule/ok_gl308_manual_schedulers_stepped.py``), also in
    a class that calls ``self.manual_backward`` after overriding it, which
    drops Lightning's check that manual optimization is on
    (``fixtures/realworld/ok_gl308_manual_backward_overridden_under_automatic__RWKV-infctx-trainer.py``).
    What the hooks Lightning calls only under automatic optimization do
    (``optimizer_step``, ``optimizer_zero_grad``, ``lr_scheduler_step``)
    never runs and counts for nothing, nor does a rate ``configure_optimizers``
    sets once before returning
    (``fixtures/realworld/gl308_warmup_in_optimizer_step_hook_under_manual__naifu.py``).
    Manual optimization switched on only under a test (``if optim_fn is None:
    self.automatic_optimization = False``) while ``configure_optimizers``
    returns early under the same test (``if optim_fn is None: return None``):
    the schedulers are returned only where Lightning steps them
    (``fixtures/realworld/ok_gl308_manual_only_without_optimizer__cellarium-ml.py``;
    under another test, such as the Lightning version, the schedulers are left
    unstepped on the manual side: ``fixtures/realworld/gl308_manual_under_version_test__SRGAN.py``).
    The schedulers are read from a tuple or a list of two lists
    (``return [[optimizer], [scheduler]]``), a dict or list of dicts with an
    ``"lr_scheduler"`` key, or names bound to them (also a list the hook
    fills with ``append``); the hook and the methods that may step them may
    be inherited from a base class of the module
    (``fixtures/realworld/gl308_schedulers_of_inherited_hook_never_stepped__matsciml.py``).

    **Bad**::

        class GAN(LightningModule):
            def __init__(self):
                super().__init__()
                self.automatic_optimization = False

            def training_step(self, batch, batch_idx):
                opt_g, opt_d = self.optimizers()
                ...  # backward and step each, no scheduler step

            def configure_optimizers(self):
                ...
                return [opt_g, opt_d], [ExponentialLR(opt_g, 0.999), ExponentialLR(opt_d, 0.999)]

    **Good**::

            def on_train_epoch_end(self):
                for scheduler in self.lr_schedulers():
                    scheduler.step()
    """

    code = "GL308"
    name = "scheduler-never-stepped"
    summary = "under manual optimization nothing steps the schedulers `configure_optimizers` returns"
    severity = Severity.ERROR
    fix = None  # per step or per epoch is the schedule's to say
    needs = tuple(left.tokens for left in frameworks.SCHEDULERS_LEFT)

    def check(self, model: LoopModel) -> Iterator[Report]:
        from gradlint.frameworks.settings import framework_settings

        settings = framework_settings(model)
        for left in frameworks.SCHEDULERS_LEFT:
            for cls in settings.classes_of(left.classes):
                if not left.manual(cls):
                    continue
                methods = _methods_with_inherited(model, cls)
                hook = next((m for m in methods if m.name.value == left.hook), None)
                if hook is None:
                    continue
                returned = [n for n in walk(hook.body) if type(n) is cst.Return and n.value is not None]
                schedulers = [s for r in returned for s in _returned_schedulers(r.value, hook)]
                # what runs: not the hooks the framework leaves uncalled, and not the hook itself for a rate set by hand
                # (run once, it sets a starting rate and anneals nothing)
                running = [m for m in methods if m.name.value not in left.uncalled_hooks]
                if (not schedulers or _steps_a_scheduler(model, running, schedulers, left.fetch)
                        or _sets_lr_by_hand([m for m in running if m is not hook])):
                    continue
                if left.manual_under is not None and _returns_early_under(hook, left.manual_under(cls)):
                    continue  # ``if optim_fn is None: return None``: no scheduler where manual optimization is on
                statement = next(r for r in returned if _returned_schedulers(r.value, hook))
                last_step = _last_optimizer_step(methods, left.step_hook)
                where = (f"after this step of `{dotted_name(last_step.func.value)}` or at each epoch's end"
                         if last_step is not None else "where the optimizers step or at each epoch's end")
                yield Report(
                    last_step if last_step is not None else statement,
                    f"`{left.hook}` returns schedulers at line {model.line(statement)}, but {left.words} and nothing in "
                    f"`{cls.name.value}` steps them: the learning rate never changes from its initial value; step them "
                    f"by hand, {where} (`self.{left.fetch}()` hands them back)",
                )




def _methods_with_inherited(model: LoopModel, cls: cst.ClassDef) -> list[cst.FunctionDef]:
    """The class's methods, then those it inherits from its bases of the module that it does not override
    (``configure_optimizers`` of a ``BaseTaskModule`` the task class derives from)."""
    methods = list(class_methods(cls))
    index = model.index
    if index is None:
        return methods
    names = {m.name.value for m in methods}
    pending, seen = list(index.class_bases.get(cls.name.value, [])), {cls.name.value}
    while pending:
        base = pending.pop(0)
        if base in seen:
            continue
        seen.add(base)
        for name, method in index.class_methods.get(base, {}).items():
            if name not in names:
                names.add(name)
                methods.append(method)
        pending.extend(index.class_bases.get(base, []))
    return methods


def _sets_lr_by_hand(methods: list[cst.FunctionDef]) -> bool:
    """Whether the class writes a parameter group's learning rate itself (``group["lr"] = lr * decay``): the rate
    changes, whatever the returned schedulers do."""
    for method in methods:
        for node in walk(method.body):
            targets = ([t.target for t in node.targets] if type(node) is cst.Assign
                       else [node.target] if type(node) is cst.AugAssign else [])
            for target in targets:
                if type(target) is cst.Subscript and len(target.slice) == 1:
                    key = target.slice[0].slice
                    if type(key) is cst.Index and type(key.value) is cst.SimpleString and key.value.evaluated_value == "lr":
                        return True
    return False


def _last_optimizer_step(methods: list[cst.FunctionDef], hook: str) -> cst.Call | None:
    """The last ``opt.step()`` of the per-batch method, where the user adds the schedulers' steps: the report's place."""
    from gradlint.objects import ObjKind, kind_from_name

    method = next((m for m in methods if m.name.value == hook), None) if hook else None
    if method is None:
        return None

    def steps_in(function: cst.FunctionDef) -> list[cst.Call]:
        return [
            node for node in walk(function.body)
            if type(node) is cst.Call and callee_name(node) == "step" and type(node.func) is cst.Attribute
            and kind_from_name(dotted_name(node.func.value) or "") is ObjKind.OPTIMIZER
        ]

    steps = steps_in(method)
    if not steps:  # ``self.manual_optimization_step(batch)``: the steps in a method the per-batch one calls
        called = {
            node.func.attr.value for node in walk(method.body)
            if type(node) is cst.Call and type(node.func) is cst.Attribute and dotted_name(node.func.value) == "self"
        }
        steps = [step for m in methods if m.name.value in called for step in steps_in(m)]
    return steps[-1] if steps else None


def _returned_schedulers(value: cst.BaseExpression, hook: cst.FunctionDef) -> list[cst.BaseExpression]:
    """``[opt_g, opt_d], [sched_g, sched_d]`` (the lists also as names the hook binds) or ``{"optimizer": o, "lr_scheduler": s}`` (also a list of such dicts,
    or a name the hook builds such a dict in: ``config = {"optimizer": o}; config["lr_scheduler"] = s; return
    config``): the scheduler expressions."""
    if type(value) is cst.Name:
        found = []
        for node in walk(hook.body):
            if type(node) is not cst.Assign:
                continue
            for target in node.targets:
                if type(target.target) is cst.Name and target.target.value == value.value and type(node.value) is cst.Dict:
                    found += _returned_schedulers(node.value, hook)
                elif tracked_name(target.target) == f"{value.value}['lr_scheduler']":
                    found.append(node.value)
        return found
    if type(value) is cst.Tuple and len(value.elements) == 2 or _two_lists(value):
        second = value.elements[1].value
        if type(second) is cst.Name:  # ``return optimizers, schedulers`` with ``schedulers = [ExponentialLR(...), ...]``
            appended = [  # ``schedulers = []`` ... ``schedulers.append(scheduler)``
                node.args[0].value for node in walk(hook.body)
                if type(node) is cst.Call and callee_name(node) == "append" and type(node.func) is cst.Attribute
                and dotted_name(node.func.value) == second.value and len(node.args) == 1
            ]
            second = next((
                node.value for node in walk(hook.body) if type(node) is cst.Assign and type(node.value) in (cst.List, cst.Tuple)
                and any(type(t.target) is cst.Name and t.target.value == second.value for t in node.targets)
            ), second)
            if appended:
                return [e.value for e in second.elements if type(e) is cst.Element] + appended if type(second) in (cst.List, cst.Tuple) else appended
        if type(second) in (cst.List, cst.Tuple):
            return [e.value for e in second.elements if type(e) is cst.Element]
    dicts = [value] if type(value) is cst.Dict else (
        [e.value for e in value.elements if type(e) is cst.Element and type(e.value) is cst.Dict]
        if type(value) in (cst.List, cst.Tuple) else []
    )
    found = []
    for mapping in dicts:
        for element in mapping.elements:
            if type(element) is cst.DictElement and type(element.key) is cst.SimpleString and element.key.evaluated_value == "lr_scheduler":
                found.append(element.value)
    return found


def _returns_early_under(hook: cst.FunctionDef, tests: frozenset[str]) -> bool:
    """Whether the hook returns under one of ``tests`` (the ones that switch manual optimization on), in an ``if``
    among its own statements: the schedulers it returns later are returned only where the framework steps them."""
    if not tests:
        return False
    module = cst.Module(body=[])
    for statement in hook.body.body:
        if type(statement) is cst.If and module.code_for_node(statement.test) in tests:
            if any(type(n) is cst.Return for n in walk(statement.body)):
                return True
    return False


def _two_lists(value: cst.BaseExpression) -> bool:
    """``[[optimizer], [scheduler]]``: Lightning reads a list of two whose first element is a list as optimizers and
    schedulers (a list of optimizers alone holds no list)."""
    return (
        type(value) is cst.List and len(value.elements) == 2 and all(type(e) is cst.Element for e in value.elements)
        and type(value.elements[0].value) is cst.List
    )


def _steps_a_scheduler(model: LoopModel, methods: list[cst.FunctionDef], schedulers: list, fetch: str) -> bool:
    """Whether the class fetches the schedulers back, or steps one of them or anything named as a scheduler."""
    from gradlint.objects import ObjKind, kind_from_name

    returned = {dotted_name(s) for s in schedulers} - {None}
    for method in methods:
        for node in walk(method.body):
            if type(node) is not cst.Call:
                continue
            name = callee_name(node)
            if name == fetch:
                return True
            if name != "step" or type(node.func) is not cst.Attribute:
                continue
            owner = dotted_name(node.func.value)
            if owner is None or owner in returned or kind_from_name(owner) is ObjKind.SCHEDULER:
                return True
    return False
