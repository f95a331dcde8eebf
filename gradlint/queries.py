"""Questions the rules ask of the loop model, written once so that every rule means the same thing.

Which loop is a step's training loop, does a clear reach a given optimizer,
is a step accumulating gradients and over which backwards: the predicates
the rule catalogue is phrased in.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections.abc import Callable, Iterable, Iterator

import libcst as cst

from gradlint import frameworks
from gradlint.events import EventKind
from gradlint.model import HANDOFF, Event, Frame, FrameKind, LoopModel, Root
from gradlint.syntax import (
    boolean_terms, callee_name, dotted_name, element_name, is_grad, keyword_arg, lies_under, method_name, number,
    positional_args, walk, writes_grad_in_place,
)
from gradlint.objects import ObjKind, last_name


def same_object(a: str | None, b: str | None) -> bool:
    """Whether two spellings name the same object (``self.optimizer`` and ``optimizer`` do)."""
    return a is not None and b is not None and last_name(a) == last_name(b)


def local_of_its_own(model: LoopModel, a: str, b: str, at: cst.CSTNode) -> bool:
    """Whether ``a`` and ``b`` are a bare name and an attribute of the same last name (``meta_opt`` and
    ``self.meta_opt``) while the function holding ``at`` assigns the bare name something other than the attribute
    (``meta_opt = AdamW(meta_model.parameters())``): a local of its own, another object, whatever
    :func:`same_object` says of the spelling."""
    bare, attribute = (a, b) if "." not in a else (b, a)
    if "." in bare or "." not in attribute or last_name(attribute) != bare or model.index is None:
        return False
    values = model.index.assignments.get(function_holding(model, at), {}).get(bare, ())
    return any(not isinstance(v, cst.BaseExpression) or dotted_name(v) != attribute for v in values)


def _holds(outer: str, inner: str) -> bool:
    """Whether ``inner`` is an attribute of ``outer`` (``self.optim`` holds ``self.optim.optimizer``)."""
    return inner.startswith(outer + ".")


def _built_from(model: LoopModel, outer: str, inner: str) -> bool:
    """Whether ``outer`` is built by a call handed ``inner`` (``scheduler = LRScheduler(optimizer, lr)``,
    ``Lookahead(base_optimizer)``): an optimizer wrapper steps and clears the optimizer it is handed."""
    if model.index is None:
        return False
    return any(
        type(value) is cst.Call and any(same_object(dotted_name(arg.value), inner) for arg in value.args)
        for value in model.index.assigned_anywhere(outer)
    )


def _may_be_same_element(a: str, b: str) -> bool:
    """``opts[i]`` and ``opts[0]``: elements of one collection, one of them picked by a variable."""
    if not (a.endswith("]") and b.endswith("]")):
        return False
    base_a, key_a = a[:-1].split("[", 1)
    base_b, key_b = b[:-1].split("[", 1)
    literal = re.compile(r"^(\d+|'.*'|\".*\")$")
    return same_object(base_a, base_b) and not (literal.match(key_a) and literal.match(key_b))


def _picked_from(model: LoopModel, name: str, element: str) -> bool:
    """Whether ``name`` is assigned the element (``opt = optimizers[0]``, for ``optimizers[0]``): one optimizer."""
    if model.index is None or not element.endswith("]"):
        return False
    return any(
        type(value) is cst.Subscript and same_object(element_name(value), element)
        for value in model.index.assigned_anywhere(name)
    )


def param_sources(model: LoopModel, optimizer: str) -> frozenset[str]:
    """The models an optimizer was built from, when the module shows it."""
    info = model.objects.get(optimizer)
    if info is not None and info.param_sources:
        return info.param_sources
    return model.all_param_sources().get(last_name(optimizer), frozenset())


def clears(model: LoopModel, zero: Event, optimizer: str | None) -> bool:
    """Whether a ZERO event clears the gradients that ``optimizer`` steps with.

    A clear of an unknown target, or of a model not known to belong to
    another optimizer, is taken to clear everything: when unsure, assume the
    code is right. A clear of one named tensor's ``.grad`` (an adversarial
    perturbation, one frozen layer) reaches an optimizer only when the
    optimizer was not built from whole models.
    """
    if zero.kind is not EventKind.ZERO:
        return False
    if zero.recovers:
        return False  # a clear in an ``except`` handler recovers from a failed batch: it is not the loop's clear
    if zero.target_kind is ObjKind.TENSOR:
        return optimizer is None or not param_sources(model, optimizer)
    if zero.target is None or optimizer is None:
        return True
    if zero.target_kind is ObjKind.OPTIMIZER:
        # ``self.optim.zero_grad()`` clears ``self.optim.optimizer``: a wrapper's clear reaches the optimizer it holds,
        # and the optimizer's clear reaches the wrapper built around it (``scheduler = LRScheduler(optimizer, lr)``)
        return (
            same_object(zero.target, optimizer) or _holds(zero.target, optimizer) or _holds(optimizer, zero.target)
            or _built_from(model, optimizer, zero.target) or _built_from(model, zero.target, optimizer)
            or _may_be_same_element(zero.target, optimizer)
            or _picked_from(model, optimizer, zero.target) or _picked_from(model, zero.target, optimizer)
            or _shares_parameters(model, zero.target, optimizer)
        )
    sources = param_sources(model, optimizer)
    if not sources:
        return True
    owner = last_name(zero.target)
    if owner in sources:
        return True
    known_models = set().union(*model.all_param_sources().values())
    return owner not in known_models


def _shares_parameters(model: LoopModel, a: str, b: str) -> bool:
    """Whether two optimizers are visibly built over a network in common (``info_optimizer`` over
    ``chain(G.parameters(), D.parameters())`` and ``D_optimizer`` over ``D.parameters()``): a clear of one clears
    those parameters of the other."""
    return bool(param_sources(model, a) & param_sources(model, b))


# Helpers that take the optimizer for something else than clearing, by what their name says.
_NOT_CLEARING = re.compile(
    r"clip|learning_rate|(^|_)lr($|_)|schedul|warmup|save|checkpoint|load|log|print|summar|report|state_dict",
    re.IGNORECASE,
)


def handoff_may_clear(handoff: Event, keeps: frozenset[str] = frozenset()) -> bool:
    """Whether code the module does not show, handed the optimizer, may clear its gradients.

    Code of another file of the run that never clears (``keeps``, from the
    project index: every definition of the name in the run is read and none
    clears or hands its arguments on) does not. Unknown code is taken to
    clear unless its name says what else it does (``clip_gradient(optimizer, 1.0)``,
    ``adjust_learning_rate(optimizer, epoch)``, ``save_checkpoint(model, optimizer)``).
    """
    name = callee_name(handoff.node) if type(handoff.node) is cst.Call else None
    if name is not None and (name in keeps or name in frameworks.KEEPS_GRADIENTS or _SCHEDULER_CLASS.search(name)):
        return False
    return name is None or CLEAR_WORDS.search(name) is not None or _NOT_CLEARING.search(name) is None


# A name that says it zeroes, clears or resets (``reset_accumulation``, ``clear_grads``): it may clear gradients
CLEAR_WORDS = re.compile(r"zero|clear|reset", re.IGNORECASE)
# torch's schedulers by their class names (``StepLR``, ``CosineAnnealingLR``, ``ReduceLROnPlateau``): built over the
# optimizer, they only read and set its learning rates
_SCHEDULER_CLASS = re.compile(r"[a-z]LR$|^ReduceLROnPlateau$")


def handoff_may_step(call: cst.CSTNode) -> bool:
    """Whether a call the module cannot see into, handed an optimizer, may step it: unless its name says it does
    something else (``save_checkpoint(model, optimizer)``, ``adjust_learning_rate(optimizer, epoch)``,
    ``optimizer_eval_mode(optimizer)``, ``save_training_state(path, optimizer)``: a name that starts with such a verb
    does that whatever follows). "optimizer" in a name names the argument, not the verb ``optimize``."""
    name = callee_name(call) if type(call) is cst.Call else None
    if name is None:
        return True
    if name in frameworks.KEEPS_GRADIENTS:
        return False
    words = _words(name)
    if words[0] in _NOT_STEPPING_VERBS and not _STEP_VERBS.intersection(words):
        return False  # the verb comes first: ``save_training_state``, ``log_optimizer_stats`` (not ``log_and_step``)
    return _STEPPING_WORDS.search(name) is not None or _NOT_STEPPING.search(name) is None


def _words(name: str) -> list[str]:
    """``["save", "training", "state"]`` for ``save_training_state``, ``_saveTrainingState`` or ``SaveTrainingState``."""
    words = re.split(r"_+|(?<=[a-z0-9])(?=[A-Z])", name.rsplit(".", 1)[-1].lstrip("_"))
    return [w.lower() for w in words if w] or [""]


_STEP_VERBS = frozenset(("step", "steps", "update", "optimize", "optimise"))
_NOT_STEPPING_VERBS = frozenset((
    "save", "load", "restore", "store", "dump", "write", "log", "print", "report", "plot", "show", "visualize",
    "eval", "evaluate", "validate", "test", "clip", "zero", "clear", "reset", "summarize", "checkpoint", "get",
))
_STEPPING_WORDS = re.compile(r"step|update|optimi[sz]e(?!r)|train", re.IGNORECASE)
_NOT_STEPPING = re.compile(
    r"clip|learning_rate|(^|_)lr($|_)|schedul|warmup|save|checkpoint|load|log|print|summar|report|state_dict|zero|clear|reset"
    r"|eval",
    re.IGNORECASE,
)


def order_of(events: Iterable[Event]) -> dict[int, int]:
    """Position of each event (by identity) in a list: program order."""
    return {id(e): i for i, e in enumerate(events)}


def home_loop(root: Root, step: Event) -> Frame | None:
    """The training loop of a step: its innermost loop that also runs a backward."""
    for loop in reversed(step.loops):
        if EventKind.BACKWARD in root.kinds_in(loop):
            return loop
    return None


def loop_phrase(model: LoopModel, loop: Frame) -> str:
    """Where a training loop is, for messages: its line, or the function that is one iteration of it."""
    if loop.called_by is not None and type(loop.node) is cst.FunctionDef:
        return f"in `{loop.node.name.value}` at line {model.line(loop.node.name)} ({loop.called_by})"
    return f"in the loop at line {model.line(loop.node)}"


def innermost_loop(event: Event) -> Frame | None:
    """The loop directly around an event, if any."""
    loops = event.loops
    return loops[-1] if loops else None


def region(root: Root, event: Event) -> list[Event]:
    """The events that run with ``event``: those of its innermost loop, or of the whole root."""
    loop = innermost_loop(event)
    return root.events_in(loop) if loop is not None else root.events


@dataclasses.dataclass
class Accumulation:
    """How a step accumulates gradients over several backwards."""

    style: str  # "guard": the step is under ``if boundary:``; "micro_loop": backwards run in an inner loop
    frame: Frame  # the guard branch, or the inner micro-batch loop
    backwards: list[Event]  # the backwards whose gradients pile up for the step
    count: cst.BaseExpression | None  # the number of micro-batches, when the code shows it
    # the last micro-batch's backwards, run after the micro-batch loop and before the step (``range(accum - 1)`` then
    # one more forward and backward)
    trailing: tuple[Event, ...] = ()


def runs_every_micro_batch(event: Event, loop: Frame, acc: Accumulation) -> bool:
    """Whether ``event`` runs on the micro-batches that do not step: outside the guard, or inside the micro-batch loop."""
    if acc.style == "guard":
        return not any(f.accumulation for f in frames_inside(event, loop))
    return event.inside(acc.frame)


def once_per_pass(event: Event, loop: Frame) -> bool:
    """Whether ``event`` runs on one iteration of ``loop`` per pass over its data (once per epoch), not on every
    micro-batch: inside ``loop`` it sits in the ``if`` branch of a test that requires the pass's last batch, alone or
    as one term of an ``and``: a framework's end-of-epoch flag (``self.trainer.is_last_batch``,
    ``frameworks.EPOCH_END_FLAGS``), or the loop's own index compared to the last position of what it iterates
    (``for i, b in enumerate(loader)``: ``i == len(loader) - 1``, ``i + 1 == len(loader)``). A term of an ``or`` (the
    "or the last batch" clause of an accumulation guard) does not count."""
    for frame in frames_inside(event, loop):
        if frame.kind is not FrameKind.BRANCH or frame.branch != "if" or type(frame.node) is not cst.If:
            continue
        if any(_last_of_pass(term, loop) for term in boolean_terms(frame.node.test, cst.And)):
            return True
    return False


def _last_of_pass(term: cst.BaseExpression, loop: Frame) -> bool:
    if type(term) is cst.Attribute and term.attr.value in frameworks.EPOCH_END_FLAGS:
        return True
    if type(term) is not cst.Comparison or len(term.comparisons) != 1 or type(term.comparisons[0].operator) is not cst.Equal:
        return False
    enumerated = _enumerated(loop)
    if enumerated is None:
        return False
    index, iterated = enumerated
    left, right = _offset(term.left), _offset(term.comparisons[0].comparator)
    for (a, a_off), (b, b_off) in ((left, right), (right, left)):
        if a == index and b == f"len({iterated})" and b_off - a_off == -1:
            return True
    return False


def _enumerated(loop: Frame) -> tuple[str, str] | None:
    """``for i, batch in enumerate(loader):`` → (``i``, ``loader``); None for any other loop."""
    node = loop.node
    if type(node) is not cst.For or type(node.iter) is not cst.Call or callee_name(node.iter) != "enumerate":
        return None
    if type(node.target) is not cst.Tuple or not node.target.elements or not node.iter.args:
        return None
    index, iterated = dotted_name(node.target.elements[0].value), dotted_name(node.iter.args[0].value)
    return (index, iterated) if index is not None and iterated is not None else None


def counter_and_offset(node: cst.BaseExpression) -> tuple[str | None, int]:
    """A counter and the literal added to it: ``batch_idx`` → (batch_idx, 0); ``batch_idx + 1`` or ``1 + batch_idx``
    → (batch_idx, 1); ``step - 1`` → (step, -1); (None, 0) for any other sum."""
    if type(node) is cst.BinaryOperation and type(node.operator) in (cst.Add, cst.Subtract):
        sign = 1 if type(node.operator) is cst.Add else -1
        if type(node.right) is cst.Integer:
            return dotted_name(node.left), sign * int(node.right.value)
        if type(node.left) is cst.Integer and sign == 1:
            return dotted_name(node.right), int(node.left.value)
        return None, 0
    return dotted_name(node), 0


def _offset(node: cst.BaseExpression) -> tuple[str | None, int]:
    """``i + 1`` → (``i``, 1); ``len(loader) - 1`` → (``len(loader)``, -1); ``i`` → (``i``, 0)."""
    offset = 0
    if type(node) is cst.BinaryOperation and type(node.operator) in (cst.Add, cst.Subtract) and type(node.right) is cst.Integer:
        offset = int(node.right.value) * (1 if type(node.operator) is cst.Add else -1)
        node = node.left
    if type(node) is cst.Call and callee_name(node) == "len" and len(node.args) == 1 and type(node.func) is cst.Name:
        inner = dotted_name(node.args[0].value)
        return (f"len({inner})" if inner is not None else None), offset
    return dotted_name(node), offset


def accumulation_place(model: LoopModel, acc: Accumulation) -> str:
    """Where an accumulating step sits, for messages."""
    if acc.style == "guard":
        return f"under the accumulation guard at line {model.line(acc.frame.node)}"
    return f"after the micro-batch loop at line {model.line(acc.frame.node)}"


def accumulation(root: Root, step: Event, loop: Frame) -> Accumulation | None:
    """Whether ``step`` accumulates gradients over several backwards of ``loop``, and how."""
    probes = probe_events(root)
    backwards = [b for b in backwards_in(root, loop) if not split_by_setting(b, step) and id(b) not in probes]
    if backwards and all(_only_with_accumulation_off(b, loop) for b in backwards):
        # ``if accum > 1: loss = loss / accum`` / ``else: loss.backward()``: with accumulation on nothing is
        # backpropagated at all (GL022's finding), and with it off nothing accumulates
        return None
    at = root.order(step)
    for frame in frames_inside(step, loop):
        if frame.kind is not FrameKind.BRANCH or not frame.accumulation:
            continue
        guarded = [b for b in backwards_in(root, frame) if id(b) not in probes]
        stepping_branch_backpropagates = any(root.order(b) < at for b in guarded)
        if stepping_branch_backpropagates and not _other_branch_only_backpropagates(root, frame, loop):
            continue
        if not guarded:  # the usual guard holds the step, not a backward: every backward of the loop is outside
            outside = backwards
        else:
            inside = {id(b) for b in guarded}
            outside = [b for b in backwards if id(b) not in inside]
        if outside and _another_optimizer_steps_every_pass(root, step, frame, outside, loop):
            return None  # ``loss.backward(); opt.step(); if i % n_critic: d_opt.step()``: a schedule, each pass cleared
        if outside:
            # if/else: the stepping branch's own backward is the last micro-batch, summed with the others
            last = [b for b in guarded if root.order(b) < at] if stepping_branch_backpropagates else []
            return Accumulation("guard", frame, sorted(outside + last, key=root.order), frame.count)
    # The backwards before the step, in order; each must sit in an inner loop that does not hold the step.
    before = backwards[: bisect.bisect_left(backwards, at, key=root.order)]
    if not before:
        return None
    micro_loops = []
    for b in before:
        micro = _loop_below(b, loop)
        if micro is None or step.inside(micro):
            return None
        micro_loops.append(micro)
    micro = micro_loops[-1]
    if root.events_of(EventKind.STEP, micro):
        return None  # the inner loop steps itself: a training loop of its own, not micro-batches summed for this step
    if _retry_loop(micro.node):
        return None  # ``for _ in range(k): try: ...backward(); break``: the pass that gets through ends it
    return Accumulation("micro_loop", micro, [b for b in before if b.inside(micro)], _range_count(micro))


def _another_optimizer_steps_every_pass(root: Root, step: Event, guard: Frame, outside: list[Event], loop: Frame) -> bool:
    """Whether another optimizer steps on every pass, after the last backward outside the guard and before the guarded
    step: the backward serves that step each pass, and the guard only schedules when this optimizer steps too (a
    discriminator stepped every ``n_critic`` passes on the same backward as the generator, both cleared every pass).
    An accumulation holds back every step of its window."""
    last = root.order(outside[-1])
    at = root.order(step)
    return any(
        last < root.order(other) < at and not same_object(other.target, step.target) and other.framework is None
        and not other.inside(guard)
        and all(f.kind is FrameKind.WITH or (f.kind is FrameKind.BRANCH and f.fixed) for f in frames_inside(other, loop))
        for other in root.events_of(EventKind.STEP, loop)
    )


def accumulation_side(event: Event, loop: Frame) -> tuple[str, bool] | None:
    """``(setting, True)`` when ``event`` runs only with accumulation on (inside ``if accum > 1:`` within ``loop``),
    ``(setting, False)`` when only with it off (in that test's ``else``); None when under no such test."""
    for frame in frames_inside(event, loop):
        if frame.accumulation_on is not None:
            return frame.accumulation_on
    return None


def _only_with_accumulation_off(event: Event, loop: Frame) -> bool:
    """Whether ``event`` runs only with accumulation off: in the ``else`` of ``if accum > 1:`` within ``loop``."""
    side = accumulation_side(event, loop)
    return side is not None and not side[1]


def _other_branch_only_backpropagates(root: Root, branch: Frame, loop: Frame) -> bool:
    """Whether the other branch of the guard's ``if`` backpropagates and never steps.

    ``if (i + 1) % k != 0: loss.backward()`` / ``else: loss.backward(); opt.step()``:
    the stepping branch's own backward is the last micro-batch, the other
    branch's backwards pile up before it.
    """
    if branch.branch not in ("if", "else"):
        return False
    other = [e for e in root.events_in(loop) if in_other_branch(e, branch)]
    kinds = {e.kind for e in other}
    return EventKind.BACKWARD in kinds and EventKind.STEP not in kinds


def in_other_branch(event: Event, branch: Frame) -> bool:
    """Whether ``event`` sits in the other branch of the ``if`` whose one branch is ``branch``."""
    return branch.branch in ("if", "else") and any(
        f.kind is FrameKind.BRANCH and f.node is branch.node and f.branch != branch.branch for f in event.frames
    )


def lies_in(model: LoopModel, node: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
    """Whether ``node`` is written inside ``ancestor`` (read up the module index's parents)."""
    return lies_under(model.parents or {}, node, ancestor)


def backwards_in(root: Root, frame: Frame) -> list[Event]:
    """The backwards inside ``frame``, in program order."""
    return root.events_of(EventKind.BACKWARD, frame)


def frames_inside(event: Event, loop: Frame) -> tuple[Frame, ...]:
    """The frames around ``event`` that lie inside ``loop`` (the guards and inner loops of one iteration)."""
    return event.frames[_index(event.frames, loop) + 1 :]


def runs_once(model: LoopModel, event: Event, loop: Frame) -> bool:
    """Whether ``event`` sits in a block the loop runs at most once: ``if not self._check_done and ...:`` whose body
    sets ``self._check_done = True``, a flag nothing in the loop sets back (a one-time debug probe)."""
    for frame in frames_inside(event, loop):
        if frame.kind is not FrameKind.BRANCH or type(frame.node) is not cst.If or frame.branch != "if":
            continue
        flags = {
            dotted_name(term.expression) for term in boolean_terms(frame.node.test, cst.And)
            if type(term) is cst.UnaryOperation and type(term.operator) is cst.Not
        } - {None}
        if not flags:
            continue
        set_true = _flags_set(model, frame.node.body, "True") & flags
        if set_true and not (_flags_set(model, loop.node.body, "False") & set_true):
            return True
    return False


def _flags_set(model: LoopModel, block: cst.CSTNode, literal: str) -> set[str]:
    """The names assigned the literal ``True`` or ``False`` under ``block``."""
    return {
        dotted_name(t.target) for node in model.file.walk(block)
        if type(node) is cst.Assign and type(node.value) is cst.Name and node.value.value == literal
        for t in node.targets
    } - {None}


def _index(frames: tuple[Frame, ...], frame: Frame) -> int:
    for i, f in enumerate(frames):
        if f is frame:
            return i
    raise ValueError("frame not around event")


def _loop_below(event: Event, loop: Frame) -> Frame | None:
    """The loop directly inside ``loop`` that holds ``event``, if any."""
    return next((f for f in frames_inside(event, loop) if f.kind is FrameKind.LOOP), None)


def _range_count(loop: Frame) -> cst.BaseExpression | None:
    """``n`` for ``for _ in range(n)``."""
    node = loop.node
    if type(node) is cst.For and type(node.iter) is cst.Call and type(node.iter.func) is cst.Name:
        if node.iter.func.value == "range" and len(node.iter.args) == 1:
            return node.iter.args[0].value
    return None


def steps_with_loops(root: Root) -> Iterator[tuple[Event, Frame]]:
    """Each optimizer step of a root with its training loop (steps outside any such loop are skipped)."""
    for event in root.events:
        if event.kind is EventKind.STEP:
            loop = home_loop(root, event)
            if loop is not None:
                yield event, loop


def steps_after_loops(model: LoopModel, root: Root) -> Iterator[tuple[Event, Accumulation]]:
    """Each plain optimizer step outside any loop that follows a loop whose iterations backpropagate: a function run
    once per epoch or per task (``for b in loader: ...; loss.backward()`` then ``optimizer.step()``), with nothing
    writing the gradients between the loop and the step. The loop's micro-batches accumulate for that step.

    The last micro-batch may run after the loop, outside it (``for _ in range(accum - 1): ... backward()`` under
    ``no_sync()``, then one more forward and backward that all-reduces), when nothing clears between the loop and the
    step; the count is then ``accum``. The accumulation's backwards are the loop's: what runs on the micro-batches
    that do not step."""
    probes = probe_events(root)
    for step in root.events_of(EventKind.STEP):
        if step.loops or step.framework is not None or step.target is None:
            continue
        at = root.order(step)
        before = [
            b for b in root.events_of(EventKind.BACKWARD)
            if root.order(b) < at and id(b) not in probes and not split_by_setting(b, step)
        ]
        looped = [b for b in before if b.loops]
        if not looped:
            continue
        micro = looped[-1].loops[0]
        trailing = [b for b in before if root.order(b) > root.order(looped[-1])]
        if trailing and any(root.order(looped[-1]) < root.order(z) < at for z in root.events_of(EventKind.ZERO)):
            continue  # cleared after the loop: only what follows the clear reaches the step
        if root.events_of(EventKind.STEP, micro) or _gradients_written_after(model, micro.node, step.node):
            continue
        if _retry_loop(micro.node):
            continue  # its backward completes once; the iterations before it were retries it clears after
        count = _range_count(micro)
        if trailing:
            count = _one_more(count)
        yield step, Accumulation("micro_loop", micro, [b for b in before if b.inside(micro)], count, tuple(trailing))


def _one_more(count: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """``accum`` for a loop over ``range(accum - 1)`` followed by one more micro-batch; None when it cannot be said."""
    if type(count) is cst.BinaryOperation and type(count.operator) is cst.Subtract and number(count.right) == 1:
        return count.left
    return None


# A ``for`` header that says the loop runs over micro-batches.
_MICRO_LOOP_WORDS = re.compile(r"accum|micro|sub_?batch|chunk|split|shard", re.IGNORECASE)


def header_says_micro_batches(model: LoopModel, loop: cst.CSTNode) -> bool:
    """A ``for`` loop over ``range(accum_steps)``, ``batch.chunk(k)``, ``micro_batches``, ``subbatches``, ...: its
    header says it runs the micro-batches of one accumulation."""
    if type(loop) is not cst.For:
        return False
    return _MICRO_LOOP_WORDS.search(f"{model.code(loop.target)} in {model.code(loop.iter)}") is not None


def _retry_loop(loop: cst.CSTNode) -> bool:
    """A loop whose iteration that gets through ends it: its body ends with ``break``, or with a ``try`` whose body or
    ``else`` does (``while chunk_size: try: ...backward() except OOM: chunk_size //= 2 else: break``). It retries one
    pass until it succeeds; it is no loop of micro-batches."""
    body = getattr(getattr(loop, "body", None), "body", ())
    if not body:
        return False
    last = body[-1]
    if type(last) is cst.Try:
        return ends_with_break(last.body) or (last.orelse is not None and ends_with_break(last.orelse.body))
    return type(loop.body) is cst.IndentedBlock and ends_with_break(loop.body)


def ends_with_break(block: cst.BaseSuite) -> bool:
    """Whether a block's last statement is ``break``."""
    last = block.body[-1] if block.body else None
    if type(block) is cst.SimpleStatementSuite:
        return type(last) is cst.Break
    return type(last) is cst.SimpleStatementLine and type(last.body[-1]) is cst.Break


def _gradients_written_after(model: LoopModel, loop: cst.CSTNode, step: cst.CSTNode) -> bool:
    """Whether a statement between the end of ``loop`` and ``step`` in their block writes gradients (``p.grad = g``,
    ``p.grad.copy_(g)``): gradients gathered in the loop and set for the step, not accumulated by it."""
    parents = model.parents or {}
    block = parents.get(loop)
    if block is None:
        return True
    statements = list(getattr(block, "body", ()))
    position = next((i for i, s in enumerate(statements) if s is loop), None)
    if position is None:
        return True
    for statement in statements[position + 1:]:
        for node in model.file.walk(statement):
            if type(node) in (cst.Assign, cst.AugAssign):
                targets = [t.target for t in node.targets] if type(node) is cst.Assign else [node.target]
                if any(is_grad(t) for t in targets):
                    return True
            if type(node) is cst.Call and type(node.func) is cst.Attribute and is_grad(node.func.value):
                return True
        if lies_in(model, step, statement):
            break
    return False


def single_branch_guards(root: Root) -> Iterator[tuple[Event, Frame, Accumulation]]:
    """Each plain optimizer step under an accumulation guard that is a one-branch ``if`` (no ``else``, not leaving the
    iteration) with a backward before the step in the iteration: ``(step, loop, accumulation)``, one per guard. What a
    rule about the guard's own test reads (GL013, GL014)."""
    reported: set[int] = set()
    for step, loop in steps_with_loops(root):
        if step.framework is not None or step.target is None:
            continue
        acc = accumulation(root, step, loop)
        if acc is None or acc.style != "guard" or type(acc.frame.node) is not cst.If or id(acc.frame) in reported:
            continue
        guard = acc.frame
        if guard.branch != "if" or guard.exits or guard.node.orelse is not None:
            continue
        if not any(root.order(b) < root.order(step) for b in acc.backwards):
            continue  # the step closes the window that ended before this iteration's backward
        reported.add(id(guard))
        yield step, loop, acc


def _clears_another_model(model: LoopModel, zero: Event, optimizer: str | None) -> bool:
    """Whether a clear reaches a model the optimizer is known not to be built from.

    :func:`clears` assumes a clear of a model no optimizer claims reaches every
    optimizer, which keeps a missing clear from being reported; a clear reported
    as misplaced must reach the optimizer for sure (``p_bf16.grad = None`` over
    a bf16 copy, then a step of the fp32 model's optimizer).
    """
    if zero.target_kind is not ObjKind.MODEL or zero.target is None or optimizer is None:
        return False
    sources = param_sources(model, optimizer)
    parts = zero.target.split(".")
    return bool(sources) and parts[-1] not in sources and parts[0] not in sources and (len(parts) < 2 or parts[1] not in sources)


def masks_by_value(event: Event) -> bool:
    """Whether a manual zeroing runs, in a loop over parameters, under a test that orders a value computed from the
    parameter the loop walks (``g = p.grad.norm(); clip_coef = thresh / g; if clip_coef < 0.2: p.grad.mul_(0)``): a
    per-parameter clip that drops some gradients for the step to skip, not a clear; or that asks whether its values
    are finite (``if torch.isnan(p.grad).any():``): a repair. A test that the gradient exists (``if p.grad is not
    None:``) orders nothing."""
    if not event.manual:
        return False
    at = next((i for i in range(len(event.frames) - 1, -1, -1)
               if event.frames[i].kind is FrameKind.LOOP and type(event.frames[i].node) is cst.For), None)
    if at is None:
        return False
    loop = event.frames[at].node
    derived = names_in(loop.target)
    for node in walk(loop.body):
        if type(node) is cst.Assign and names_in(node.value) & derived:
            for target in node.targets:
                derived |= {n.value for n in walk(target.target) if type(n) is cst.Name}
    for frame in event.frames[at + 1:]:  # the branches inside the innermost loop
        if frame.kind is not FrameKind.BRANCH or type(frame.node) is not cst.If:
            continue
        for node in walk(frame.node.test):
            if type(node) is cst.Comparison and any(
                type(c.operator) in (cst.LessThan, cst.GreaterThan, cst.LessThanEqual, cst.GreaterThanEqual)
                for c in node.comparisons
            ) and names_in(node) & derived:
                return True
            if type(node) is cst.Call and callee_name(node) in _NON_FINITE_TESTS and names_in(node) & derived:
                return True  # ``if torch.isnan(p.grad).any(): p.grad = torch.zeros_like(p.grad)``: a repair
    return False


# Tests of whether a tensor holds values that are not finite: a zeroing under one repairs those gradients.
_NON_FINITE_TESTS = frozenset({"isnan", "isinf", "isfinite", "isneginf", "isposinf"})


def names_in(node: cst.CSTNode) -> set[str]:
    """The plain names spelled in ``node``."""
    return {each.value for each in walk(node) if type(each) is cst.Name}


def _clears_picked_parameters(model: LoopModel, zero: Event) -> bool:
    """``for name, p in model.named_parameters(): if "prototypes" in name: p.grad = None``: a test on the loop's
    own variables picks which gradients to drop (parameters frozen for some iterations, non-finite gradients), or the
    loop walks a collection picked elsewhere (``for p in actor_params: p.grad = None``, the critic's step then
    applies only the value head's gradients): dropping them before the step is the point."""
    node = zero.node
    if not zero.manual or type(node) is not cst.Assign:
        return False
    holder = node.targets[0].target
    while type(holder) is cst.Attribute:
        holder = holder.value
    if type(holder) is not cst.Name:
        return False
    for position, frame in enumerate(zero.frames):
        if frame.kind is not FrameKind.LOOP or type(frame.node) is not cst.For:
            continue
        bound = {n.value for n in walk(frame.node.target) if type(n) is cst.Name}
        if holder.value not in bound:
            continue
        return any(
            f.kind is FrameKind.BRANCH and type(f.node) is cst.If
            and any(type(n) is cst.Name and n.value in bound for n in walk(f.node.test))
            for f in zero.frames[position + 1 :]
        ) or not walks_every_parameter(model, frame.node)
    return False


def walks_every_parameter(model: LoopModel, loop: cst.For) -> bool:
    """Whether a loop visibly walks all of a network's parameters: ``model.parameters()``, ``list(...)`` of them, a
    ``zip`` or ``enumerate`` of those, or a name the loop's function binds only to those. Any other collection (a
    helper's pick, ``actor_params`` without the value head's parameters) may hold some of them only."""

    def whole(value: cst.BaseExpression) -> bool:
        if type(value) is cst.Call and callee_name(value) in ("list", "tuple", "enumerate") and value.args:
            value = value.args[0].value
        if type(value) is cst.Call and callee_name(value) == "zip":  # ``zip(master.parameters(), model.parameters())``
            return bool(value.args) and all(whole(a.value) for a in value.args)
        return type(value) is cst.Call and callee_name(value) in ("parameters", "named_parameters") and type(value.func) is cst.Attribute

    if whole(loop.iter):
        return True
    name = dotted_name(loop.iter)
    if name is None or model.index is None:
        return False
    values = model.index.assignments.get(function_holding(model, loop), {}).get(name, [])
    return bool(values) and all(isinstance(v, cst.BaseExpression) and whole(v) for v in values)


def clears_between_backward_and_step(
    model: LoopModel, events: list[Event], probes: frozenset[int] = frozenset()
) -> Iterator[tuple[Event, Event, Event]]:
    """``(backward, zero, step)`` where a clear of the step's optimizer falls between its backward and the step
    (a probe's backward and its own clear, :func:`probe_events`, left out).

    A step's backward is the last one before it that can run on the same pass: one in the other branch of an ``if``
    (``if sam: ...; loss_2.backward(); opt.second_step() else: opt.step()``) does not hide the earlier backward
    whose gradients the ``else`` step takes."""
    position: dict[int, int] = {}
    backwards: list[Event] = []
    zeros: list[Event] = []
    stepped: dict[int, set[str | None]] = {}  # per backward: optimizers that already stepped on its gradients
    for at, event in enumerate(events):
        if id(event) in probes:
            continue
        position[id(event)] = at
        if event.kind is EventKind.BACKWARD:
            backwards.append(event)
            stepped[id(event)] = set()
        elif event.kind is EventKind.ZERO and backwards:
            zeros.append(event)
        elif event.kind is EventKind.STEP and backwards:
            owner = next((b for b in reversed(backwards) if not exclusive(b, event)), None)
            if event.framework == "closure":  # the step takes the gradients of its closure's backward, if any
                closure = closure_of(model, event.node) if type(event.node) is cst.Call else None
                inside = [b for b in backwards if closure is not None and lies_under(model.parents or {}, b.node, closure)]
                owner = inside[-1] if inside else None
            if owner is None or event.target in stepped[id(owner)]:
                continue  # a later step of the same optimizer does not own the backward's gradients
            for zero in zeros:
                if (
                    position[id(zero)] > position[id(owner)]
                    and clears(model, zero, event.target)
                    and not exclusive(zero, event)
                    and not leaves_before(zero, event)
                    and not _clears_another_model(model, zero, event.target)
                    and not _clears_picked_parameters(model, zero)
                    and not masks_by_value(zero)
                    and not discards_update(model, zero, event)
                    and not _skips_and_leaves(zero, event)
                    and not _gradients_written_after_clear(model, zero, event)
                ):
                    yield owner, zero, event
            stepped[id(owner)].add(event.target)


_GRAD_CLEARS = frozenset({"zeros_like", "zeros", "torch.zeros_like", "torch.zeros"})


def _gradients_written_after_clear(model: LoopModel, zero: Event, step: Event) -> bool:
    """Whether gradients are written by hand after the clear and before the step, in the function that clears (``p.grad
    = torch.autograd.grad(loss, p)[0]``, ``p.grad.data.add_(ref - p.data)``): the clear makes room for a gradient
    computed another way (Reptile's meta-gradient, a quantum circuit's estimate), which the step then applies."""
    function = function_holding(model, zero.node)
    after = model.line(zero.node)
    until = model.line(step.node) if function_holding(model, step.node) is function else None
    if function is None and until is None:
        return False  # a module-level clear: only what runs between it and a module-level step counts
    for node in model.file.every_node(function if function is not None else model.file.module):
        kind = type(node)
        written = None
        if kind is cst.Assign and not (type(node.value) is cst.Name and node.value.value == "None") and not (
            type(node.value) is cst.Call and callee_name(node.value) in _GRAD_CLEARS
        ):
            written = next((t.target for t in node.targets if is_grad(t.target)), None)
        elif kind is cst.AugAssign and type(node.operator) is cst.AddAssign and is_grad(node.target):
            written = node.target
        elif kind is cst.Call and writes_grad_in_place(node):
            written = node
        if written is not None and model.line(written) > after and (until is None or model.line(written) < until):
            return True
    return False


def _skips_and_leaves(zero: Event, step: Event) -> bool:
    """Whether the clear and the step share a branch that leaves the iteration (``if norm > limit and skip: opt.zero_grad();
    scaler.step(opt); scaler.update(); continue``): the gradients are dropped on purpose, the step on zeros only closes
    the scaler's state, and the iteration is retried or ends."""
    shared = [f for f in zero.frames if f.kind is FrameKind.BRANCH and any(g is f for g in step.frames)]
    return bool(shared) and shared[-1].exits


# Words of a flag that says the update is to be thrown away: ``if ignore_grad:``, ``if skip_step:``, ``if found_nan:``.
_DISCARD_WORDS = frozenset({
    "skip", "skipped", "ignore", "ignored", "discard", "drop", "nan", "inf", "isnan", "isinf", "nonfinite",
    "overflow", "spike", "invalid", "bad", "unstable",
})
# A value of this batch that a test may find wrong: the loss, a gradient norm.
_BATCH_VALUE = re.compile(r"loss|norm|grad", re.IGNORECASE)
_CHECKS_FINITE = frozenset({"isfinite", "isnan", "isinf"})


def discards_update(model: LoopModel, zero: Event, step: Event) -> bool:
    """Whether a clear between a backward and a step throws the update away on purpose: it sits under an ``if`` the
    step does not share whose test is a flag saying so (``if ignore_grad:``, ``if skip_step:``) or a check of this
    batch's loss or gradient norm (``if loss > ema * threshold:``, ``if not torch.isfinite(loss):``, a spike; not a
    test of a setting, ``if args.grad_accum > 1:``). The
    step then applies nothing, or does not run (``if not skip_step: opt.step()``), which is the point."""
    shared = {id(f.node) for f in step.frames if f.kind is FrameKind.BRANCH}
    for frame in zero.frames:
        if frame.kind is not FrameKind.BRANCH or frame.branch != "if" or id(frame.node) in shared:
            continue
        test = frame.node.test
        names = [dotted_name(n) or "" for n in walk(test) if type(n) in (cst.Name, cst.Attribute)]
        names += _string_keys(test)  # a flag kept in a dict: ``if stats["skip_example"]:``
        if any(_DISCARD_WORDS.intersection(last_name(n).lower().split("_")) for n in names if n):
            return True
        for node in walk(test):
            if type(node) is cst.Call and callee_name(node) in _CHECKS_FINITE:
                return True
            if _is_nan_check(node):
                return True
            if type(node) is cst.Comparison and any(
                type(c.operator) in (cst.GreaterThan, cst.GreaterThanEqual, cst.LessThan, cst.LessThanEqual)
                for c in node.comparisons
            ) and any(_BATCH_VALUE.search(last_name(n)) for n in names if n) and (
                not _is_setting(node) or _assigned_where_tested(model, frame.node, [node])
            ):
                return True  # a value of this batch, not a setting compared with a literal
    return False


def _is_nan_check(node: cst.CSTNode) -> bool:
    """``loss != loss``: only a NaN differs from itself."""
    return (
        type(node) is cst.Comparison and len(node.comparisons) == 1
        and type(node.comparisons[0].operator) is cst.NotEqual
        and type(node.left) in (cst.Name, cst.Attribute) and node.left.deep_equals(node.comparisons[0].comparator)
    )


def _string_keys(test: cst.BaseExpression) -> list[str]:
    """The string keys ``test`` indexes with (``stats["skip_example"]`` → ``skip_example``)."""
    return [
        element.slice.value.raw_value for node in walk(test) if type(node) is cst.Subscript
        for element in node.slice
        if type(element.slice) is cst.Index and type(element.slice.value) is cst.SimpleString
    ]


def exclusive(a: Event, b: Event) -> bool:
    """Whether two events sit in different branches of one ``if``: no single pass runs both."""
    branches = {id(f.node): f.branch for f in a.frames if f.kind is FrameKind.BRANCH}
    return any(f.kind is FrameKind.BRANCH and branches.get(id(f.node), f.branch) != f.branch for f in b.frames)


def split_by_setting(a: Event, b: Event) -> bool:
    """Whether two events sit in different branches of an ``if`` on a setting (``if accum_steps > 1:``).

    Unlike other branches, those never alternate between batches: gradients
    from one never meet a step in the other.
    """
    branches = {id(f.node): f.branch for f in a.frames if f.kind is FrameKind.BRANCH and f.fixed}
    if any(f.kind is FrameKind.BRANCH and f.fixed and branches.get(id(f.node), f.branch) != f.branch for f in b.frames):
        return True
    # two ``if``s on one setting: ``if accum_steps == 1: opt.zero_grad()`` ... ``if accum_steps > 1: ... opt.step()``
    sides = dict(f.accumulation_on for f in a.frames if f.accumulation_on is not None)
    return any(f.accumulation_on is not None and sides.get(f.accumulation_on[0], f.accumulation_on[1]) != f.accumulation_on[1] for f in b.frames)


def opposite_sides_of_settings(model: LoopModel, a: Event, b: Event) -> bool:
    """Whether one event runs only where every term of a test on settings holds, and the other only in its ``else``.

    ``if args.fp16: if args.amp == "pytorch": scaler.scale(loss).backward()``
    in a helper and ``if args.fp16 and args.amp == "pytorch": scaler.step(opt)
    else: opt.step()`` in the loop never meet, though no ``if`` holds both.
    Only tests made of settings count: names and attribute chains, negated
    or compared with constants (``args.amp == "pytorch"``, ``not self.fp16``,
    ``scaler is not None``), none of them assigned in the function the test
    sits in; a test that calls, indexes or computes may change between the two.
    """
    holds_a, fails_a = _setting_sides(model, a)
    holds_b, fails_b = _setting_sides(model, b)
    return any(test <= holds_b for test in fails_a) or any(test <= holds_a for test in fails_b)


def _setting_sides(model: LoopModel, event: Event) -> tuple[set[str], list[frozenset[str]]]:
    """The setting terms that hold wherever ``event`` runs, and the tests (as sets of terms) whose ``else`` it is in."""
    holds: set[str] = set()
    fails: list[frozenset[str]] = []
    for frame in event.frames:
        if frame.kind is not FrameKind.BRANCH or type(frame.node) is not cst.If:
            continue
        terms = boolean_terms(frame.node.test, cst.And)
        if not all(_is_setting(term) for term in terms) or _assigned_where_tested(model, frame.node, terms):
            continue
        written = frozenset(model.code(term) for term in terms)
        if frame.branch == "if":
            holds |= written
        elif frame.branch == "else":
            fails.append(written)
    return holds, fails


def setting_values(model: LoopModel, node: cst.CSTNode, loop: cst.CSTNode | None = None) -> dict[str, bool]:
    """What the settings tested by the ``if``s around ``node`` are wherever it runs: ``{"configs.only_eval": True}``
    in the body of ``if configs.only_eval:``, ``False`` in its ``else`` or in the body of ``if not
    configs.only_eval:``. Only single-term tests of settings (:func:`_is_setting`) assigned at most once in the
    function (a configuration read once into a local), or, given the ``loop`` both run in, assigned only outside it
    (fixed for one iteration: ``amp = cfg["amp"]``, then ``model, amp, device = to_device(model, amp)`` before the
    loop), and each term of an ``and`` whose body holds the node."""
    parents = model.parents or {}
    values: dict[str, bool] = {}
    child, current = node, parents.get(node)
    while current is not None:
        if type(current) is cst.If and child is not current.test:
            in_body = child is current.body
            terms = boolean_terms(current.test, cst.And)
            if (in_body or len(terms) == 1) and all(_is_setting(t) for t in terms) and not _assigned_where_tested(
                model, current, terms, once=True, outside=loop,
            ):
                for term in terms:
                    holds = in_body
                    while type(term) is cst.UnaryOperation and type(term.operator) is cst.Not:
                        term, holds = term.expression, not holds
                    values.setdefault(model.code(term), holds)
        child, current = current, parents.get(current)
    return values


def contradicting_settings(model: LoopModel, a: cst.CSTNode, b: cst.CSTNode, loop: cst.CSTNode | None = None) -> bool:
    """Whether ``a`` and ``b`` run under opposite values of one setting (:func:`setting_values`): they never meet (in
    one iteration of ``loop``, when given)."""
    values_a, values_b = setting_values(model, a, loop), setting_values(model, b, loop)
    return any(values_b.get(term, value) != value for term, value in values_a.items())


def _is_setting(term: cst.BaseExpression) -> bool:
    """``args.fp16``, ``not use_amp``, ``cfg.amp == "apex"``, ``scaler is not None``: a read of configuration."""
    if type(term) is cst.UnaryOperation and type(term.operator) is cst.Not:
        return _is_setting(term.expression)
    if type(term) is cst.Comparison:
        return _is_setting_read(term.left) and all(
            type(c.comparator) in (cst.SimpleString, cst.Integer, cst.Float) or (type(c.comparator) is cst.Name and c.comparator.value in ("None", "True", "False"))
            for c in term.comparisons
        )
    return _is_setting_read(term)


def _is_setting_read(node: cst.BaseExpression) -> bool:
    return type(node) in (cst.Name, cst.Attribute) and dotted_name(node) is not None


def _assigned_where_tested(
    model: LoopModel, test: cst.If, terms: list[cst.BaseExpression], once: bool = False, outside: cst.CSTNode | None = None,
) -> bool:
    """Whether a name the test reads is assigned in the function holding it (more than once at module level, or
    with ``once``, anywhere: a configuration read once into a local is still fixed; with ``outside``, a loop, a name
    no assignment of which lies inside the loop is fixed too)."""
    if model.index is None:
        return True
    function = function_holding(model, test)
    table = model.index.assignments.get(function, {})
    allowed = 1 if function is None or once else 0
    for term in terms:
        for node in walk(term):
            name = dotted_name(node) if type(node) in (cst.Name, cst.Attribute) else None
            if name is None:
                continue
            values = table.get(name, ())
            if outside is not None:
                # an unpacked element (``model, amp, device = to_device(...)``) lies where its call does
                nodes = [v if isinstance(v, cst.CSTNode) else getattr(v, "value", None) for v in values]
                inside = [n for n in nodes if n is None or lies_in(model, n, outside)]
                if not inside:
                    continue
            if len(values) > allowed:
                return True
    return False


def backwards_reaching(
    events: list[Event], event: Event, stop: Callable[[Event], bool] = lambda e: False, *, position: int | None = None
) -> list[Event]:
    """The backwards whose gradients ``event`` may see, latest first.

    Reading back from ``event``: a backward in the other branch of an ``if``
    never reaches it, and a backward hides every earlier one that runs on the
    same path (``if fp16: scaled backward / else: plain backward`` reaches a
    later clip through both). The reading ends at the first event for which
    ``stop`` holds, such as an ``unscale_``. ``position``, when the caller
    knows it, is where ``event`` is in ``events``.
    """
    if position is None:
        position = next(i for i, e in enumerate(events) if e is event)
    found: list[Event] = []
    for earlier in (events[i] for i in range(position - 1, -1, -1)):
        if stop(earlier):
            break
        if earlier.kind is not EventKind.BACKWARD or exclusive(earlier, event):
            continue
        if all(exclusive(later, earlier) for later in found):
            found.append(earlier)
    return found


def stepping_loop(root: Root, backward: Event) -> Frame | None:
    """The loop a backward trains in: its innermost loop that also steps an optimizer (the outer loop of micro-steps)."""
    for loop in reversed(backward.loops):
        if EventKind.STEP in root.kinds_in(loop):
            return loop
    return None


def leaves_before(event: Event, later: Event) -> bool:
    """Whether ``event`` sits in a branch that leaves (``continue``, ``break``, ...) without reaching ``later``.

    ``if not finite: opt.zero_grad(); continue`` clears only on the batches that never step.
    """
    return any(f.kind is FrameKind.BRANCH and f.exits and not later.inside(f) for f in event.frames)


def rebuilt_in(model: LoopModel, loop: Frame, name: str | None, step: Event | None = None) -> bool:
    """Whether ``name`` is assigned anew inside ``loop`` on every iteration, or in the helper the loop calls that steps
    it: an optimizer built per iteration starts clean each time. One rebuilt under an ``if`` that ``step`` is not under too (``if it == switch_point: opt =
    Adam(...)``, a new phase) serves many iterations."""
    if name is None:
        return False
    bodies: list[tuple[cst.CSTNode, cst.CSTNode]] = [(loop.node, loop.node.body)]
    if step is not None and step.call_chain and lies_in(model, step.call_chain[0], loop.node):
        # a helper the loop calls, which builds the optimizer it steps (``optim = optim_config.build(model)``)
        function = function_holding(model, step.node)
        if function is not None:
            bodies.append((function, function.body))
    for outer, body in bodies:
        for node in model.file.walk(body):
            if type(node) is cst.Assign and any(dotted_name(t.target) == name for t in node.targets):
                value = node.value
            elif type(node) is cst.AnnAssign and dotted_name(node.target) == name:
                value = node.value
            else:
                continue
            if (loop.called_by is not None or outer is not loop.node) and _fetches_optimizer(value):
                continue  # a step function fetching the one optimizer it steps (``opt = self.optimizers()``)
            if outer is not loop.node and not _builds(value):
                continue  # ``opt = self.get_optimizer()`` in a helper: may hand back the same optimizer every call
            if _under_if_within(model, node, outer, step.node if step is not None else None):
                continue
            return True
    return False


def _under_if_within(model: LoopModel, node: cst.CSTNode, outer: cst.CSTNode, beside: cst.CSTNode | None = None) -> bool:
    """Whether ``node`` sits in a branch of an ``if`` written inside ``outer`` that does not also hold ``beside``."""
    parents = model.parents or {}
    node = parents.get(node)
    while node is not None and node is not outer:
        if type(node) is cst.If and (beside is None or not lies_in(model, beside, node)):
            return True
        node = parents.get(node)
    return False


_BUILDING_CALL = re.compile(r"^[A-Z]|build|create|make|^new|^init")


def _builds(value: cst.BaseExpression | None) -> bool:
    """``Adam(...)``, ``optim_config.build(model)``, ``create_optimizer(...)``: a call that makes a new object."""
    name = callee_name(value) if type(value) is cst.Call else None
    return name is not None and _BUILDING_CALL.search(name) is not None


def _fetches_optimizer(value: cst.BaseExpression | None) -> bool:
    """``self.optimizer``, ``self.optimizers()``, ``self.optimizers()[0]``: the existing optimizer, not a new one."""
    if type(value) is cst.Subscript:
        value = value.value
    if type(value) is cst.Call and callee_name(value) == "optimizers":
        return True
    return type(value) in (cst.Name, cst.Attribute)


def with_holding(model: LoopModel, node: cst.CSTNode) -> cst.With | None:
    """The ``with`` statement whose item holds ``node`` (a call); None when it is not a ``with`` item."""
    parents = model.parents
    if parents is None or type(node) is not cst.Call:
        return None
    current = parents.get(node)
    while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.BaseCompoundStatement, cst.SimpleStatementLine)):
        if type(current) is cst.WithItem:
            block = parents.get(current)
            return block if type(block) is cst.With else None
        current = parents.get(current)
    return None


def blocks_entering(model: LoopModel, call: cst.Call) -> list[cst.With]:
    """The ``with`` blocks that enter a context a call makes: the one whose item holds the call, or those of the same
    function entering the name the call is bound to (``ctx = model.no_sync() if not step else nullcontext()``,
    ``context = nullcontext() if final else torch.cuda.amp.autocast()``, then ``with ctx:``)."""
    block = with_holding(model, call)
    if block is not None:
        return [block]
    parents = model.parents or {}
    node = parents.get(call)
    while type(node) is cst.IfExp:
        node = parents.get(node)
    if type(node) is not cst.Assign or len(node.targets) != 1:
        return []
    name = dotted_name(node.targets[0].target)
    scope = parents.get(node)
    while scope is not None and type(scope) not in (cst.FunctionDef, cst.Module):
        scope = parents.get(scope)
    if name is None or scope is None:
        return []
    return [n for n in model.file.walk(scope) if type(n) is cst.With and any(dotted_name(item.item) == name for item in n.items)]


def branch_sides(model: LoopModel, node: cst.CSTNode, function: cst.FunctionDef | None) -> list[tuple[str, bool]]:
    """The ``if`` tests around a node within its function, as written, each with whether the node is in its body."""
    parents = model.parents or {}
    sides: list[tuple[str, bool]] = []
    child, current = node, parents.get(node)
    while current is not None and current is not function:
        if type(current) is cst.If and child is not current.test:
            sides.append((model.code(current.test), child is current.body))
        child, current = current, parents.get(current)
    return sides


def closure_of(model: LoopModel, call: cst.Call) -> cst.FunctionDef | cst.Lambda | None:
    """The closure a ``step`` call is handed: a lambda, or a function of the module by name (``opt.step(closure)``,
    ``opt.step(closure=f)``, ``scaler.step(opt, closure=f)``)."""
    given = keyword_arg(call, "closure")
    if given is None and method_name(call) == "step" and type(call.func) is cst.Attribute:
        given = next(iter(positional_args(call)), None)
    if given is None:
        return None
    if type(given.value) is cst.Lambda:
        return given.value
    if type(given.value) is cst.Name and model.index is not None:
        return model.index.resolve_function(cst.Call(func=given.value), function_holding(model, call))
    return None


def function_holding(model: LoopModel, node: cst.CSTNode) -> cst.FunctionDef | None:
    """The innermost function whose body holds ``node`` (read up the module index's parents), or None at module level."""
    parents = model.parents or {}
    current = parents.get(node)
    while current is not None and type(current) is not cst.FunctionDef:
        current = parents.get(current)
    return current


def probe_events(root: Root) -> frozenset[int]:
    """The ids of the backwards, and of the clears after them, of probes: a helper that backpropagates, reads the
    gradients and clears them before returning, stepping nothing (``loss.backward(); norms = [p.grad.norm() ...];
    model.zero_grad()``, run once to measure). Its gradients never reach a step: none of the loop's rules about
    what a backward leaves for the step (scaling, clearing, accumulation, all-reduce) concerns it."""
    if root._probes is None:
        found: set[int] = set()
        by_call: dict[tuple[int, ...], list[Event]] = {}
        for event in root.events:
            if event.call_chain:
                by_call.setdefault(tuple(id(c) for c in event.call_chain), []).append(event)
        for events in by_call.values():
            if any(e.kind in (EventKind.STEP, HANDOFF) for e in events):
                continue
            for position, event in enumerate(events):
                if event.kind is not EventKind.BACKWARD:
                    continue
                after = next((e for e in events[position + 1:] if e.kind in (EventKind.BACKWARD, EventKind.ZERO)), None)
                if after is not None and after.kind is EventKind.ZERO and not exclusive(after, event) and not leaves_before(event, after):
                    found.update((id(event), id(after)))
        root._probes = frozenset(found)
    return root._probes


def calls_unseen_inherited_method(model: LoopModel, step: Event, loop: Frame) -> bool:
    """Whether the loop calls a method of ``self`` that no class of this module defines, on a class deriving from a class
    of another module (torch's aside): that inherited method cannot be read here, and it may clear or step ``self``'s optimizer
    (habitat-lab's ``HRLPPO._update_from_batch`` calls ``self._set_grads_to_none()``, which its base ``PPO``, in
    another file, defines as ``p.grad = None`` over the optimizer's parameters)."""
    index = model.index
    if index is None or not (step.target or "").startswith("self."):
        return False
    method = index.method_holding(function_holding(model, step.node))
    owner = index.class_of.get(method) if method is not None else None
    if owner is None or not _derives_from_another_module(model, owner):
        return False
    for node in walk(loop.node):
        if type(node) is cst.Call and type(node.func) is cst.Attribute and type(node.func.value) is cst.Name:
            name = node.func.attr.value
            if node.func.value.value == "self" and index.method_of(owner, name) is None:
                if index.assigned_anywhere(f"self.{name}") or name in _attributes_used_as_objects(model):
                    continue  # ``self.model = ...`` or ``self.model.train()``: an object held, no method
                if _under_periodic_test(model, node, loop.node, step.node):
                    continue  # ``if (n + 1) % eval_every == 0: self._save_checkpoint(...)``: not on every step's path
                return True
    return False


def _attributes_used_as_objects(model: LoopModel) -> frozenset[str]:
    """The attributes of ``self`` the module reads attributes of (``self.model.train()``, ``self.model.parameters()``):
    objects the instance holds, set by a base class maybe, not methods it inherits."""

    def read() -> frozenset[str]:
        return frozenset(
            node.value.attr.value
            for node in model.file.every_node(model.module)
            if type(node) is cst.Attribute and type(node.value) is cst.Attribute
            and type(node.value.value) is cst.Name and node.value.value.value == "self"
        )

    return model.file.once((_attributes_used_as_objects,), read)


def _under_periodic_test(model: LoopModel, node: cst.CSTNode, loop: cst.CSTNode, step: cst.CSTNode) -> bool:
    """Whether ``node`` runs only under an ``if`` of the loop that takes a remainder (``if i % interval == 0:``) and
    does not hold the step: it runs on some iterations only, so what it does cannot serve every step."""
    parents = model.parents or {}
    current = parents.get(node)
    while current is not None and current is not loop:
        if type(current) is cst.If and any(
            type(n) is cst.BinaryOperation and type(n.operator) is cst.Modulo for n in walk(current.test)
        ) and not lies_in(model, step, current):
            return True
        current = parents.get(current)
    return False


def _derives_from_another_module(model: LoopModel, class_name: str) -> bool:
    """Whether a class of this module has, among its bases and theirs in this module, one this module does not define and
    torch does not (``torch.nn.Module``'s methods are known: only ``zero_grad`` clears, and it is read as a clear)."""
    index = model.index
    classes = {c.name.value: c for c in index.module.body if type(c) is cst.ClassDef}
    seen: set[str] = set()
    pending = [class_name]
    while pending:
        current = pending.pop()
        if current in seen or current not in classes:
            continue
        seen.add(current)
        for argument in classes[current].bases:
            base = dotted_name(argument.value)
            if base is None or base == "object":
                continue
            if base in classes:
                pending.append(base)
            elif not any(q == "torch" or q.startswith("torch.") for q in index.qualified_names(argument.value)):
                return True
    return False
