"""The event builder: statements of a module turned into the ordered events of each root, helpers inlined."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Collection, Iterator, Sequence

import libcst as cst

from gradlint import frameworks
from gradlint.events import EventKind
from gradlint.model import GRAD_DIVIDE, GRAD_READ, HANDOFF, NO_SYNC, Event, Frame, FrameKind, Kind
from gradlint.module_index import ModuleIndex, Unpacked
from gradlint.objects import ObjKind, kind_from_name, last_name
from gradlint.project_index import BackwardHelper
from gradlint.queries import CLEAR_WORDS, handoff_may_step
from gradlint.syntax import (
    SCALING_CALLS,
    bind_arguments,
    bool_literal,
    boolean_terms,
    callee_name,
    contains_division,
    dotted_name,
    element_name,
    is_grad,
    tracked_name,
    keyword_arg,
    leaves_block,
    lies_under,
    method_name,
    number,
    positional_args,
    receiver,
    root_name,
    scales_down,
    walk,
)


# How deep helper calls are followed, and how many events one root may hold.
MAX_INLINE_DEPTH = 4
MAX_ROOT_EVENTS = 5000


# Words that mark a branch test as "this micro-batch steps": accumulation guards.
_ACCUMULATION_WORDS = re.compile(
    r"accum|sync_grad|grad(ient)?_?step|boundary|should_step|do_step|is_last_micro|optimi[sz]er_step|update_step|"
    r"take_step|step_now|is_accumulating",
    re.IGNORECASE,
)
# The last part of a counter's name that says "micro-batches since the last step": ``acc_step``, ``accum_iter``.
_ACCUMULATION_COUNTER = re.compile(r"^(grad_)?acc(um(ulation|ulated)?)?_?(step|iter|count|idx|counter)$", re.IGNORECASE)
_LOSS_NAME = re.compile(r"loss", re.IGNORECASE)
_CLIP_FUNCTIONS = {"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"}
# Clipping functions known by their qualified name, whatever the file calls them (``from timm.utils.agc import
# adaptive_clip_grad as clip_``): timm's adaptive clipping writes the clipped values into ``p.grad`` in place
# (``p.grad.detach().copy_(new_grads)``), and its dispatcher calls one of torch's clips or that.
_CLIP_QUALIFIED = frozenset({
    "timm.utils.agc.adaptive_clip_grad", "timm.utils.adaptive_clip_grad",
    "timm.utils.clip_grad.dispatch_clip_grad", "timm.utils.dispatch_clip_grad",
})
# A call that times or profiles the function it is handed, running it once: ``gpu_timer(train_step)``.
_TIMER = re.compile(r"(^|_)(gpu_)?tim(er|ed|e_it|eit)$|^profiled?$|^measure(_time)?$", re.IGNORECASE)
# What a method of an optimizer that clears its gradients under another name says (with "grad"): ``set_grads_none``.
_NAMED_CLEAR = re.compile(r"zero|clear|reset|none", re.IGNORECASE)
_CLEAR_HELPER = re.compile(r"(zero|clear|reset)_?grad", re.IGNORECASE)


@dataclasses.dataclass
class _Scope:
    """Where the builder is: which function, inside which frames, through which helper calls."""

    function: cst.FunctionDef | None
    frames: tuple[Frame, ...]
    depth: int
    stack: tuple[cst.FunctionDef, ...]
    chain: tuple[cst.Call, ...]
    self_class: str | None = None  # the class ``self`` is an instance of: the root's method's, through ``self.`` calls


class EventBuilder:
    """Turns statements into events, inlining helpers of the same module."""

    def __init__(
        self, index: ModuleIndex, steps_handed: frozenset[str] = frozenset(), wrapper_classes: frozenset[str] = frozenset(),
        backward_helpers: dict[str, BackwardHelper] | None = None, grad_readers: frozenset[str] = frozenset(),
    ) -> None:
        self.index = index
        self.grad_readers = grad_readers  # functions of other files of the run that read a handed model's gradients
        # names of other files' helpers that backpropagate the loss handed to them and step under a flag (``loss_scaler``)
        self.backward_helpers = backward_helpers or {}
        # Walks of the module's own nodes read the children the index read.
        self._walk, self._children = index.file.walk, index.file.children
        self.steps_handed = steps_handed  # functions of other files of the run that step the optimizer handed to them
        self.wrapper_classes = wrapper_classes  # classes of other files of the run whose step() and zero_grad() are an optimizer's
        self._summaries: dict[tuple[cst.FunctionDef, int], list[Event]] = {}
        # Each branch test is judged once: a helper inlined at several depths, or read
        # again through an assignment (``flag = (i + 1) % k == 0``), asks the same question.
        self._guards: dict[tuple[int, int, int], tuple[bool, cst.BaseExpression | None]] = {}
        # Per function: the counts its accumulation guards divide by (``batches % update_interval``); complete once
        # ``_counts_of_guards`` has judged every ``if`` of the function
        self._guard_counts: dict[int, set[str]] = {}
        self._guards_read: set[int] = set()
        self._flushes: dict[tuple[int, int], bool] = {}  # (if, function) -> read as a flush after an ended loop
        # Whether assigned values are worth searching for an uncalled ``model.no_sync``.
        self._may_hold_no_sync = index.text is None or any(method in index.text for method in frameworks.MODEL_NO_SYNC)
        self._switches: dict[tuple[int, int], bool] = {}
        self._factors: dict[int, frozenset[str]] = {}  # the dotted names multiplied in each assigned value
        self._counted: dict[int, frozenset[str]] = {}  # the names each body counts (``n += 1``, ``n = 0``)
        self._hand_clips: dict[cst.FunctionDef, bool] = {}
        self._no_count_divisions: dict[tuple[int, str], bool] = {}
        self._running: dict[int, frozenset[str]] = {}  # each function's running micro-batch counters
        self._wrappers: dict[str, bool] = {}
        self._holders: dict[str, str | None] = {}  # ``_optimizer_held_by``, once per name
        self._stepped_on_every_path: dict[int, frozenset[str]] = {}  # per ``if`` chain: the optimizers each path steps

    def root_events(self, function: cst.FunctionDef | None) -> list[Event]:
        """The events of the module body (``None``) or of one function, helpers inlined."""
        if function is None:
            scope = _Scope(None, (), 0, (), ())
            events: list[Event] = []
            self._block(self.index.module.body, scope, events)
            return events
        return self._summary(function, depth=0, stack=())

    def _summary(
        self, function: cst.FunctionDef, depth: int, stack: tuple[cst.FunctionDef, ...], self_class: str | None = None
    ) -> list[Event]:
        """A function's events, computed once per inlining depth (deeper copies see fewer nested helpers) and per
        class of ``self`` (a base class's method inlined into a subclass's calls the subclass's overrides)."""
        method = self.index.method_holding(function)
        self_class = self_class or (self.index.class_of.get(method) if method is not None else None)
        key = (function, depth, self_class)
        if key in self._summaries:
            return self._summaries[key]
        events: list[Event] = []
        scope = _Scope(function, (), depth, stack + (function,), (), self_class)
        self._block(_body(function.body), scope, events)
        self._summaries[key] = events
        return events

    # -- statements

    def _block(self, statements: Sequence[cst.CSTNode], scope: _Scope, out: list[Event]) -> None:
        frames = scope.frames
        for statement in statements:
            inner = dataclasses.replace(scope, frames=frames)
            self._statement(statement, inner, out)
            if len(out) > MAX_ROOT_EVENTS:
                return
            guard = self._continue_guard(statement, scope.function)
            if guard is not None:
                frames = frames + (guard,)

    def _statement(self, statement: cst.CSTNode, scope: _Scope, out: list[Event]) -> None:
        if type(statement) is cst.SimpleStatementLine:
            for small in statement.body:
                self._simple(small, scope, out)
        elif isinstance(statement, cst.BaseSmallStatement):  # from a one-line suite: ``if cond: opt.zero_grad()``
            self._simple(statement, scope, out)
        elif type(statement) is cst.If:
            self._if(statement, scope, out)
        elif type(statement) in (cst.For, cst.While):
            head = statement.iter if type(statement) is cst.For else statement.test
            self._expression(head, scope, out)
            loop = Frame(FrameKind.LOOP, statement)
            self._block(_body(statement.body), _within(scope, loop), out)
            if statement.orelse is not None:
                self._block(_body(statement.orelse.body), scope, out)
        elif type(statement) is cst.With:
            frames = scope.frames
            for item in statement.items:
                self._expression(item.item, scope, out)
                context = self._with_context(item.item)
                if context is not None:
                    frames = frames + (Frame(FrameKind.WITH, statement, context=context),)
            self._block(_body(statement.body), dataclasses.replace(scope, frames=frames), out)
        elif type(statement) is cst.Try or type(statement).__name__ == "TryStar":
            self._block(_body(statement.body), scope, out)
            for handler in statement.handlers:
                # Runs only when the try body failed (OOM recovery): not on the path from a backward to its step.
                frame = Frame(FrameKind.BRANCH, handler, "except", exits=leaves_block(handler.body))
                self._block(_body(handler.body), _within(scope, frame), out)
            if statement.orelse is not None:
                self._block(_body(statement.orelse.body), scope, out)
            if statement.finalbody is not None:
                self._block(_body(statement.finalbody.body), scope, out)
        elif type(statement) is cst.Match:
            self._expression(statement.subject, scope, out)
            for case in statement.cases:
                self._block(_body(case.body), scope, out)
        # Function and class definitions are roots of their own; nothing runs here.

    def _if(self, statement: cst.If, scope: _Scope, out: list[Event], top: bool = True) -> None:
        start = len(out)
        self._expression(statement.test, scope, out)
        if self._always_passes(statement.test, scope.function):
            self._block(_body(statement.body), scope, out)  # ``if step % 1 == 0:`` is no branch: its body always runs
            return
        accumulation, count = self._guard(statement.test, scope.function)
        accumulation = accumulation or _counter_reaches_threshold(statement)
        if accumulation and self._counts_outer_iterations(statement.test, scope):
            accumulation, count = False, None  # ``if epoch % 2 == 0:`` inside the batch loop: the same on every batch of an epoch
        if accumulation and self._flush_after_ended_loop(statement, scope.function):
            accumulation, count = False, None  # ``if n % k != 0: opt.step()`` after the batch loop: once per pass, a flush
        fixed = not accumulation and self._mode_switch(statement.test, scope.function)
        side = _setting_test(statement.test, self._counts_of_guards(scope.function)) if fixed else None
        body_frame = Frame(
            FrameKind.BRANCH, statement, "if", accumulation, count, exits=leaves_block(statement.body), fixed=fixed, accumulation_on=side,
        )
        self._block(_body(statement.body), _within(scope, body_frame), out)
        orelse = statement.orelse
        if orelse is None:
            return
        else_frame = Frame(
            FrameKind.BRANCH, statement, "else", accumulation, count,
            exits=type(orelse) is not cst.If and leaves_block(orelse.body), fixed=fixed,
            accumulation_on=(side[0], not side[1]) if side is not None else None,
        )
        if type(orelse) is cst.If:
            self._if(orelse, _within(scope, else_frame), out, top=False)
        else:
            self._block(_body(orelse.body), _within(scope, else_frame), out)
        if top:
            self._every_path_steps(statement, len(scope.frames), out[start:])

    def _every_path_steps(self, statement: cst.If, depth: int, events: list[Event]) -> None:
        """An ``if``/``elif``/``else`` chain on every branch of which the same optimizers step is no accumulation guard.

        ``if log: log_and_step(scaler, opt) elif scaler: scaler.step(opt) else: opt.step()`` steps on every
        micro-batch whatever the test says (a call the module cannot see into, handed the optimizer, may step:
        unknown is not absent). Its frames lose the accumulation mark; which optimizers the chain steps on
        every path is kept for an enclosing chain to read.
        """
        chain = [statement]
        while type(chain[-1].orelse) is cst.If:
            chain.append(chain[-1].orelse)
        if chain[-1].orelse is None:
            return  # no ``else``: the path on which every test fails steps nothing
        ids = {id(node) for node in chain}
        leaves: dict[tuple[int, str], set[str]] = {(id(node), "if"): set() for node in chain}
        leaves[(id(chain[-1]), "else")] = set()
        frames: dict[int, Frame] = {}
        steps: list[Event] = []
        for event in events:
            inner = event.frames[depth:]
            at = next((i for i in range(len(inner) - 1, -1, -1) if id(inner[i].node) in ids and inner[i].kind is FrameKind.BRANCH), None)
            for frame in inner:
                if frame.kind is FrameKind.BRANCH and id(frame.node) in ids:
                    frames[id(frame)] = frame
            if at is None or event.target is None:
                continue
            stepping = event.kind is EventKind.STEP or (event.kind == HANDOFF and handoff_may_step(event.node))
            if not stepping:
                continue
            if event.kind is EventKind.STEP:
                steps.append(event)
            name = last_name(event.target)
            leaf = leaves.get((id(inner[at].node), inner[at].branch))  # None: a call in an ``elif``'s test
            if leaf is not None and all(self._runs_whenever(f, name) for f in inner[at + 1:]):
                leaf.add(name)
        every = set.intersection(*leaves.values())
        for node in chain:
            self._stepped_on_every_path[id(node)] = frozenset(every)
        if not every or any(last_name(step.target or "") not in every for step in steps):
            return
        for frame in frames.values():
            frame.accumulation, frame.count = False, None

    def _runs_whenever(self, frame: Frame, optimizer: str) -> bool:
        """Whether a frame inside a branch leaves a step of ``optimizer`` on every path through it: a ``with`` block, an
        inner loop, or a chain of its own that steps ``optimizer`` on every path."""
        if frame.kind is not FrameKind.BRANCH:
            return True
        return frame.branch != "except" and optimizer in self._stepped_on_every_path.get(id(frame.node), ())

    def _counts_outer_iterations(self, test: cst.BaseExpression, scope: _Scope) -> bool:
        """Whether every remainder in ``test`` is of a variable of an outer loop (``epoch % 2``) that the innermost loop
        around the test never changes: a counter of epochs, not of micro-batches."""
        loops = [f for f in scope.frames if f.kind is FrameKind.LOOP]
        if len(loops) < 2:
            return False
        innermost = loops[-1].node
        outer_names = {
            n.value for f in loops[:-1] if type(f.node) is cst.For for n in self._walk(f.node.target) if type(n) is cst.Name
        }
        remainders = [n for n in self._walk(test) if type(n) is cst.BinaryOperation and type(n.operator) is cst.Modulo]
        if not remainders:
            return False
        for remainder in remainders:
            counted = [n for n in self._walk(remainder.left) if type(n) in (cst.Name, cst.Attribute)]
            names = {n.value for n in counted if type(n) is cst.Name}
            if any(type(n) is cst.Attribute for n in counted) or not names or not names <= outer_names:
                return False
            if any(_assigns(node, names) for node in self._walk(innermost)):
                return False
        return True

    def _flush_after_ended_loop(self, statement: cst.If, function: cst.FunctionDef | None) -> bool:
        """``_counted_by_ended_loop``, once per ``if`` and function (a helper's ``if`` is read again at every call)."""
        key = (id(statement), id(function))
        if key not in self._flushes:
            self._flushes[key] = self._counted_by_ended_loop(statement, function)
        return self._flushes[key]

    def _counted_by_ended_loop(self, statement: cst.If, function: cst.FunctionDef | None) -> bool:
        """Whether every remainder the ``if`` tests is of a counter that only a loop not holding the ``if`` moves on
        (its ``for`` target, or ``n += 1`` in its body, with ``n = 0`` set again on each pass of the loop around the
        ``if``): after the batch loop has ended, ``if n % k != 0:`` runs once per pass and steps the pass's last, short
        window. It picks no micro-batch of the loop around it. (A count that runs on across passes, never set back
        there, is that loop's own accumulation counter.)"""
        remainders = [n for n in self._walk(statement.test) if type(n) is cst.BinaryOperation and type(n.operator) is cst.Modulo]
        if not remainders:
            return False
        counters: set[str] = set()
        for remainder in remainders:
            names = [dotted_name(n) for n in self._walk(remainder.left) if type(n) in (cst.Name, cst.Attribute)]
            if len(names) != 1 or names[0] is None:
                return False
            counters.add(names[0])
        parents = self.index.file.parent_map()
        holding: set[int] = set()
        around: cst.CSTNode | None = None  # the innermost loop that holds the ``if`` (None: the function's body)
        node = parents.get(statement)
        while node is not None:
            holding.add(id(node))
            if around is None and type(node) in (cst.For, cst.While):
                around = node
            node = parents.get(node)
        targets: set[str] = set()  # bound as an ended loop's ``for`` target
        inner: set[str] = set()  # moved on inside an ended loop
        outer: set[str] = set()  # moved on outside every ended loop
        reset: set[str] = set()  # set again where each pass of the loop around runs, outside the ended loops

        def names_of(target: cst.CSTNode) -> set[str]:
            bound = dotted_name(target) if type(target) in (cst.Name, cst.Attribute) else None
            return ({bound} if bound else {dotted_name(n) for n in self._walk(target) if type(n) is cst.Name}) & counters

        top = function if function is not None else self.index.module
        pending: list[tuple[cst.CSTNode, bool, bool]] = [(top, False, around is None)]
        while pending:
            node, inside, per_pass = pending.pop()
            kind = type(node)
            if kind in (cst.For, cst.While) and id(node) not in holding and node is not statement:
                if kind is cst.For:
                    targets |= names_of(node.target)
                inside = True
            elif kind is cst.AugAssign:
                (inner if inside else outer).update(names_of(node.target))
            elif kind is cst.For:
                outer.update(names_of(node.target))
            elif kind is cst.Assign and not inside and per_pass:
                for target in node.targets:
                    reset |= names_of(target.target)
            elif kind in (cst.FunctionDef, cst.ClassDef) and node is not function:
                continue
            if node is around:
                per_pass = True
            pending.extend((child, inside, per_pass) for child in self.index.file.children(node))
        if counters & outer:
            return False
        return all(name in targets or (name in inner and name in reset) for name in counters)

    def _continue_guard(self, statement: cst.CSTNode, function: cst.FunctionDef | None) -> Frame | None:
        """``if not boundary: continue`` puts the rest of the block under an accumulation guard; so does a branch that
        does something else first and ends with ``continue`` (``if is_accumulating: last_batch_time = time.time();
        continue``)."""
        if type(statement) is not cst.If or statement.orelse is not None:
            return None
        body = statement.body.body
        last = body[-1] if body else None
        if type(statement.body) is not cst.SimpleStatementSuite:
            last = last.body[-1] if type(last) is cst.SimpleStatementLine and last.body else None
        if type(last) is not cst.Continue:
            return None
        accumulation, count = self._guard(statement.test, function)
        if not accumulation:
            return None
        return Frame(FrameKind.BRANCH, statement, "after", True, count)

    def _guard(self, test: cst.BaseExpression, function: cst.FunctionDef | None, depth: int = 0) -> tuple[bool, cst.BaseExpression | None]:
        """Whether a branch test is an accumulation guard, and the micro-batch count it uses (computed once per test)."""
        key = (id(test), id(function), depth)
        found = self._guards.get(key)
        if found is None:
            found = self._guards[key] = self._judge_guard(test, function, depth)
            count = dotted_name(found[1]) if found[0] and found[1] is not None else None
            if count is not None:
                self._guard_counts.setdefault(id(function), set()).add(count)
        return found

    def _counts_of_guards(self, function: cst.FunctionDef | None) -> Collection[str]:
        """The counts the accumulation guards of ``function`` divide by, whichever statement comes first: a setting test
        (``if update_interval > 1:``) may be written before the guard that makes it a count."""
        if function is not None and id(function) not in self._guards_read:
            self._guards_read.add(id(function))
            for node in self._walk(function.body):
                if type(node) is cst.If:
                    self._guard(node.test, function)
        return self._guard_counts.get(id(function), ())

    def _judge_guard(self, test: cst.BaseExpression, function: cst.FunctionDef | None, depth: int) -> tuple[bool, cst.BaseExpression | None]:
        for node in self._walk(test):
            if type(node) is cst.BinaryOperation and type(node.operator) is cst.Modulo:
                if self._fixed_at_one(node.right, function):
                    return False, None  # ``loss_interval = 1`` in the function: every micro-batch steps
                return True, node.right
        if self._mode_switch(test, function):
            return False, None  # ``if accumulation_steps > 1:`` picks a mode once; the same branch runs every batch
        count = self._cyclic_counter_at_zero(test, function)
        if count is not None:
            return True, count
        if self._count_reaches_threshold(test, function):
            return True, None
        if self._counts_down_and_skips(test):
            return True, None
        # ``config["is_warmup"]``: the key names the setting read, not whatever else the container holds
        containers = {id(n.value) for n in self._walk(test) if type(n) is cst.Subscript and _string_key(n) is not None}
        # ``accelerator.state.deepspeed_plugin``: the object an attribute is read from is no flag to follow back (its
        # construction, ``Accelerator(gradient_accumulation_steps=...)``, says nothing about this test)
        receivers = {id(n.value) for n in self._walk(test) if type(n) is cst.Attribute}
        for node in self._walk(test):
            name = dotted_name(node) if type(node) in (cst.Name, cst.Attribute) and id(node) not in containers else None
            if name is None:
                continue
            if _ACCUMULATION_WORDS.search(name):
                if type(node) is cst.Name and self._set_before_its_loop(name, test, function):
                    continue  # ``should_step = has_signal`` before the loop: the same on every micro-batch
                return True, None
            if depth < 2 and type(node) is cst.Name and id(node) not in receivers:
                if self._set_before_its_loop(name, test, function):
                    continue  # ``resume_step = train_steps % n`` before the loop: the same number on every batch
                for value in self._assigned(name, function):
                    if not isinstance(value, Unpacked) and not _arithmetic(value):
                        found, count = self._guard(value, function, depth + 1)
                        if found:
                            return True, count
        return False, None

    def _cyclic_counter_at_zero(self, test: cst.BaseExpression, function: cst.FunctionDef | None) -> cst.BaseExpression | None:
        """``if state.acc_step == 0:`` where ``state.acc_step = (state.acc_step + 1) % n``: the count ``n``, or None.

        An accumulation counter kept in range by ``%`` is 0 on one micro-batch in
        ``n``, as ``step % n == 0`` is; the name must say accumulation step.
        """
        if type(test) is not cst.Comparison or len(test.comparisons) != 1 or type(test.comparisons[0].operator) is not cst.Equal:
            return None
        left, right = test.left, test.comparisons[0].comparator
        counter = left if number(right) == 0 else right if number(left) == 0 else None
        name = dotted_name(counter) if type(counter) in (cst.Name, cst.Attribute) else None
        if name is None or not _ACCUMULATION_COUNTER.search(name.rsplit(".", 1)[-1]):
            return None
        for value in self._assigned(name, function):
            if type(value) is cst.BinaryOperation and type(value.operator) is cst.Modulo:
                if any(dotted_name(n) == name for n in self._walk(value.left) if type(n) in (cst.Name, cst.Attribute)):
                    return value.right
        return None

    def _count_reaches_threshold(self, test: cst.BaseExpression, function: cst.FunctionDef | None) -> bool:
        """``if samples_seen >= virtual_batch_size or is_last: ...; samples_seen = 0``: a count of samples or tokens.

        One side of the test (the whole test, or one operand of an ``or``: the
        "or last batch" clause steps on a short last window as well) compares a
        running count with a threshold; the count is added to in the function
        (``samples_seen += x.size(0)``) and the branch the test opens sets it
        back (``= 0`` or ``-= threshold``).
        """
        statement = self.index.file.parent_map().get(test)
        if type(statement) is not cst.If or statement.test is not test:
            return False
        for side in boolean_terms(test, cst.Or):
            if type(side) is not cst.Comparison or len(side.comparisons) != 1:
                continue
            if not isinstance(side.comparisons[0].operator, _THRESHOLD_TESTS):
                continue
            counter = dotted_name(side.left) if type(side.left) in (cst.Name, cst.Attribute) else None
            if counter is not None and _resets(statement, counter) and self._added_to(counter, function):
                return True
        return False

    def _counts_down_and_skips(self, test: cst.BaseExpression) -> bool:
        """``if acc_batches > 1: acc_batches -= 1; continue``: a count-down of the micro-batches left in the window.

        The branch lowers the count it tests and skips the rest of the
        iteration, so the step after it waits for the count to run down,
        whatever the count is called. A count of batches to wait or to warm up
        (``warmup``, ``skip``, ``wait``, ``delay``, ``patience``) skips whole
        iterations instead and is no guard.
        """
        statement = self.index.file.parent_map().get(test)
        if type(statement) is not cst.If or statement.test is not test or statement.orelse is not None:
            return False
        if type(test) is not cst.Comparison or len(test.comparisons) != 1:
            return False
        if type(test.comparisons[0].operator) not in (cst.GreaterThan, cst.NotEqual) or number(test.comparisons[0].comparator) not in (0, 1):
            return False
        counter = dotted_name(test.left) if type(test.left) in (cst.Name, cst.Attribute) else None
        if counter is None or _WAITING_COUNT.search(counter.rsplit(".", 1)[-1]):
            return False
        smalls = _branch_smalls(statement)
        return bool(smalls) and type(smalls[-1]) is cst.Continue and any(
            type(small) is cst.AugAssign and type(small.operator) is cst.SubtractAssign
            and dotted_name(small.target) == counter and number(small.value) == 1
            for small in smalls
        )

    def _added_to(self, counter: str, function: cst.FunctionDef | None) -> bool:
        """Whether ``counter += ...`` is written in the function (for ``self.`` attributes, in any function of the module)."""
        functions = self.index.augmented.keys() if counter.startswith("self.") else (function,)
        return any(
            type(node.operator) is cst.AddAssign and dotted_name(node.target) == counter
            for f in functions for node in self.index.augmented.get(f, ())
        )

    def _mode_switch(self, test: cst.BaseExpression, function: cst.FunctionDef | None) -> bool:
        """``if args.gradient_accumulation_steps > 1:``: whether accumulation is on, the same on every batch."""
        if not _accumulation_enabled(test, self._counts_of_guards(function)):
            return False
        key = (id(test), id(function))
        if key not in self._switches:
            name_only = function is not None and type(test.left) is cst.Name  # a local; an attribute may count elsewhere
            body = function if name_only else self.index.module
            if id(body) not in self._counted:
                self._counted[id(body)] = _counted_names(body, self._walk)
            self._switches[key] = _tested_name(test) not in self._counted[id(body)]
        return self._switches[key]

    def _set_before_its_loop(self, name: str, test: cst.BaseExpression, function: cst.FunctionDef | None) -> bool:
        """Whether a local flag a branch test reads is set only outside the loop that holds the test, and is no
        variable of that loop: the same on every iteration, it cannot pick one micro-batch in N whatever its name
        says (``should_step = has_ppo_signal or has_bc_signal`` before ``for epoch in ...: ...; if should_step:``)."""
        if function is None:
            return False
        parents = self.index.file.parent_map()
        loop = parents.get(test)
        while loop is not None and loop is not function and type(loop) not in (cst.For, cst.While):
            loop = parents.get(loop)
        if type(loop) not in (cst.For, cst.While):
            return False
        if type(loop) is cst.For and any(type(n) is cst.Name and n.value == name for n in walk(loop.target)):
            return False
        values = self.index.assignments.get(function, {}).get(name, [])
        if not values or any(not isinstance(v, cst.CSTNode) for v in values):
            return False
        if any(dotted_name(a.target) == name for a in self.index.augmented.get(function, ())):
            return False
        return not any(lies_under(parents, v, loop) for v in values)

    def _always_passes(self, test: cst.BaseExpression, function: cst.FunctionDef | None) -> bool:
        """``(step + 1) % n == 0`` with ``n`` always 1 where the function runs (``_fixed_at_one``), alone or as a
        term of an ``or``: the test passes on every batch."""
        if type(test) is cst.BooleanOperation and type(test.operator) is cst.Or:
            return any(self._always_passes(term, function) for term in boolean_terms(test, cst.Or))
        if type(test) is not cst.Comparison or len(test.comparisons) != 1 or type(test.comparisons[0].operator) is not cst.Equal:
            return False
        left, right = test.left, test.comparisons[0].comparator
        remainder = left if number(right) == 0 else right if number(left) == 0 else None
        return (
            type(remainder) is cst.BinaryOperation and type(remainder.operator) is cst.Modulo
            and self._fixed_at_one(remainder.right, function)
        )

    def _fixed_at_one(self, count: cst.BaseExpression, function: cst.FunctionDef | None) -> bool:
        """Whether a count is always 1 where the function runs: a setting a framework holds at 1 there
        (``frameworks.counts_at_one``), or a local name of the function that is only ever the literal 1 or such a
        setting (``loss_interval = 1`` written in the function, no parameter, other setting or later change): a
        remainder by it is always 0."""
        if function is None:
            return False
        held = frameworks.counts_at_one(self.index).get(function, frozenset())
        if held and dotted_name(count) in held:
            return True
        if type(count) is not cst.Name:
            return False
        params = function.params
        if any(p.name.value == count.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)):
            return False
        values = self.index.assignments.get(function, {}).get(count.value, [])
        if not values or self.index.assignments.get(None, {}).get(count.value):
            return False
        if any(dotted_name(a.target) == count.value for a in self.index.augmented.get(function, [])):
            return False
        return all((type(v) is cst.Integer and v.value == "1") or (held and dotted_name(v) in held) for v in values)

    def _assigned(self, name: str, function: cst.FunctionDef | None) -> list[cst.BaseExpression]:
        values = list(self.index.assignments.get(function, {}).get(name, []))
        if function is not None:
            values += self.index.assignments.get(None, {}).get(name, [])
        return values

    def _with_context(self, item: cst.BaseExpression) -> str | None:
        """What a ``with`` item makes its block: a framework's no-sync or accumulation context, or an ``autocast``."""
        for node in self._walk(item):
            if type(node) is cst.Call:
                name = callee_name(node)
                context = frameworks.CONTEXTS.get(name) if name is not None else None
                if context is not None:
                    return context
                if name == "autocast":
                    return "autocast"
        return None

    # -- simple statements and expressions

    def _simple(self, small: cst.BaseSmallStatement, scope: _Scope, out: list[Event]) -> None:
        self._expression(small, scope, out)
        if type(small) is cst.Assign:
            for target in small.targets:
                self._grad_assignment(target.target, small.value, small, scope, out)
            if _switches_off_grad_sync(small):  # ``ddp.require_backward_grad_sync = flag``
                owner = small.targets[-1].target.value
                out.append(Event(NO_SYNC, small, scope.frames, dotted_name(owner), ObjKind.PARALLEL_MODEL, call_chain=scope.chain))
            elif self._may_hold_no_sync and _holds_no_sync(small.value, self._walk):  # ``ctx = model.no_sync if not last else nullcontext``, entered later
                out.append(Event(NO_SYNC, small, scope.frames, None, ObjKind.PARALLEL_MODEL, call_chain=scope.chain))
        elif type(small) is cst.AugAssign and is_grad(small.target):
            if type(small.operator) in (cst.DivideAssign, cst.MultiplyAssign):
                out.append(Event(GRAD_DIVIDE, small, scope.frames, call_chain=scope.chain))

    def _grad_assignment(self, target: cst.BaseExpression, value: cst.BaseExpression, small: cst.CSTNode, scope: _Scope, out: list[Event]) -> None:
        """``p.grad = None`` clears and frees; ``p.grad = 0 * p.grad`` clears and keeps the buffer."""
        if not is_grad(target):
            return
        if type(value) is cst.Name and value.value == "None":
            set_to_none = True
        elif _is_zeroing_value(value):
            set_to_none = False
        elif type(value) is cst.Call and callee_name(value) in ("zeros_like", "zeros"):
            set_to_none = None  # p.grad = torch.zeros_like(p): a fresh buffer, often made on purpose for a step
        else:
            if scales_down(value, self._children):
                out.append(Event(GRAD_DIVIDE, small, scope.frames, call_chain=scope.chain))
            return
        owner, kind = self._grad_owner(target, scope)
        out.append(Event(EventKind.ZERO, small, scope.frames, owner, kind, set_to_none=set_to_none, manual=True, call_chain=scope.chain))

    def _grad_owner(self, grad: cst.BaseExpression, scope: _Scope) -> tuple[str | None, ObjKind]:
        """Whose gradients ``p.grad`` belongs to, read from the loops that bind ``p``.

        A ``.grad`` of one named tensor that no loop binds (``delta.grad``,
        ``self.fc.weight.grad``) is that tensor's own: target kind TENSOR.
        """
        name = root_name(grad)
        loop_bound = False
        for frame in reversed(scope.frames):
            if frame.kind is not FrameKind.LOOP or type(frame.node) is not cst.For:
                continue
            bound = {n.value for n in self._walk(frame.node.target) if type(n) is cst.Name}
            if name not in bound:
                continue
            loop_bound = True
            for node in self._walk(_zipped_source(frame.node, name)):
                if type(node) is cst.Call and callee_name(node) in ("parameters", "named_parameters"):
                    owner = dotted_name(receiver(node))
                    if owner:
                        return owner, ObjKind.MODEL
                if type(node) is cst.Attribute and node.attr.value == "param_groups":
                    return dotted_name(node.value), ObjKind.OPTIMIZER
            name = root_name(frame.node.iter)
        tensor = dotted_name(_grad_holder(grad))
        if not loop_bound and tensor is not None and not self._is_argument(root_name(grad), scope.function):
            return tensor, ObjKind.TENSOR
        return None, ObjKind.UNKNOWN

    @staticmethod
    def _is_argument(name: str | None, function: cst.FunctionDef | None) -> bool:
        """Whether ``name`` is a parameter of ``function`` other than ``self``/``cls``: the caller may pass each parameter in turn."""
        if function is None or name in ("self", "cls"):
            return False
        params = function.params
        every = [*params.posonly_params, *params.params, *params.kwonly_params]
        return any(p.name.value == name for p in every)

    def _expression(self, node: cst.CSTNode, scope: _Scope, out: list[Event]) -> None:
        parents = self.index.file.parent_map()
        branches: dict[tuple[int, str], Frame] = {}
        for call in self.index.file.calls_in_evaluation_order(node):
            frames = _conditional_frames(call, node, parents, branches)
            self._call(call, dataclasses.replace(scope, frames=scope.frames + frames) if frames else scope, out)

    def _call(self, call: cst.Call, scope: _Scope, out: list[Event]) -> None:
        index = self.index
        method = method_name(call)
        recv = receiver(call)
        recv_name = _object_named(recv)
        qualified = index.qualified_names(call.func)
        frames, chain = scope.frames, scope.chain

        def emit(kind: Kind, **fields) -> None:
            out.append(Event(kind, call, frames, call_chain=chain, **fields))

        # ``self.backward(loss)`` or ``self.step()`` defined by the class itself: judge what the method does.
        if type(recv) is cst.Name and recv.value in ("self", "cls"):
            helper = index.resolve_function(call, scope.function, scope.self_class)
            if helper is not None:
                self._inline(helper, call, scope, out)
                return
        if "torch.distributed.autograd.backward" in qualified:
            return  # distributed autograd writes the gradients into its context, never into .grad
        if method == "replay" and self.index.uses_cuda_graphs:
            # ``graph.replay()`` runs the captured forward and backward again
            emit(EventKind.BACKWARD, framework="cuda_graph")
            return
        if "torch.autograd.backward" in qualified:  # the tensors are the first argument, not a receiver
            emit(EventKind.BACKWARD, **self._backward_fields(call, None, None, None, scope))
            return
        if method == "backward" or method in frameworks.BACKWARD_METHODS:
            emit(EventKind.BACKWARD, **self._backward_fields(call, method, recv, recv_name, scope))
            return
        if method != "zero_grad" and method is not None and _NAMED_CLEAR.search(method) and "grad" in method.lower() and (
            self._kind(recv_name) is ObjKind.OPTIMIZER
        ):
            # ``self._inner_optimizer.set_grads_none()``: an optimizer class's own clear, under another name
            emit(EventKind.ZERO, target=recv_name, target_kind=ObjKind.OPTIMIZER)
            return
        if method == "zero_grad":
            kind = self._kind(recv_name)
            target_kind = ObjKind.OPTIMIZER if kind is ObjKind.OPTIMIZER else ObjKind.MODEL
            if type(recv) is cst.Name and _loop_bound(recv.value, scope.frames):
                # ``for opt in optimizers: opt.zero_grad()``: every optimizer of the collection, whichever they are
                emit(EventKind.ZERO, target=None, target_kind=ObjKind.UNKNOWN, set_to_none=_set_to_none(call))
                return
            emit(EventKind.ZERO, target=recv_name, target_kind=target_kind, set_to_none=_set_to_none(call))
            return
        if method in ("zero_", "fill_", "mul_") and is_grad(recv):
            if method == "mul_" and positional_args(call) and scales_down(positional_args(call)[0].value, self._children):
                emit(GRAD_DIVIDE)  # p.grad.mul_(1 / n)
                return
            if method == "zero_" or _is_zero_literal(positional_args(call)):
                owner, kind = self._grad_owner(recv, scope)
                emit(EventKind.ZERO, target=owner, target_kind=kind, set_to_none=False, manual=True)
            return
        if method in ("div_",) and is_grad(recv):
            emit(GRAD_DIVIDE)
            return
        if _reads_grad_statistic(call, method, recv):  # ``p.grad.norm()``, ``writer.add_histogram(n, p.grad, step)``
            emit(GRAD_READ)
            return
        if call.args and callee_name(call) in self.grad_readers and index.resolve_function(call, scope.function) is None:
            emit(GRAD_READ)  # ``debug_utils.log_gradient_stats(model, ...)`` of another file of the run
            return
        if _scales_gradients(call, method, lambda name: self._assigned(name, scope.function)):
            emit(GRAD_DIVIDE)
            return
        if method in frameworks.COMM_HOOKS:
            # A communication hook that divides the bucket by more than the world size normalises the
            # accumulated gradients itself (by tokens or micro-batches) when they are all-reduced.
            position, keyword = frameworks.COMM_HOOKS[method]
            args = positional_args(call)
            hook = args[position].value if len(args) > position else (keyword_arg(call, keyword).value if keyword_arg(call, keyword) else None)
            function = self.index.resolve_function(cst.Call(func=hook), scope.function) if type(hook) in (cst.Name, cst.Attribute) else None
            hooks = [function] if function is not None else []
            if type(hook) is cst.Call:  # ``scale_by_grad_accum_steps_wrapper(allreduce_hook)``: the hooks it defines
                factory = self.index.resolve_function(hook, scope.function)
                if factory is not None:
                    hooks = list(self.index.nested.get(factory, {}).values())
            if any(_divides_beyond_world_size(h) for h in hooks):
                emit(GRAD_DIVIDE, framework="comm_hook")
            return
        if method in frameworks.AVERAGING_STEPS and self._kind(recv_name) is ObjKind.OPTIMIZER:
            # The optimizer averages what it accumulated over every mini-batch since its last step: the loss needs no division.
            emit(GRAD_DIVIDE)
            return
        recv_kind = self._kind(recv_name)
        if method == "step":
            args = positional_args(call)
            if recv_kind is ObjKind.SCALER and args:
                target = _element_of_loop(args[0].value, scope.frames) or _object_named(args[0].value)
                # ``scaler.step(opt, closure=f)``: a disabled scaler runs ``opt.step(closure=f)`` (an enabled one raises)
                closure = keyword_arg(call, "closure").value if keyword_arg(call, "closure") else None
                if closure is not None:
                    self._inline_closure(closure, scope, out)
                emit(EventKind.STEP, target=target, target_kind=ObjKind.OPTIMIZER, via_scaler=recv_name, framework="closure" if closure is not None else None)
                return
            if recv_kind is ObjKind.OPTIMIZER:
                target = _element_of_loop(recv, scope.frames) or recv_name
                handed = next((n for a in call.args if self._kind(n := dotted_name(a.value)) is ObjKind.SCALER), None)
                if handed is not None:
                    # ``self.optim.step(scaler=self.grad_scaler)``: a project's optimizer wrapper steps through the scaler
                    emit(EventKind.STEP, target=target, target_kind=ObjKind.OPTIMIZER, via_scaler=handed)
                    return
                if _handed_a_rate_or_gradients(call):
                    # ``emb_optimizer.step(lr)``: torch's ``step`` takes a closure alone; this optimizer is another
                    # library's, and what its step does with the gradients is its own
                    emit(EventKind.STEP, target=target, target_kind=ObjKind.OPTIMIZER, has_args=True)
                    return
                closure = args[0].value if args else (keyword_arg(call, "closure").value if keyword_arg(call, "closure") else None)
                if closure is not None:
                    self._inline_closure(closure, scope, out)
                emit(EventKind.STEP, target=target, target_kind=ObjKind.OPTIMIZER, framework="closure" if closure is not None else None)
                return
            if recv_kind is ObjKind.SCHEDULER:
                emit(EventKind.SCHED_STEP, target=recv_name, target_kind=ObjKind.SCHEDULER, has_args=bool(call.args))
                return
        if method == "unscale_" and recv_kind is ObjKind.SCALER:
            args = positional_args(call)
            target = (_element_of_loop(args[0].value, scope.frames) or _object_named(args[0].value)) if args else None
            emit(EventKind.UNSCALE, target=target, target_kind=ObjKind.OPTIMIZER, via_scaler=recv_name)
            return
        if method == "update" and recv_kind is ObjKind.SCALER:
            emit(EventKind.SCALER_UPDATE, target=recv_name, target_kind=ObjKind.SCALER)
            return
        no_sync = frameworks.NO_SYNC.get(method) if method is not None else None
        if no_sync is not None:
            args = positional_args(call)  # ``fabric.no_backward_sync(model, ...)`` names the model among its arguments
            place = no_sync.model_argument
            owner = dotted_name(args[place].value) if place is not None and len(args) > place else recv_name
            emit(NO_SYNC, target=owner, target_kind=ObjKind.PARALLEL_MODEL)
            return
        switch = frameworks.SYNC_SWITCHES.get(method) if method is not None else None
        if switch is not None and switch.switches_off(call):  # ``model.disable_allreduce()``
            emit(NO_SYNC, target=recv_name, target_kind=ObjKind.PARALLEL_MODEL)
            return
        name = callee_name(call)
        if name in _CLIP_FUNCTIONS or name in frameworks.CLIP_METHODS or not qualified.isdisjoint(_CLIP_QUALIFIED):
            emit(EventKind.CLIP, framework=self._clip_framework(recv_name, qualified))
            return
        module = frameworks.STEP_FUNCTIONS.get(name) if name is not None else None
        if module is not None and any(q.startswith(module) for q in qualified):  # ``xm.optimizer_step(opt)``
            args = positional_args(call)
            emit(EventKind.STEP, target=dotted_name(args[0].value) if args else None, target_kind=ObjKind.OPTIMIZER)
            return
        helper = index.resolve_function(call, scope.function, scope.self_class)
        if self._clips_by_hand(helper or self._instance_method(call, scope.function)):
            emit(EventKind.CLIP, framework="by_hand")  # ``clipper.step(params)``: the module's own norm clipping
            return
        if helper is not None:
            self._inline(helper, call, scope, out)
            return
        instance = self._instance_target(call, scope.function) if any(f.kind is FrameKind.LOOP for f in scope.frames) else None
        if instance is not None:  # ``trainer = CAMETrainer(); for epoch in ...: trainer.train_epoch(epoch)``
            self._inline(instance[0], call, scope, out, self_class=instance[1])
            return
        if _configured_clipper(call):
            emit(EventKind.CLIP, framework=None)  # ``self.gradient_clipper(model)``: a clipping function built elsewhere
            return
        if name and _CLEAR_HELPER.search(name):
            emit(EventKind.ZERO, target=None, target_kind=ObjKind.UNKNOWN)
            return
        timed = self._timed_function(call, name, scope.function)
        if timed is not None:  # ``loss, ms = gpu_timer(train_step)``: the timer runs the step once, here
            self._inline(timed, cst.Call(func=cst.Name(timed.name.value)), scope, out)
            return
        helper = self.backward_helpers.get(name) if name else None
        if helper is not None:
            self._backward_helper_call(call, helper, scope, out)
        handed = [name for name in (dotted_name(arg.value) for arg in call.args) if name and self._kind(name) is ObjKind.OPTIMIZER]
        for arg_name in handed:
            emit(HANDOFF, target=arg_name, target_kind=ObjKind.OPTIMIZER)
        held = (
            self._optimizer_held_by(dotted_name(call.func.value))
            if not handed and type(call.func) is cst.Attribute and CLEAR_WORDS.search(call.func.attr.value) else None
        )
        if held is not None:  # ``gns = GradientNoiseScale(adp, sgd)``, then ``gns.reset_accumulation()``
            emit(HANDOFF, target=held, target_kind=ObjKind.OPTIMIZER)
        if len(handed) == 1 and name in self.steps_handed:
            # ``self.mp_trainer.optimize(self.opt)``: every function of that name in the run steps the optimizer it is handed
            emit(EventKind.STEP, target=handed[0], target_kind=ObjKind.OPTIMIZER, framework="handed")

    def _backward_helper_call(self, call: cst.Call, helper: BackwardHelper, scope: _Scope, out: list[Event]) -> None:
        """``loss_scaler(loss, optimizer, update_grad=(i + 1) % accum == 0)``: a helper of another file of the run that
        backpropagates ``loss`` on every call and steps ``optimizer`` only when the flag is true (the project index read
        its definition): a BACKWARD, then a STEP under a branch of the flag's value (an accumulation guard when the
        value is one), both ``framework="handed"``."""
        if not helper.steps:
            self._backpropagating_call(call, helper, scope, out)
            return
        loss, optimizer, flag = (_argument(call, *where) for where in (helper.loss, helper.optimizer, helper.flag))
        if loss is None or optimizer is None or dotted_name(optimizer) is None:
            return
        out.append(Event(
            EventKind.BACKWARD, call, scope.frames, call_chain=scope.chain, framework="handed", loss=loss,
            scaled=helper.scaled, normalised=self._normalised(loss, scope),
        ))
        written = flag if flag is not None else (cst.parse_expression(helper.flag_default) if helper.flag_default else None)
        if written is None or bool_literal(written) is False:
            return  # never steps on this call
        frames = scope.frames
        if bool_literal(written) is not True:
            accumulation, count = self._guard(written, scope.function)
            frames = frames + (Frame(FrameKind.BRANCH, written, "if", accumulation, count),)
        out.append(Event(
            EventKind.STEP, call, frames, dotted_name(optimizer), ObjKind.OPTIMIZER, call_chain=scope.chain, framework="handed",
        ))

    def _backpropagating_call(self, call: cst.Call, helper: BackwardHelper, scope: _Scope, out: list[Event]) -> None:
        """``loss, meta = sft_microbatch_train_step(log_probs, mask, k)``: a function of another file of the run that only
        backpropagates (the project index read its definition) is a BACKWARD at the call, ``framework="handed"``. Its
        loss is the argument it backpropagates, or the call when it builds the loss itself; the loss counts as divided
        when the helper divides or scales it on the way, or when the caller divided the argument; ``divided_by`` is what
        the call hands the parameter the helper divides by."""
        loss = _argument(call, *helper.loss) if helper.loss[1] else call
        if loss is None:
            return
        normalised = helper.divides or (loss is not call and self._normalised(loss, scope))
        divided_by = _argument(call, *helper.divisor) if helper.divisor[1] else None
        out.append(Event(
            EventKind.BACKWARD, call, scope.frames, call_chain=scope.chain, framework="handed", loss=loss,
            scaled=helper.scaled, normalised=normalised, divided_by=divided_by,
        ))

    def _clip_framework(self, recv_name: str | None, qualified: set[str]) -> str | None:
        """None for torch's own clipping; otherwise who clips (a framework's object unscales first, FSDP shards)."""
        if any(q.startswith("torch.") for q in qualified) or recv_name is None:
            return None
        by = frameworks.CLIP_OWNER_KINDS.get(self._kind(recv_name))
        if by is not None:
            return by
        if recv_name.split(".")[0] in ("torch", "nn", "utils", "clip_grad"):
            return None
        return "module"

    def _instance_method(self, call: cst.Call, function: cst.FunctionDef | None) -> cst.FunctionDef | None:
        """``clipper.step(...)`` where ``clipper`` (or ``self.clipper``) is only ever built from a class of this module."""
        found = self._instance_of(call, function)
        return found[0] if found is not None else None

    def _instance_of(self, call: cst.Call, function: cst.FunctionDef | None) -> tuple[cst.FunctionDef, str] | None:
        """The method ``receiver.method(...)`` lands in and the receiver's class, when the receiver (a local or an
        attribute of ``self``) is only ever built from a class of this module (``trainer = CAMETrainer()``)."""
        func = call.func
        receiver_name = dotted_name(func.value) if type(func) is cst.Attribute else None
        if receiver_name is None or receiver_name in ("self", "cls"):
            return None
        if receiver_name.startswith("self."):
            values = list(self.index.assigned_anywhere(receiver_name))
        else:
            values = self._assigned(receiver_name, function)
        if len(values) != 1 or type(values[0]) is not cst.Call:
            return None
        class_name = dotted_name(values[0].func)
        if class_name not in self.index.class_methods:
            return None
        method = self.index.method_of(class_name, func.attr.value)
        return (method, class_name) if method is not None else None

    def _timed_function(self, call: cst.Call, name: str | None, function: cst.FunctionDef | None) -> cst.FunctionDef | None:
        """``gpu_timer(train_step)``: a function of the module without parameters, handed first to a call the module
        cannot see whose name says it times or profiles what it is handed (I-JEPA's loops run their step that way)."""
        if name is None or not _TIMER.search(name) or not call.args or call.args[0].keyword is not None:
            return None
        handed = call.args[0].value
        if type(handed) is not cst.Name:
            return None
        found = self.index.resolve_function(cst.Call(func=handed), function)
        if found is None or found.params.params or found.params.posonly_params or found.params.kwonly_params:
            return None
        return found

    def _instance_target(self, call: cst.Call, function: cst.FunctionDef | None) -> tuple[cst.FunctionDef, str] | None:
        """``trainer.train_epoch(epoch)`` on a local (not an attribute) only ever built from a class of this module:
        :meth:`_instance_of`. Asked only for calls in a loop (an epoch loop running the method): a one-off call
        (``sampler.sample()`` after a test's backward) is read where it is defined."""
        if type(call.func) is not cst.Attribute or type(call.func.value) is not cst.Name:
            return None
        return self._instance_of(call, function)

    def _clips_by_hand(self, function: cst.FunctionDef | None) -> bool:
        """Whether a function of this module clips gradients by their norm itself (computed once per function)."""
        if function is None:
            return False
        if function not in self._hand_clips:
            self._hand_clips[function] = _clips_gradient_norm(function, self._walk)
        return self._hand_clips[function]

    def _optimizer_held_by(self, name: str | None) -> str | None:
        """The optimizer an object of unknown kind was built with (``gns = GradientNoiseScale(adp, sgd)``): every
        assignment of ``name`` in the module is a call, and those calls hand it one optimizer, the same each time.
        A method of it whose name says it resets or clears (``gns.reset_accumulation()``) may clear that optimizer, as
        ``f(sgd)`` may; other methods (a callback handler's ``on_step_end``) are not read as handed it."""
        if name is None or self._kind(name) is not ObjKind.UNKNOWN:
            return None
        if name not in self._holders:
            values = self.index.assigned_anywhere(name)
            held = {
                dotted_name(arg.value) for value in values if type(value) is cst.Call for arg in value.args
                if self._kind(dotted_name(arg.value)) is ObjKind.OPTIMIZER
            }
            every_call = bool(values) and all(type(value) is cst.Call for value in values)
            self._holders[name] = held.pop() if every_call and len(held) == 1 else None
        return self._holders[name]

    def _kind(self, name: str | None) -> ObjKind:
        if name is None:
            return ObjKind.UNKNOWN
        if name.endswith("]"):  # ``opts[i]``, ``optimizers["g"]``: an element has its collection's kind,
            base, key = name[:-1].split("[", 1)
            said = kind_from_name(key.strip("'\"")) if key[:1] in "'\"" else ObjKind.UNKNOWN
            # unless a string key says what it holds: ``optimizer_state["scheduler"]``
            return said if said is not ObjKind.UNKNOWN else self._kind(base)
        known = self.index.objects.get(name)
        if known is not None and known.kind is not ObjKind.UNKNOWN:
            return known.kind
        if self._wraps_optimizer(name):
            return ObjKind.OPTIMIZER
        return kind_from_name(name)

    def _wraps_optimizer(self, name: str) -> bool:
        """Whether ``name`` is only ever built from a class of this module, or of another file of the run
        (``wrapper_classes``), whose ``step()`` and ``zero_grad()`` step and clear an optimizer it holds
        (``self.optimizer.step()``): an optimizer by another name."""
        if name not in self._wrappers:
            values = list(self.index.assigned_anywhere(name))
            classes = {dotted_name(v.func) if type(v) is cst.Call else None for v in values}
            found = False
            if len(classes) == 1 and None not in classes:
                class_name = classes.pop()
                if class_name in self.index.class_methods:
                    found = all(_delegates(self.index.method_of(class_name, method), method) for method in ("step", "zero_grad"))
                else:  # a class of another file of the run (``from neural_sp.trainers.lr_scheduler import LRScheduler``)
                    found = last_name(class_name) in self.wrapper_classes
            self._wrappers[name] = found
        return self._wrappers[name]

    def _backward_fields(self, call: cst.Call, method: str | None, recv, recv_name: str | None, scope: _Scope) -> dict:
        args = positional_args(call)
        if not args and (given := keyword_arg(call, "loss")) is not None:
            args = [given]  # ``booster.backward(loss=loss / n, optimizer=optimizer)``
        backward = frameworks.backward_of(method, last_name(recv_name or ""), self._kind(recv_name))
        if backward is not None and backward.any_owner:
            loss = args[0].value if args else None
            return {"framework": backward.by, "loss": loss, "normalised": loss is not None and self._normalised(loss, scope)}
        if method is None:  # torch.autograd.backward(loss)
            loss = args[0].value if args else None
            return {"loss": loss, "normalised": loss is not None and self._normalised(loss, scope)}
        if args and backward is not None and backward.by is not None:
            loss = args[0].value
            normalised = backward.divides_by_count or self._normalised(loss, scope)
            return {"framework": backward.by, "normalised": normalised, "loss": loss}
        if args and (backward is not None or _LOSS_NAME.search(self.index.module.code_for_node(args[0].value))):
            # ``optimizer.backward(loss)`` (an fp16 optimizer's) or a helper handed the loss: what is backpropagated
            # is the argument, scaled by a loss scale at most.
            loss = args[0].value
            return {"loss": loss, "normalised": self._normalised(loss, scope)}
        scaled = False
        recv = _uncast(recv)
        loss = recv
        unreduced = _unreduced(recv)  # ``scaler.scale(loss).mean()`` is as scaled as ``scaler.scale(loss)``
        if self._scales(unreduced):
            scaled = True
            inner = positional_args(self._scaling_call(unreduced))
            loss = inner[0].value if inner else recv
        elif (unreduced_name := dotted_name(unreduced)) is not None:
            for value in self._assigned(unreduced_name, scope.function):
                value = _uncast(value)
                if self._scales(value):
                    scaled = True
        # ``y.backward(dy)``: a given upstream gradient, not a mean loss to divide.
        upstream = bool(args) and method == "backward"
        gradient = args[0].value if args else (given.value if (given := keyword_arg(call, "gradient")) is not None else None)
        if method == "backward" and gradient is not None and self._scales(_unreduced(_uncast(gradient))):
            scaled = True  # ``features.backward(scaler.scale(grad))``: the upstream gradient carries the loss scale
        return {"scaled": scaled, "loss": loss, "upstream": upstream, "normalised": loss is not None and self._normalised(loss, scope)}

    def _normalised(self, loss: cst.BaseExpression, scope: _Scope, through: frozenset[str] = frozenset()) -> bool:
        """Whether the loss handed to backward was divided (or scaled down) on its way there.

        Dividing by the world size alone is no division by the number of
        micro-batches (DDP averages over ranks; the micro-batches are still summed),
        nor is dividing by a running micro-batch counter (1, 2, ... until the step).
        ``through`` holds the names already followed into ``scale_loss(name)``:
        ``loss = self.scale_loss(loss)`` must not be followed forever.
        """
        running = self._running_counters(scope.function)
        if scales_down(loss, self._children) and not _by_no_count(loss, running):
            return True
        if type(loss) is cst.BinaryOperation and type(loss.operator) is cst.Multiply:
            # ``(loss * loss_scale).backward()``: a divided loss times a scale is still divided
            return self._normalised(loss.left, scope, through) or self._normalised(loss.right, scope, through)
        name = tracked_name(loss)
        if name is None:
            return False
        if (
            name in self.index.divided_names.get(scope.function, set())
            and not self._divided_by_no_count(name, scope.function)
            and not self._rebound_undivided_before(loss, name, self.index.divided_names.get(scope.function, set()))
        ):
            return True
        for value in self._assigned(name, scope.function):
            if type(value) is cst.Call and callee_name(value) in frameworks.LOSS_SCALERS and positional_args(value) and name not in through:
                # ``with amp.scale_loss(loss, opt) as scaled_loss``: the loss it is given, multiplied by the loss scale
                if self._normalised(positional_args(value)[0].value, scope, through | {name}):
                    return True
            if type(value) is cst.Call:
                # ``self.scale_loss(loss)``, or ``self.accumulator.scale_loss(loss)`` of an object of a module class
                helper = self.index.resolve_function(value, scope.function) or self._instance_method(value, scope.function)
                if helper is not None and helper in self.index.returns_divided:
                    return True
            if isinstance(value, Unpacked) and type(value.value) is cst.Call:
                # ``loss, ce_loss, z_loss = self.train_micro_batch(...)``: the helper returns a divided element there
                helper = self.index.resolve_function(value.value, scope.function)
                if helper is not None and (helper, value.position) in self.index.returns_divided_at:
                    return True
            if self._weighted_by_divided(value, scope):
                return True
        return name not in through and self._summed_from_divided(name, scope, through | {name})

    def _rebound_undivided_before(self, use: cst.CSTNode, name: str, divided: set[str]) -> bool:
        """Whether the statement just before ``use``'s that binds ``name``, in the block that holds it, binds it to
        something not scaled down and made of no name in ``divided`` nor of itself (``loss = output.loss`` then
        ``loss.backward()``): a division written elsewhere in the function (``loss = sum(losses) / len(losses)`` after
        the micro-batch loop, for a log) never reaches this use. False when a compound statement may bind it first,
        or nothing in the block does."""
        parents = self.index.file.parent_map()
        statement = use
        while statement is not None and type(statement) not in (cst.SimpleStatementLine, cst.If, cst.For, cst.While, cst.With):
            statement = parents.get(statement)
        block = parents.get(statement) if statement is not None else None
        body = list(getattr(block, "body", ()))
        if statement not in body:
            return False
        for earlier in reversed(body[: body.index(statement)]):
            if type(earlier) is not cst.SimpleStatementLine:
                if any(type(n) in (cst.Assign, cst.AugAssign) for n in self._walk(earlier)):
                    return False  # it may bind the name on some path
                continue
            for small in reversed(earlier.body):
                if type(small) is cst.AugAssign and tracked_name(small.target) == name:
                    return False
                if type(small) is cst.Expr and _reads_name(list(self._walk(small)), name):
                    return False  # ``loss.mul_(size / batch_size)``: it may be scaled in place
                if type(small) is cst.Assign and any(tracked_name(t.target) == name for t in small.targets):
                    nodes = list(self._walk(small.value))
                    if any(_reads_name(nodes, each) for each in divided | {name}):
                        return False  # ``loss = loss.float() * scale``, ``loss = seg + aux``: made from divided names
                    return not scales_down(small.value, self._children)
        return False

    def _summed_from_divided(self, name: str, scope: _Scope, through: frozenset[str]) -> bool:
        """``total = None`` / ``total = loss`` / ``total += loss`` with every ``loss`` divided: a sum of divided losses
        (one per adapter or task) is divided too."""
        values = [v for v in self._assigned(name, scope.function) if not (type(v) is cst.Name and v.value == "None")]
        added = [
            a.value for a in self.index.augmented.get(scope.function, ())
            if type(a.operator) is cst.AddAssign and tracked_name(a.target) == name
        ]
        summed = values + added
        return bool(added) and all(
            not isinstance(v, Unpacked) and tracked_name(v) is not None and self._normalised(v, scope, through)
            for v in summed
        )

    def _divided_by_no_count(self, name: str, function: cst.FunctionDef | None) -> bool:
        """Whether every way ``name`` is scaled down in the function divides by the world size or a running counter."""
        key = (id(function), name)
        if key not in self._no_count_divisions:
            scalings: list[cst.BaseExpression] = []
            for node in self._walk(function if function is not None else self.index.module):
                kind = type(node)
                if kind is cst.Assign and any(tracked_name(t.target) == name for t in node.targets) and scales_down(node.value, self._children):
                    scalings.append(node.value)
                elif kind is cst.AugAssign and tracked_name(node.target) == name:
                    if type(node.operator) is cst.DivideAssign:
                        scalings.append(cst.BinaryOperation(cst.Name("x"), cst.Divide(), node.value))
                    elif type(node.operator) is cst.MultiplyAssign:
                        scalings.append(node.value)  # never by the world size alone
                elif kind is cst.Call and method_name(node) in ("mul_", "div_") and dotted_name(receiver(node)) == name:
                    scalings.append(node)
            running = self._running_counters(function)
            self._no_count_divisions[key] = bool(scalings) and all(_by_no_count(s, running) for s in scalings)
        return self._no_count_divisions[key]

    def _running_counters(self, function: cst.FunctionDef | None) -> frozenset[str]:
        """The function's micro-batch counters: ``n += 1``, reset by ``n = 0`` in an ``if n >= ...:`` branch (computed once)."""
        if function is None:
            return frozenset()
        if id(function) not in self._running:
            self._running[id(function)] = _running_counters(function, self.index)
        return self._running[id(function)]

    def _weighted_by_divided(self, value: cst.BaseExpression, scope: _Scope) -> bool:
        """``loss = (per_token * weights).sum()`` with ``weights = mask / tokens_in_step``: weights that divide."""
        if isinstance(value, Unpacked):
            return False
        factors = self._factors.get(id(value))
        if factors is None:  # each value is walked once, however many backwards ask about it
            factors = self._factors[id(value)] = frozenset(
                name
                for node in self._walk(value)
                if type(node) is cst.BinaryOperation and type(node.operator) is cst.Multiply
                for name in (dotted_name(node.left), dotted_name(node.right))
                if name is not None
            )
        if not factors:
            return False
        divided = self.index.divided_names.get(scope.function, set())
        return not factors.isdisjoint(divided) or not factors.isdisjoint(self.index.divided_names.get(None, set()))

    # -- helpers

    def _inline(
        self, helper: cst.FunctionDef, call: cst.Call, scope: _Scope, out: list[Event], self_class: str | None = None,
    ) -> None:
        """Append a helper's events as if its body were written at the call site (``self_class``: the class of the
        instance a method is called on)."""
        if helper in scope.stack or scope.depth >= MAX_INLINE_DEPTH:
            return
        on_self = type(call.func) is cst.Attribute and type(call.func.value) is cst.Name and call.func.value.value in ("self", "cls")
        events = self._summary(helper, scope.depth + 1, scope.stack, self_class or (scope.self_class if on_self else None))
        bindings = bind_arguments(helper, call)
        for event in events:
            if _never_runs_with(event, bindings, helper, self.index.file.parent_map()):
                continue  # ``run_epoch(model, loader, loss_fn, None)``: what runs under ``if optimizer:`` does not
            out.append(self._rebind(event, bindings, scope, call, helper))

    def _inline_closure(self, closure: cst.BaseExpression, scope: _Scope, out: list[Event]) -> None:
        """``optimizer.step(closure)`` runs the closure first: its events belong before the step."""
        if type(closure) is cst.Name:
            helper = self.index.resolve_function(cst.Call(func=closure), scope.function)
            if helper is not None and helper not in scope.stack and scope.depth < MAX_INLINE_DEPTH:
                for event in self._summary(helper, scope.depth + 1, scope.stack):
                    out.append(dataclasses.replace(event, frames=scope.frames + event.frames, framework=event.framework or "closure", call_chain=scope.chain + event.call_chain))
        elif type(closure) is cst.Lambda:
            self._expression(closure.body, scope, out)

    def _rebind(
        self, event: Event, bindings: dict[str, cst.BaseExpression], scope: _Scope, call: cst.Call, helper: cst.FunctionDef,
    ) -> Event:
        changes: dict = {"frames": scope.frames + event.frames, "call_chain": scope.chain + (call,) + event.call_chain}
        element = _cleared_element(event, bindings)
        if element is not None:  # ``reset_grad([self.Encoder])``: ``for net in net_list: net.zero_grad()`` clears it alone
            changes["target"] = element
            changes["target_kind"] = self._kind(element) if self._kind(element) is ObjKind.OPTIMIZER else ObjKind.MODEL
        elif event.target is not None:
            head, _, rest = event.target.partition(".")
            if head in bindings:
                bound = dotted_name(bindings[head])
                if bound is not None:
                    new_target = f"{bound}.{rest}" if rest else bound
                    changes["target"] = new_target
                    if event.target_kind is ObjKind.UNKNOWN:
                        changes["target_kind"] = self._kind(new_target)
        if event.kind is EventKind.BACKWARD and not event.normalised and type(event.loss) is cst.Name:
            bound_loss = bindings.get(self._parameter_aliased(event.loss.value, helper, bindings))
            if bound_loss is not None and self._normalised(bound_loss, scope):
                changes["normalised"] = True
            if bound_loss is not None and not event.scaled and self._scaled_value(bound_loss, scope):
                changes["scaled"] = True  # ``self._backward(scaler.scale(loss))``: the helper backpropagates a scaled loss
        return dataclasses.replace(event, **changes)

    def _parameter_aliased(self, name: str, helper: cst.FunctionDef, bindings: dict[str, cst.BaseExpression]) -> str:
        """The parameter a helper's local only renames (``loss = lm_loss``, its one binding, never changed in place),
        or the name itself: the caller's division of ``lm_loss`` reaches ``loss.backward()``."""
        if name in bindings:
            return name
        values = self.index.assignments.get(helper, {}).get(name, [])
        if len(values) != 1 or type(values[0]) is not cst.Name or values[0].value not in bindings:
            return name
        if any(tracked_name(a.target) == name for a in self.index.augmented.get(helper, ())):
            return name
        return values[0].value

    def _scales(self, value: cst.BaseExpression) -> bool:
        """``scaler.scale(loss)``: a grad scaler's scaling of a loss; also ``scaler.scale(loss) if scaler else loss``,
        scaled whenever there is a scaler to step through."""
        if type(value) is cst.IfExp:
            return self._scales(_uncast(value.body)) or self._scales(_uncast(value.orelse))
        return type(value) is cst.Call and method_name(value) == "scale" and self._kind(dotted_name(receiver(value))) is ObjKind.SCALER

    def _scaling_call(self, value: cst.BaseExpression) -> cst.Call:
        """The ``scaler.scale(loss)`` call of a value :meth:`_scales` accepts (one branch of an ``if`` expression)."""
        while type(value) is cst.IfExp:
            value = _uncast(value.body) if self._scales(_uncast(value.body)) else _uncast(value.orelse)
        return value

    def _scaled_value(self, value: cst.BaseExpression, scope: _Scope) -> bool:
        """Whether ``value``, handed to a helper, is a scaled loss: ``scaler.scale(loss)``, or a name the calling
        function bound to one (``loss = self.scaler.scale(loss) if self.scaler else loss; self._backward(loss)``)."""
        value = _unreduced(_uncast(value))
        if self._scales(value):
            return True
        name = dotted_name(value)
        return name is not None and any(self._scales(_uncast(v)) for v in self._assigned(name, scope.function))


def _arithmetic(value: cst.BaseExpression) -> bool:
    """``total_loss / accum_steps``: a number computed from the count, no flag telling micro-batches apart (a remainder,
    ``(step + 1) % accum``, still is one)."""
    return type(value) is cst.BinaryOperation and type(value.operator) is not cst.Modulo


def _string_key(subscript: cst.Subscript) -> str | None:
    """The text of a subscript's one string-literal key (``config["is_warmup"]``), or None."""
    if len(subscript.slice) != 1 or type(subscript.slice[0].slice) is not cst.Index:
        return None
    key = subscript.slice[0].slice.value
    return key.evaluated_value if type(key) is cst.SimpleString and isinstance(key.evaluated_value, str) else None


def _reads_name(nodes: list[cst.CSTNode], name: str) -> bool:
    """Whether the expression whose nodes are ``nodes`` reads ``name`` (``loss`` in ``loss.float() * scale``, not in
    ``output.loss``, whose ``loss`` is an attribute's name)."""
    attributes = {id(n.attr) for n in nodes if type(n) is cst.Attribute}
    return any(
        tracked_name(n) == name for n in nodes
        if type(n) in (cst.Name, cst.Attribute, cst.Subscript) and id(n) not in attributes
    )


def _cleared_element(event: Event, bindings: dict[str, cst.BaseExpression]) -> str | None:
    """The one object a helper's ``for net in net_list: net.zero_grad()`` clears when the call hands ``net_list`` a
    one-element list (``self.reset_grad([self.Encoder])``); None otherwise."""
    if event.kind is not EventKind.ZERO or event.target is not None or type(event.node) is not cst.Call:
        return None
    loop = next((f.node for f in reversed(event.frames) if f.kind is FrameKind.LOOP), None)
    if type(loop) is not cst.For or type(loop.iter) is not cst.Name or type(loop.target) is not cst.Name:
        return None
    if type(event.node.func) is not cst.Attribute or not event.node.func.value.deep_equals(loop.target):
        return None
    return _only_element(bindings.get(loop.iter.value))


def _only_element(value: cst.BaseExpression | None) -> str | None:
    """The name in a one-element list or tuple handed to a helper (``[self.Encoder]``), else None."""
    if type(value) not in (cst.List, cst.Tuple) or len(value.elements) != 1 or type(value.elements[0]) is not cst.Element:
        return None
    return dotted_name(value.elements[0].value)


def _element_of_loop(node: cst.BaseExpression | None, frames: tuple[Frame, ...]) -> str | None:
    """``optimizers[opt]`` for ``opt`` in ``for opt in optimizers:`` (also ``enumerate(optimizers)``, ``zip(optimizers,
    ...)``, ``optimizers.values()`` or ``.items()``): the element of a named collection the loop is at, so that a clear
    of one element (``optimizers[1].zero_grad()``) may reach it."""
    if type(node) is not cst.Name:
        return None
    for frame in reversed(frames):
        if frame.kind is not FrameKind.LOOP or type(frame.node) is not cst.For:
            continue
        loop = frame.node
        if not any(type(n) is cst.Name and n.value == node.value for n in walk(loop.target)):
            continue
        iterable = _zipped_source(loop, node.value)
        if type(iterable) is cst.Call and callee_name(iterable) == "enumerate" and positional_args(iterable):
            iterable = positional_args(iterable)[0].value
        if type(iterable) is cst.Call and method_name(iterable) in ("values", "items") and not iterable.args:
            iterable = receiver(iterable)
        collection = dotted_name(iterable)
        return f"{collection}[{node.value}]" if collection is not None else None
    return None


def _assigns(node: cst.CSTNode, names: set[str]) -> bool:
    """Whether ``node`` binds one of ``names``: an assignment, an augmented one, or a ``for`` target."""
    if type(node) is cst.Assign:
        targets = [t.target for t in node.targets]
    elif type(node) in (cst.AugAssign, cst.AnnAssign):
        targets = [node.target]
    elif type(node) is cst.For:
        targets = [node.target]
    else:
        return False
    return any(type(n) is cst.Name and n.value in names for target in targets for n in walk(target))


_THRESHOLD_TESTS = (cst.GreaterThanEqual, cst.GreaterThan, cst.Equal)


def _counter_reaches_threshold(statement: cst.If) -> bool:
    """``if tokens_seen >= tokens_per_step: ...; tokens_seen = 0``: a running count the branch itself resets.

    Guards that count samples or tokens instead of micro-batches step once
    the count reaches its threshold and start counting again.
    """
    test = statement.test
    if type(test) is not cst.Comparison or len(test.comparisons) != 1:
        return False
    if not isinstance(test.comparisons[0].operator, _THRESHOLD_TESTS):
        return False
    counter = dotted_name(test.left) if type(test.left) in (cst.Name, cst.Attribute) else None
    return counter is not None and _resets(statement, counter)


_WAITING_COUNT = re.compile(r"warm|skip|wait|delay|patience|burn", re.IGNORECASE)


def _branch_smalls(statement: cst.If) -> list[cst.BaseSmallStatement]:
    """The simple statements of the ``if`` branch of ``statement``, in order (compound statements left out)."""
    lines = statement.body.body
    return list(lines) if type(statement.body) is cst.SimpleStatementSuite else [
        small for line in lines if type(line) is cst.SimpleStatementLine for small in line.body
    ]


def _resets(statement: cst.If, counter: str) -> bool:
    """Whether the body of ``statement`` sets ``counter`` back: ``counter = 0`` or ``counter -= ...`` among its lines."""
    for small in _branch_smalls(statement):
        if type(small) is cst.Assign and number(small.value) == 0 and any(dotted_name(t.target) == counter for t in small.targets):
            return True
        if type(small) is cst.AugAssign and type(small.operator) is cst.SubtractAssign and dotted_name(small.target) == counter:
            return True
    return False


# ``count > 1``, ``count != 1``, ``count >= 2``, ``count == 1``...: whether accumulation is on at all, and whether
# the body of such an ``if`` runs with accumulation on (True) or off (False).
_ON_WHEN = {(1.0, cst.GreaterThan): True, (1.0, cst.NotEqual): True, (1.0, cst.Equal): False, (1.0, cst.LessThanEqual): False,
            (2.0, cst.GreaterThanEqual): True, (2.0, cst.LessThan): False}
_MIRRORED = {cst.GreaterThan: cst.LessThan, cst.LessThan: cst.GreaterThan, cst.GreaterThanEqual: cst.LessThanEqual, cst.LessThanEqual: cst.GreaterThanEqual}


_RATE_NAME = re.compile(r"(^|_)(lr|learning_rate|rate)$", re.IGNORECASE)


def _handed_a_rate_or_gradients(call: cst.Call) -> bool:
    """``opt.step(lr)``, ``opt.step(lr=self.learning_rate)``, ``opt.step(0.01)``: a step handed a learning rate;
    ``opt.step([x.grad])``, ``opt.step(grads)``, ``opt.step(gradient_func())``: one handed the gradients to apply.
    torch's ``Optimizer.step`` takes only a closure: these are other libraries' optimizers (WholeGraph's sparse
    optimizers, Warp's, which apply the gradients they are handed)."""
    for arg in call.args:
        if arg.keyword is not None:
            if _RATE_NAME.search(arg.keyword.value):
                return True
            continue
        value = arg.value
        if type(value) in (cst.Float, cst.Integer, cst.List, cst.Tuple):
            return True
        named = value.func if type(value) is cst.Call else value
        name = dotted_name(named) if type(named) in (cst.Name, cst.Attribute) else None
        last = name.rsplit(".", 1)[-1] if name is not None else ""
        if _RATE_NAME.search(last) and named is value:
            return True
        if _GRADIENTS_NAME.search(last) and "closure" not in last.lower():
            return True
    return False


_GRADIENTS_NAME = re.compile(r"(^|_)(grads?|gradients?)(_|$)", re.IGNORECASE)


def _setting_test(test: cst.BaseExpression, counts: Collection[str] = ()) -> tuple[str, bool] | None:
    """For ``if args.gradient_accumulation_steps > 1:`` the setting tested and whether the body runs with accumulation
    on (``== 1``: off); None when the test is no comparison of an accumulation count against 1 or 2. A count that may
    be None is tested for presence first: ``if multiplier is not None and multiplier > 1:`` (its ``else`` runs with
    accumulation off too)."""
    if type(test) is cst.BooleanOperation and type(test.operator) is cst.And:
        found = [(term, _setting_test(term, counts)) for term in boolean_terms(test, cst.And)]
        tested = [setting for _, setting in found if setting is not None]
        if len(tested) == 1 and tested[0][1] and all(
            setting is not None or _presence_of(term, tested[0][0]) for term, setting in found
        ):
            return tested[0]
        return None
    if type(test) is not cst.Comparison or len(test.comparisons) != 1:
        return None
    operator, right, left = type(test.comparisons[0].operator), test.comparisons[0].comparator, test.left
    if number(left) is not None:
        left, right = right, left
        operator = _MIRRORED.get(operator, operator)
    on = _ON_WHEN.get((number(right), operator))
    name = dotted_name(left) if type(left) in (cst.Name, cst.Attribute) else None
    if name is None or on is None:
        return None
    last = name.rsplit(".", 1)[-1]
    if not (_ACCUMULATION_WORDS.search(last) and _COUNT_WORDS.search(last)) and not _MULTIPLIER.search(last) and name not in counts:
        return None  # ``counts``: what an accumulation guard of the function divides by, whatever its name
    return name, on


# A count of micro-batches per step named for the batch it multiplies (joeynmt's ``batch_multiplier``).
_MULTIPLIER = re.compile(r"batch_(size_)?multiplier$", re.IGNORECASE)


def _presence_of(term: cst.BaseExpression, name: str) -> bool:
    """``name`` or ``name is not None``."""
    if type(term) is cst.Comparison and len(term.comparisons) == 1 and type(term.comparisons[0].operator) is cst.IsNot:
        comparator = term.comparisons[0].comparator
        return type(comparator) is cst.Name and comparator.value == "None" and dotted_name(term.left) == name
    return type(term) in (cst.Name, cst.Attribute) and dotted_name(term) == name


def _accumulation_enabled(test: cst.BaseExpression, counts: Collection[str] = ()) -> bool:
    """``if args.gradient_accumulation_steps > 1:``: a test of the configured count against 1, not of the micro-batch.

    It has the same value on every batch, so neither of its branches is an
    accumulation guard (a ``%`` of the batch index inside one still is).
    """
    return _setting_test(test, counts) is not None


_COUNT_WORDS = re.compile(r"steps|iters?$|batches|count|^n_|_n$|num|freq|every|interval", re.IGNORECASE)


def _tested_name(test: cst.Comparison) -> str | None:
    """The name compared with a number in ``test``."""
    return dotted_name(test.left) if number(test.left) is None else dotted_name(test.comparisons[0].comparator)


def _counted_names(body: cst.CSTNode, walk: Callable[[cst.CSTNode], Iterator[cst.CSTNode]] = walk) -> frozenset[str]:
    """The names ``body`` uses as running counters (``accumulated += 1``, reset with ``= 0``), not settings."""
    names = set()
    for node in walk(body):
        if type(node) is cst.AugAssign:
            names.add(dotted_name(node.target))
        elif type(node) is cst.Assign and number(node.value) == 0:
            names.update(dotted_name(t.target) for t in node.targets)
    names.discard(None)
    return frozenset(names)


def _clips_gradient_norm(function: cst.FunctionDef, walk: Callable[[cst.CSTNode], Iterator[cst.CSTNode]] = walk) -> bool:
    """Whether a function is norm clipping written out, as torch's ``clip_grad_norm_`` is.

    It reads ``.grad``, computes a coefficient ``max_norm / (total_norm + eps)``,
    caps it at 1 (``if coef < 1:``, ``clamp(coef, max=1.0)``, ``min(coef, 1)``)
    and hands it to a call that scales the gradients (``g.mul_(coef)``,
    ``multi_tensor_applier(scale, buf, [grads, grads], coef)``). Whatever the
    function or its class is called: the body says it.
    """
    nodes = list(walk(function.body))
    if not any(type(n) is cst.Attribute and n.attr.value == "grad" for n in nodes):
        return False
    ratios: set[str] = set()  # names holding max_norm / (norm + eps)
    capped: set[str] = set()  # names holding it capped at 1
    for n in nodes:
        if type(n) is cst.Assign:
            names = {dotted_name(t.target) for t in n.targets} - {None}
            if _norm_ratio(n.value):
                ratios |= names
            elif _caps_at_one(n.value, ratios) or (_is_cap(n.value) and any(_norm_ratio(x) for x in _capped_values(n.value))):
                capped |= names
        elif type(n) is cst.Comparison and dotted_name(n.left) in ratios and len(n.comparisons) == 1:
            comparison = n.comparisons[0]
            if type(comparison.operator) in (cst.LessThan, cst.LessThanEqual) and number(comparison.comparator) == 1:
                capped.add(dotted_name(n.left))  # ``if clip_coef < 1:`` then scale by clip_coef
    return any(
        type(n) is cst.Call and not _is_cap(n) and any(dotted_name(a.value) in capped for a in n.args)
        for n in nodes
    )


_CAPS = ("clamp", "clamp_", "min", "clip")


def _is_cap(node: cst.BaseExpression) -> bool:
    """``torch.clamp(x, max=1.0)``, ``x.clamp_(max=1)``, ``min(x, 1.0)``: a value capped at 1."""
    return type(node) is cst.Call and callee_name(node) in _CAPS and any(number(a.value) == 1 for a in node.args)


def _capped_values(cap: cst.Call) -> list[cst.BaseExpression]:
    """What a cap caps: its arguments and, for a method, its receiver."""
    values = [a.value for a in cap.args]
    if type(cap.func) is cst.Attribute:
        values.append(cap.func.value)
    return values


def _caps_at_one(value: cst.BaseExpression, ratios: set[str]) -> bool:
    return _is_cap(value) and any(dotted_name(x) in ratios for x in _capped_values(value))


def _delegates(method: cst.FunctionDef | None, name: str) -> bool:
    """Whether a method calls the same method on an attribute of ``self`` that names an optimizer (``self._optimizer.step()``)."""
    if method is None:
        return False
    return any(
        type(node) is cst.Call and method_name(node) == name
        and (dotted_name(receiver(node)) or "").startswith("self.")
        and kind_from_name(dotted_name(receiver(node))) is ObjKind.OPTIMIZER
        for node in walk(method.body)
    )


_WORLD_SIZE = re.compile(r"^(world_size|num_processes|num_replicas|n_?gpus?|num_gpus|num_ranks|get_world_size|xrt_world_size)$")


def _by_no_count(expr: cst.BaseExpression, running: frozenset[str] = frozenset()) -> bool:
    """``loss / world_size``, ``loss / accum_n_steps``: every scaling divides by the number of ranks or a running counter.

    DDP averages over ranks; a counter that runs 1, 2, ... between steps weighs
    each micro-batch by its place, not by the number of micro-batches.
    """
    divisions = 0
    for node in walk(expr):
        if type(node) is cst.BinaryOperation and type(node.operator) is cst.Divide:
            if not _world_size(node.right) and not (type(node.right) is cst.Name and node.right.value in running):
                return False
            divisions += 1
        elif type(node) is cst.BinaryOperation and type(node.operator) is cst.Multiply:
            return False  # ``loss * scale / world_size``: the factor may divide by the micro-batches
        elif type(node) is cst.Call and callee_name(node) in SCALING_CALLS:
            return False
    return divisions > 0


def running_division(function: cst.FunctionDef | None, loss: str, index: ModuleIndex) -> cst.BinaryOperation | None:
    """The division of ``loss`` by a running micro-batch counter in ``function`` (``loss = loss / accum_n_steps``,
    ``loss /= n``), if the function divides it so: the line to change when it should divide by the count."""
    if function is None:
        return None
    running = _running_counters(function, index)
    if not running:
        return None
    for value in index.assignments.get(function, {}).get(loss, []):
        if (
            type(value) is cst.BinaryOperation and type(value.operator) is cst.Divide
            and type(value.right) is cst.Name and value.right.value in running
        ):
            return value
    return None


def _running_counters(function: cst.FunctionDef, index: ModuleIndex) -> frozenset[str]:
    """Local names counted up by ``+= 1`` and set back to 0 in a branch that tests them against a threshold.

    ``n += 1`` on each micro-batch, ``if n >= accum_steps: ...; n = 0``: ``n`` is
    1, 2, ... up to the count, never the count itself until the last micro-batch.
    """
    incremented = {
        node.target.value
        for node in index.augmented.get(function, ())
        if type(node.operator) is cst.AddAssign and type(node.target) is cst.Name and number(node.value) == 1
    }
    if not incremented:
        return frozenset()
    reset = set()
    for node in index.file.walk(function):
        if type(node) is not cst.If:
            continue
        tested = {
            comparison.left.value
            for comparison in walk(node.test)
            if type(comparison) is cst.Comparison and len(comparison.comparisons) == 1
            and type(comparison.left) is cst.Name and comparison.left.value in incremented
            and isinstance(comparison.comparisons[0].operator, _THRESHOLD_TESTS)
        }
        if tested and type(node.body) is cst.IndentedBlock:
            for line in node.body.body:
                if type(line) is cst.SimpleStatementLine:
                    for small in line.body:
                        if type(small) is cst.Assign and number(small.value) == 0:
                            reset.update(t.target.value for t in small.targets if type(t.target) is cst.Name and t.target.value in tested)
    return frozenset(reset)


def _world_size(node: cst.BaseExpression) -> bool:
    if type(node) is cst.Call:
        return not node.args and _WORLD_SIZE.search(callee_name(node) or "") is not None
    name = dotted_name(node)
    return name is not None and _WORLD_SIZE.search(name.rsplit(".", 1)[-1]) is not None


def _norm_ratio(value: cst.BaseExpression) -> bool:
    """``max_norm / (total_norm + 1e-6)``: a threshold over a norm plus a small epsilon."""
    if type(value) is not cst.BinaryOperation or type(value.operator) is not cst.Divide:
        return False
    denominator = value.right
    if type(denominator) is not cst.BinaryOperation or type(denominator.operator) is not cst.Add:
        return False
    epsilon = number(denominator.right)
    return epsilon is not None and 0 < epsilon <= 1e-3


def _loop_bound(name: str, frames: tuple[Frame, ...]) -> bool:
    """Whether ``name`` is the variable of a ``for`` loop around the code."""
    return any(
        f.kind is FrameKind.LOOP and type(f.node) is cst.For
        and any(type(n) is cst.Name and n.value == name for n in walk(f.node.target))
        for f in frames
    )


def _never_runs_with(event: Event, bindings: dict[str, cst.BaseExpression], helper: cst.FunctionDef, parents: dict) -> bool:
    """Whether an inlined helper's event sits under ``if param:`` or ``if param is not None:`` (written in the helper
    itself) of a parameter the call hands ``None`` (or ``False``): on that call the branch never runs (evaluation
    calls of ``run_epoch(..., None)``)."""
    for frame in event.frames:
        if frame.kind is not FrameKind.BRANCH or frame.branch != "if" or type(frame.node) is not cst.If:
            continue
        if not lies_under(parents, frame.node, helper):
            continue
        test = frame.node.test
        if (
            type(test) is cst.Comparison and len(test.comparisons) == 1
            and type(test.comparisons[0].operator) is cst.IsNot and type(test.comparisons[0].comparator) is cst.Name
            and test.comparisons[0].comparator.value == "None"
        ):
            test = test.left
        if type(test) is not cst.Name or test.value not in bindings:
            continue
        given = bindings[test.value]
        if type(given) is cst.Name and given.value in ("None", "False"):
            return True
    return False


def _argument(call: cst.Call, position: int, keyword: str) -> cst.BaseExpression | None:
    """The value a call hands a parameter, by its keyword or its position (-1: keyword only)."""
    given = keyword_arg(call, keyword)
    if given is not None:
        return given.value
    args = positional_args(call)
    if 0 <= position < len(args) and not any(a.star for a in args[: position + 1]):
        return args[position].value
    return None


def _body(suite: cst.BaseSuite) -> Sequence[cst.CSTNode]:
    """The statements of a block: an indented block's lines, or the small statements of a one-line suite."""
    return suite.body


def _uncast(node: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """``x`` for ``cast(T, x)`` / ``typing.cast(T, x)``: a type cast changes nothing at run time."""
    if type(node) is cst.Call and callee_name(node) == "cast":
        args = positional_args(node)
        if len(args) == 2:
            return args[1].value
    return node


def _zipped_source(loop: cst.For, name: str) -> cst.BaseExpression:
    """What binds ``name`` in a loop: for ``for a, b in zip(xs, ys)``, ``ys`` for ``b``; else the whole iterable."""
    target, iterable = loop.target, loop.iter
    if type(target) in (cst.Tuple, cst.List) and type(iterable) is cst.Call and callee_name(iterable) == "zip":
        args = positional_args(iterable)
        if len(args) == len(target.elements) and not any(a.star for a in args):
            for element, arg in zip(target.elements, args):
                if type(element.value) is cst.Name and element.value.value == name:
                    return arg.value
    return iterable


def _unreduced(node: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """``x`` for ``x.mean()`` / ``x.sum()``: a reduction is linear, so it keeps a loss scale (and a division) it is given."""
    while type(node) is cst.Call and method_name(node) in ("mean", "sum") and not node.args:
        node = receiver(node)
    return node


def _within(scope: _Scope, frame: Frame) -> _Scope:
    return dataclasses.replace(scope, frames=scope.frames + (frame,))


# In a communication hook's divisor, as written: the number of ranks (``process_group.size()``, ``world_size``).
_RANK_COUNT_TEXT = re.compile(r"world_size|get_world_size|group_size|\.size\(\)")


def _divides_beyond_world_size(function: cst.FunctionDef) -> bool:
    """Whether a function divides by something other than the number of ranks (``bucket.buffer().div_(num_tokens)``)."""
    module = cst.Module(body=[])
    for node in walk(function, into_lambdas=True):
        divisor = None
        if type(node) is cst.BinaryOperation and type(node.operator) is cst.Divide:
            divisor = node.right
        elif type(node) is cst.Call and callee_name(node) in ("div", "div_") and positional_args(node):
            divisor = positional_args(node)[-1].value
        if divisor is not None and not _RANK_COUNT_TEXT.search(module.code_for_node(divisor)):
            return True
    return False


# Reductions whose value depends on the gradients' scale, read as statistics (``p.grad.norm()``, ``p.grad.abs().max()``).
_STATISTICS = frozenset({"norm", "vector_norm", "max", "min", "amax", "amin", "mean", "sum", "std", "var"})
# Functions that take the tensor first: ``torch.norm(p.grad)``, ``torch.linalg.vector_norm(p.grad)``.
_STATISTIC_FUNCTIONS = frozenset({"norm", "vector_norm"})
_NORM_MODULES = frozenset({"torch", "torch.linalg", "linalg", "np.linalg", "numpy.linalg"})
_HISTOGRAMS = frozenset({"add_histogram", "Histogram", "histogram", "histc"})
# What keeps a tensor the gradient it came from, as far as its scale goes.
_SAME_SCALE = frozenset({"detach", "float", "double", "half", "cpu", "clone", "abs", "flatten", "view", "reshape", "to", "contiguous", "numpy"})


def _reads_grad_statistic(call: cst.Call, method: str | None, recv: cst.BaseExpression | None) -> bool:
    """A statistic of a gradient: a reduction of ``p.grad`` (``p.grad.norm()``, ``p.grad.detach().abs().max()``,
    ``torch.norm(p.grad)``) or a histogram of it (``writer.add_histogram(name, p.grad, step)``)."""
    if method in _STATISTICS and type(call.func) is cst.Attribute and _of_grad(recv):
        return True
    name = callee_name(call)
    args = positional_args(call)
    if name in _STATISTIC_FUNCTIONS and (type(call.func) is not cst.Attribute or dotted_name(call.func.value) in _NORM_MODULES):
        return bool(args) and _of_grad(args[0].value)
    if name in _HISTOGRAMS:
        return any(_of_grad(arg.value) for arg in call.args)
    return False


def _of_grad(node: cst.BaseExpression | None) -> bool:
    """Whether a tensor expression is a gradient at its own scale: ``p.grad``, ``p.grad.data``, ``p.grad.detach().cpu()``."""
    while True:
        if is_grad(node):
            return True
        if type(node) is cst.Attribute and node.attr.value == "data":
            node = node.value
        elif type(node) is cst.Call and method_name(node) in _SAME_SCALE:
            node = receiver(node)
        else:
            return False


# A callable held under a name that says it clips gradients: ``self.gradient_clipper(model)``, ``grad_clipper(params)``.
_CLIPPER = re.compile(r"^_?(grad|gradient)s?_?clipper$")


def _configured_clipper(call: cst.Call) -> bool:
    """``self.gradient_clipper(model)``: a call of a name or ``self.`` attribute that holds a gradient clipper built
    elsewhere (a configured ``clip_grad_norm_`` partial or lambda); the module cannot see into it, and the name says
    what it does."""
    func = call.func
    if type(func) is cst.Attribute and not (type(func.value) is cst.Name and func.value.value == "self"):
        return False
    name = dotted_name(func)
    return name is not None and _CLIPPER.search(name.rsplit(".", 1)[-1]) is not None


def _scales_gradients(call: cst.Call, method: str | None, assigned: Callable[[str], list]) -> bool:
    """``optimizer.multiply_grads(1 / n)``, ``scale_grads_(model.parameters(), 1.0 / tokens)``: every gradient divided
    at once; also by a name every assignment of which divides (``factor = world_size / sample_size``, then
    ``multiply_grads(optim, factor)``: wav2vec2's trainer)."""
    name = callee_name(call) or ""
    if "grad" not in name.lower() or name in _CLIP_FUNCTIONS or name in frameworks.CLIP_METHODS:
        return False
    for arg in call.args:
        if contains_division(arg.value):
            return True
        if type(arg.value) is cst.Name:
            values = assigned(arg.value.value)
            if values and all(isinstance(v, cst.BaseExpression) and contains_division(v) for v in values):
                return True
    return False


def _switches_off_grad_sync(assign: cst.Assign) -> bool:
    """``ddp.require_backward_grad_sync = flag``: a wrapper's sync flag set (anything but a literal True)."""
    target = assign.targets[-1].target
    return (
        type(target) is cst.Attribute
        and target.attr.value in frameworks.SYNC_FLAGS
        and bool_literal(assign.value) is not True
    )


def _holds_no_sync(value: cst.BaseExpression, walk: Callable[[cst.CSTNode], Iterator[cst.CSTNode]] = walk) -> bool:
    """Whether an assigned value names a ``no_sync`` context without entering it (``model.no_sync``, uncalled)."""
    nodes = list(walk(value))
    called = {id(node.func) for node in nodes if type(node) is cst.Call}
    return any(
        type(node) is cst.Attribute and node.attr.value in frameworks.NO_SYNC and id(node) not in called
        for node in nodes
    )


def _is_zero_literal(args: list[cst.Arg]) -> bool:
    return bool(args) and number(args[0].value) == 0


def _grad_holder(grad: cst.BaseExpression) -> cst.BaseExpression:
    """``p`` for ``p.grad`` or ``p.grad.data``."""
    if type(grad) is cst.Attribute and grad.attr.value == "data":
        grad = grad.value
    return grad.value if type(grad) is cst.Attribute else grad


def _is_zeroing_value(value: cst.BaseExpression) -> bool:
    """``0 * p.grad``, ``p.grad * 0``, ``torch.zeros_like(p.grad)``: the old gradient's shape, all zeros."""
    if type(value) is cst.BinaryOperation and type(value.operator) is cst.Multiply:
        return any(number(side) == 0 for side in (value.left, value.right))
    if type(value) is cst.Call and callee_name(value) == "zeros_like":
        args = positional_args(value)
        return bool(args) and is_grad(args[0].value)
    return False


def _set_to_none(call: cst.Call) -> bool | None:
    """The literal ``set_to_none`` given to ``zero_grad``; None when it is left to the default (True)."""
    arg = keyword_arg(call, "set_to_none")
    if arg is None:
        args = positional_args(call)
        arg = args[0] if args else None
    return bool_literal(arg.value) if arg is not None else None


def _object_named(node: cst.BaseExpression) -> str | None:
    """The name an object goes by, as a receiver or as an argument (``optimizer["generator"]`` for an element)."""
    return element_name(node) if type(node) is cst.Subscript else dotted_name(node)


def _conditional_frames(
    call: cst.Call, top: cst.CSTNode, parents: dict, branches: dict[tuple[int, str], Frame]
) -> tuple[Frame, ...]:
    """The branches of conditional expressions between ``top`` and a call in it (``a.step() if c else b.step()``:
    the two calls never both run). One frame per side of each expression, shared by every call on that side."""
    found: list[Frame] = []
    child, parent = call, parents.get(call)
    while parent is not None and child is not top:
        if type(parent) is cst.IfExp and child is not parent.test:
            side = "if" if child is parent.body else "else"
            frame = branches.get((id(parent), side))
            if frame is None:
                frame = branches[(id(parent), side)] = Frame(FrameKind.BRANCH, parent, side)
            found.append(frame)
        child, parent = parent, parents.get(parent)
    return tuple(reversed(found))
