"""The training-loop model: what each piece of a module does to gradients, in program order.

``build_model(module)`` reads a LibCST module once and produces a
:class:`LoopModel`: the tracked objects (optimizers, scalers, schedulers,
models), and for the module body and every function a *root*: the ordered
:class:`Event` list of that code, with calls into helpers of the same module
replaced by the helper's own events. Each event carries its *frames*: the
loops, branches and ``with`` blocks around it, outermost first, so a rule can
ask "is this step under an accumulation guard?" or "which loop holds both
the backward and the step?" without walking the syntax tree itself.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Sequence
from typing import Union

import libcst as cst

from gradlint.events import EventKind
from gradlint.imports import ImportMap
from gradlint.objects import ObjInfo, ObjKind, kind_from_name, kind_of_constructor, last_name
from gradlint.positions import Positions
from gradlint.release import ReleaseInfo, find_release
from gradlint.syntax import (
    bool_literal,
    callee_name,
    calls_in_evaluation_order,
    TRIVIA,
    children,
    dotted_name,
    keyword_arg,
    method_name,
    positional_args,
    receiver,
    number,
    root_name,
    scales_down,
    walk,
)

# Events the model records beyond the shared vocabulary: they matter to the
# static rules only (what the source shows but a run does not need).
HANDOFF = "HANDOFF"  # an optimizer is passed to code the model cannot see
GRAD_DIVIDE = "GRAD_DIVIDE"  # gradients are divided in place (p.grad /= n): accumulation normalised by hand
NO_SYNC = "NO_SYNC"  # gradient all-reduce switched off: model.no_sync(), model.require_backward_grad_sync = flag

Kind = Union[EventKind, str]

# How deep helper calls are followed, and how many events one root may hold.
MAX_INLINE_DEPTH = 4
MAX_ROOT_EVENTS = 5000


class FrameKind(str, enum.Enum):
    """What surrounds an event."""

    LOOP = "loop"
    BRANCH = "branch"
    WITH = "with"


@dataclasses.dataclass(eq=False)
class Frame:
    """One loop, branch or ``with`` block around an event. Compared by identity.

    For a branch, ``accumulation`` says the test decides whether this
    micro-batch steps (``(i + 1) % k == 0``, ``accelerator.sync_gradients``,
    a flag computed from such a test) and ``count`` holds the ``k`` when it is
    visible. ``branch`` is ``"if"``, ``"else"`` or ``"after"`` (the rest of a
    block after ``if not boundary: continue``).
    """

    kind: FrameKind
    node: cst.CSTNode
    branch: str = ""
    accumulation: bool = False
    count: cst.BaseExpression | None = None
    context: str | None = None  # WITH: "no_sync", "accumulate", "autocast"
    exits: bool = False  # BRANCH: its block ends by leaving (continue, break, return, raise)

    def __repr__(self) -> str:
        extra = f" {self.branch}" if self.branch else ""
        extra += " accumulation" if self.accumulation else ""
        extra += f" {self.context}" if self.context else ""
        return f"<{self.kind.value}{extra}>"


@dataclasses.dataclass(frozen=True)
class Event:
    """One thing a statement does to gradients, with where it is and what surrounds it."""

    kind: Kind
    node: cst.CSTNode  # what a finding points at (usually the call)
    frames: tuple[Frame, ...]
    target: str | None = None  # the optimizer (STEP, UNSCALE, ZERO of an optimizer), model or scaler
    target_kind: ObjKind = ObjKind.UNKNOWN
    set_to_none: bool | None = None  # ZERO: False when the buffers are kept
    manual: bool = False  # ZERO: a hand-written p.grad loop rather than zero_grad()
    via_scaler: str | None = None  # STEP: the scaler that steps this optimizer
    scaled: bool = False  # BACKWARD: through scaler.scale(loss)
    normalised: bool = False  # BACKWARD: the loss was divided before backward
    framework: str | None = None  # who does the bookkeeping: "accelerate", "lightning", "closure", ...
    loss: cst.BaseExpression | None = None  # BACKWARD: the expression backpropagated
    has_args: bool = False  # SCHED_STEP: stepped with an argument (a metric or an epoch)
    call_chain: tuple[cst.Call, ...] = ()  # the helper calls this event was inlined through

    @property
    def loops(self) -> tuple[Frame, ...]:
        """The loops around this event, outermost first."""
        return tuple(f for f in self.frames if f.kind is FrameKind.LOOP)

    def inside(self, frame: Frame) -> bool:
        """Whether ``frame`` surrounds this event."""
        return any(f is frame for f in self.frames)

    def with_context(self, context: str) -> bool:
        """Whether a ``with`` block of this context (``no_sync``, ``accumulate``) surrounds the event."""
        return any(f.kind is FrameKind.WITH and f.context == context for f in self.frames)


@dataclasses.dataclass
class Root:
    """A piece of code read top to bottom: the module body or one function, helpers inlined.

    The rules ask the same questions of every step of a loop ("which events
    are in this loop?", "does it backpropagate?"), so the answers are indexed
    once, on first use: asking stays linear in the size of the root.
    """

    name: str
    node: cst.CSTNode
    events: list[Event]
    _by_frame: dict[int, list[Event]] | None = dataclasses.field(default=None, repr=False, compare=False)
    _kinds: dict[int, frozenset] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    _order: dict[int, int] | None = dataclasses.field(default=None, repr=False, compare=False)
    _of_kind: dict[tuple, list[Event]] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def loops(self) -> list[Frame]:
        """Every loop that holds at least one event, outer loops before inner ones."""
        seen: dict[int, Frame] = {}
        for event in self.events:
            for frame in event.loops:
                seen.setdefault(id(frame), frame)
        return list(seen.values())

    def events_in(self, frame: Frame) -> list[Event]:
        """The events inside ``frame``, in program order (a shared list: do not change it)."""
        if self._by_frame is None:
            index: dict[int, list[Event]] = {}
            for event in self.events:
                for id_ in {id(f) for f in event.frames}:  # a frame may repeat when a helper is inlined into itself
                    index.setdefault(id_, []).append(event)
            self._by_frame = index
        return self._by_frame.get(id(frame), [])

    def kinds_in(self, frame: Frame | None) -> frozenset:
        """The kinds of event inside ``frame`` (None: the whole root)."""
        key = id(frame)
        if key not in self._kinds:
            events = self.events if frame is None else self.events_in(frame)
            self._kinds[key] = frozenset(e.kind for e in events)
        return self._kinds[key]

    def events_of(self, kind: Kind, frame: Frame | None = None) -> list[Event]:
        """The events of one kind inside ``frame`` (None: the whole root), in program order (a shared list)."""
        key = (kind, id(frame))
        if key not in self._of_kind:
            events = self.events if frame is None else self.events_in(frame)
            self._of_kind[key] = [e for e in events if e.kind == kind]
        return self._of_kind[key]

    def order(self, event: Event) -> int:
        """The position of an event of this root in program order."""
        if self._order is None:
            self._order = {id(e): i for i, e in enumerate(self.events)}
        return self._order[id(event)]


@dataclasses.dataclass
class LoopModel:
    """Everything the rules read about one module."""

    module: cst.Module
    objects: dict[str, ObjInfo]
    roots: list[Root]
    uses_cuda_graphs: bool
    _positions: Positions | None = None
    release: ReleaseInfo = dataclasses.field(default_factory=ReleaseInfo)  # gradient-release set-ups

    def position(self, node: cst.CSTNode) -> tuple[int, int, int, int]:
        """``(line, column, end_line, end_column)`` of a node, 1-based columns, end exclusive.

        Positions are resolved on first use only, one top-level statement at a time: most modules have no findings.
        """
        if self._positions is None:
            self._positions = Positions(self.module)
        code_range = self._positions[node]
        return (code_range.start.line, code_range.start.column + 1, code_range.end.line, code_range.end.column + 1)

    def line(self, node: cst.CSTNode) -> int:
        """The 1-based line a node starts on."""
        return self.position(node)[0]

    def code(self, node: cst.CSTNode) -> str:
        """The source text of a node, as written."""
        return self.module.code_for_node(node).strip()

    def info(self, name: str | None) -> ObjInfo:
        """What is known about a dotted name; guessed from the spelling when nothing else is."""
        if name is None:
            return ObjInfo(ObjKind.UNKNOWN)
        known = self.objects.get(name)
        if known is not None:
            return known
        return ObjInfo(kind_from_name(name))

    def all_param_sources(self) -> dict[str, frozenset[str]]:
        """For each optimizer whose parameters are known: the models it was built from."""
        return {
            last_name(name): info.param_sources
            for name, info in self.objects.items()
            if info.kind is ObjKind.OPTIMIZER and info.param_sources
        }


# --------------------------------------------------------------------------- building


def build_model(module: cst.Module, text: str | None = None) -> LoopModel:
    """Build the loop model of one parsed module; ``text``, its source when the caller has it, saves regenerating it."""
    index = _ModuleIndex(module)
    index.text = text
    builder = _EventBuilder(index)
    roots = [Root("<module>", module, builder.root_events(None))]
    for function in index.functions:
        roots.append(Root(index.qualname[function], function, builder.root_events(function)))
    roots = [r for r in roots if r.events]
    return LoopModel(
        module=module,
        objects=index.objects,
        roots=roots,
        uses_cuda_graphs=index.uses_cuda_graphs,
        release=find_release(index),
    )


# Words that mark a branch test as "this micro-batch steps": accumulation guards.
_ACCUMULATION_WORDS = re.compile(
    r"accum|sync_grad|grad(ient)?_?step|boundary|should_step|do_step|is_last_micro|optimi[sz]er_step|update_step|"
    r"take_step|step_now|is_accumulating",
    re.IGNORECASE,
)
_FRAMEWORK_BACKWARD = {"accelerator": "accelerate", "fabric": "fabric", "engine": "deepspeed", "model_engine": "deepspeed"}
_CLIP_FUNCTIONS = {"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"}
_CLEAR_HELPER = re.compile(r"(zero|clear|reset)_?grad", re.IGNORECASE)


# The node types ``_ModuleIndex._note`` looks at; the scan skips the call for all others.
_NOTED = frozenset(
    {cst.Import, cst.ImportFrom, cst.Assign, cst.AnnAssign, cst.AugAssign, cst.WithItem, cst.Return, cst.Attribute, cst.Name, cst.Arg}
)


class _ModuleIndex:
    """One pass over the module: functions, classes, assignments and tracked objects."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.text: str | None = None  # the source, when the caller has it
        self.imports = ImportMap()
        self.functions: list[cst.FunctionDef] = []
        self.qualname: dict[cst.FunctionDef, str] = {}
        self.class_of: dict[cst.FunctionDef, str | None] = {}
        self.parent_function: dict[cst.FunctionDef, cst.FunctionDef | None] = {}
        self.module_functions: dict[str, cst.FunctionDef] = {}
        self.class_methods: dict[str, dict[str, cst.FunctionDef]] = {}
        self.class_bases: dict[str, list[str]] = {}
        self.nested: dict[cst.FunctionDef | None, dict[str, cst.FunctionDef]] = {None: {}}
        # Per function (None: module level): name -> every expression assigned to it.
        self.assignments: dict[cst.FunctionDef | None, dict[str, list[cst.BaseExpression]]] = {}
        self.divided_names: dict[cst.FunctionDef | None, set[str]] = {}
        self.returns_divided: set[cst.FunctionDef] = set()
        self._returned: dict[cst.FunctionDef, list[cst.BaseExpression]] = {}
        self.objects: dict[str, ObjInfo] = {}
        self.uses_cuda_graphs = False
        self._scan(module)
        self._find_divided_returns()
        self._classify_objects()

    # -- names

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """The qualified names a name or attribute node stands for, through the module's imports."""
        return self.imports.qualify(node)

    def resolve_function(self, call: cst.Call, function: cst.FunctionDef | None) -> cst.FunctionDef | None:
        """The function of this module a call lands in: a nested def, a module function or ``self.method``."""
        func = call.func
        if isinstance(func, cst.Name):
            scope = function
            while True:
                found = self.nested.get(scope, {}).get(func.value)
                if found is not None:
                    return found
                if scope is None:
                    return None
                scope = self.parent_function.get(scope)
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in ("self", "cls"):
            owner = self.class_of.get(function) if function is not None else None
            while function is not None and owner is None:
                function = self.parent_function.get(function)
                owner = self.class_of.get(function) if function is not None else None
            return self._method(owner, func.attr.value, set()) if owner else None
        return None

    def _method(self, class_name: str, name: str, seen: set[str]) -> cst.FunctionDef | None:
        if class_name in seen:
            return None
        seen.add(class_name)
        found = self.class_methods.get(class_name, {}).get(name)
        if found is not None:
            return found
        for base in self.class_bases.get(class_name, []):
            found = self._method(base, name, seen)
            if found is not None:
                return found
        return None

    # -- scanning

    def _scan(self, module: cst.Module) -> None:
        """Index every function and class, and note assignments, in one iterative pass."""
        # (node, enclosing function, enclosing class for direct methods, qualified-name prefix)
        stack: list[tuple[cst.CSTNode, cst.FunctionDef | None, str | None, str]] = [(module, None, None, "")]
        while stack:
            node, function, class_name, prefix = stack.pop()
            for child in children(node):
                if isinstance(child, cst.FunctionDef):
                    self._add_function(child, function, class_name, prefix)
                    stack.append((child, child, None, f"{prefix}{child.name.value}."))
                elif isinstance(child, cst.ClassDef):
                    name = child.name.value
                    self.class_bases[name] = [last_name(b) for b in (dotted_name(a.value) for a in child.bases) if b]
                    self.class_methods.setdefault(name, {})
                    stack.append((child, function, name, f"{prefix}{name}."))
                else:
                    if type(child) in _NOTED:
                        self._note(child, function)
                    if type(child) not in TRIVIA:
                        stack.append((child, function, class_name, prefix))

    def _add_function(self, node: cst.FunctionDef, parent: cst.FunctionDef | None, class_name: str | None, prefix: str) -> None:
        self.functions.append(node)
        self.qualname[node] = f"{prefix}{node.name.value}"
        self.class_of[node] = class_name
        self.parent_function[node] = parent
        if class_name is not None:
            self.class_methods.setdefault(class_name, {})[node.name.value] = node
        else:
            self.nested.setdefault(parent, {})[node.name.value] = node
            if parent is None:
                self.module_functions[node.name.value] = node
        self.nested.setdefault(node, {})

    def _note(self, node: cst.CSTNode, function: cst.FunctionDef | None) -> None:
        """Record imports, assignments, returns and CUDA-graph use seen at ``node``."""
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            self.imports.add(node)
        elif isinstance(node, cst.Assign):
            for target in node.targets:
                self._assign(target.target, node.value, function)
        elif isinstance(node, cst.AnnAssign) and node.value is not None:
            self._assign(node.target, node.value, function)
        elif isinstance(node, cst.AugAssign):
            name = dotted_name(node.target)
            if name and isinstance(node.operator, (cst.DivideAssign, cst.MultiplyAssign)):
                if isinstance(node.operator, cst.DivideAssign) or scales_down(node.value) or _is_fraction(node.value):
                    self.divided_names.setdefault(function, set()).add(name)
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            self._assign(node.asname.name, node.item, function)
        elif isinstance(node, cst.Return) and node.value is not None and function is not None:
            self._returned.setdefault(function, []).append(node.value)
        elif isinstance(node, (cst.Attribute, cst.Name)) and not self.uses_cuda_graphs:
            name = dotted_name(node) or ""
            if name.endswith(("CUDAGraph", "cuda.graph", "make_graphed_callables")):
                self.uses_cuda_graphs = True
        elif isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value == "capturable":
            if bool_literal(node.value) is True:
                self.uses_cuda_graphs = True

    def _find_divided_returns(self) -> None:
        """Helpers that return a divided loss: ``return loss / n``, or ``loss = loss / n`` then ``return loss``.

        Run after the whole scan: a function's assignments are not all seen before its returns.
        """
        for function, values in self._returned.items():
            divided = self.divided_names.get(function, set())
            if any(scales_down(v) or dotted_name(v) in divided for v in values):
                self.returns_divided.add(function)

    def _assign(self, target: cst.BaseExpression, value: cst.BaseExpression, function: cst.FunctionDef | None) -> None:
        table = self.assignments.setdefault(function, {})
        if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)) and len(target.elements) == len(value.elements):
            for t, v in zip(target.elements, value.elements):
                self._assign(t.value, v.value, function)
            return
        if isinstance(target, (cst.Tuple, cst.List)):
            for position, element in enumerate(target.elements):
                name = dotted_name(element.value)
                if name:
                    table.setdefault(name, []).append(_Unpacked(value, position))
            return
        name = dotted_name(target)
        if name:
            table.setdefault(name, []).append(value)
            if scales_down(value):
                self.divided_names.setdefault(function, set()).add(name)

    # -- objects

    def _classify_objects(self) -> None:
        """Give each assigned name a kind from what was assigned to it."""
        pending: list[tuple[str, cst.BaseExpression]] = []
        for table in self.assignments.values():
            for name, values in table.items():
                for value in values:
                    pending.append((name, value))
        # Two passes: the second sees aliases (``opt = self.optimizer``) of names the first classified.
        for _ in range(2):
            for name, value in pending:
                info = self._classify_value(value)
                if info is not None and (name not in self.objects or self.objects[name].kind is ObjKind.UNKNOWN):
                    self.objects[name] = info

    def _classify_value(self, value: cst.BaseExpression) -> ObjInfo | None:
        if isinstance(value, _Unpacked):
            return self._classify_unpacked(value)
        if isinstance(value, (cst.Name, cst.Attribute)):
            alias = dotted_name(value)
            return self.objects.get(alias) if alias else None
        if not isinstance(value, cst.Call):
            return None
        for qualified in self.qualified_names(value.func):
            kind = kind_of_constructor(qualified)
            if kind is ObjKind.OPTIMIZER:
                return ObjInfo(kind, param_sources=_parameter_sources(value))
            if kind is ObjKind.DDP_MODEL:
                args = positional_args(value)
                return ObjInfo(kind, wraps=dotted_name(args[0].value) if args else None)
            if kind is not None:
                return ObjInfo(kind)
        name = callee_name(value) or ""
        if name in ("prepare", "prepare_model") and len(positional_args(value)) == 1:
            return self._classify_value(positional_args(value)[0].value)
        if re.search(r"optimi[sz]er", name, re.IGNORECASE) and not name.endswith("_step"):
            return ObjInfo(ObjKind.OPTIMIZER)
        if re.search(r"GradScaler|NativeScaler", name):
            return ObjInfo(ObjKind.SCALER)
        return None

    def _classify_unpacked(self, value: "_Unpacked") -> ObjInfo | None:
        """``model, opt = accelerator.prepare(model, opt)``: element ``i`` is what argument ``i`` was."""
        call = value.value
        if isinstance(call, cst.Call) and callee_name(call) in ("prepare", "setup", "initialize"):
            args = positional_args(call)
            if callee_name(call) == "initialize":  # deepspeed.initialize -> (engine, optimizer, loader, scheduler)
                return {1: ObjInfo(ObjKind.OPTIMIZER), 3: ObjInfo(ObjKind.SCHEDULER)}.get(value.position)
            if value.position < len(args):
                return self._classify_value(args[value.position].value)
        return None


@dataclasses.dataclass(frozen=True)
class _Unpacked:
    """Element ``position`` of a value unpacked into a tuple (``model, opt = accelerator.prepare(...)``)."""

    value: cst.BaseExpression
    position: int


def _is_fraction(node: cst.BaseExpression) -> bool:
    value = number(node)
    return value is not None and value < 1


def _parameter_sources(call: cst.Call) -> frozenset[str]:
    """The models whose ``.parameters()`` an optimizer constructor was given."""
    sources = set()
    for arg in call.args:
        for node in walk(arg):
            if isinstance(node, cst.Call) and callee_name(node) in ("parameters", "named_parameters"):
                owner = dotted_name(receiver(node))
                if owner:
                    sources.add(last_name(owner))
    return frozenset(sources)


@dataclasses.dataclass
class _Scope:
    """Where the builder is: which function, inside which frames, through which helper calls."""

    function: cst.FunctionDef | None
    frames: tuple[Frame, ...]
    depth: int
    stack: tuple[cst.FunctionDef, ...]
    chain: tuple[cst.Call, ...]


class _EventBuilder:
    """Turns statements into events, inlining helpers of the same module."""

    def __init__(self, index: _ModuleIndex) -> None:
        self.index = index
        self._summaries: dict[tuple[cst.FunctionDef, int], list[Event]] = {}

    def root_events(self, function: cst.FunctionDef | None) -> list[Event]:
        """The events of the module body (``None``) or of one function, helpers inlined."""
        if function is None:
            scope = _Scope(None, (), 0, (), ())
            events: list[Event] = []
            self._block(self.index.module.body, scope, events)
            return events
        return self._summary(function, depth=0, stack=())

    def _summary(self, function: cst.FunctionDef, depth: int, stack: tuple[cst.FunctionDef, ...]) -> list[Event]:
        """A function's events, computed once per inlining depth (deeper copies see fewer nested helpers)."""
        key = (function, depth)
        if key in self._summaries:
            return self._summaries[key]
        events: list[Event] = []
        scope = _Scope(function, (), depth, stack + (function,), ())
        body = function.body.body if isinstance(function.body, cst.IndentedBlock) else [function.body]
        self._block(body, scope, events)
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
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                self._simple(small, scope, out)
        elif isinstance(statement, cst.If):
            self._if(statement, scope, out)
        elif isinstance(statement, (cst.For, cst.While)):
            head = statement.iter if isinstance(statement, cst.For) else statement.test
            self._expression(head, scope, out)
            loop = Frame(FrameKind.LOOP, statement)
            self._block(statement.body.body, _within(scope, loop), out)
            if statement.orelse is not None:
                self._block(statement.orelse.body.body, scope, out)
        elif isinstance(statement, cst.With):
            frames = scope.frames
            for item in statement.items:
                self._expression(item.item, scope, out)
                context = self._with_context(item.item)
                if context is not None:
                    frames = frames + (Frame(FrameKind.WITH, statement, context=context),)
            self._block(statement.body.body, dataclasses.replace(scope, frames=frames), out)
        elif isinstance(statement, cst.Try) or type(statement).__name__ == "TryStar":
            self._block(statement.body.body, scope, out)
            for handler in statement.handlers:
                self._block(handler.body.body, scope, out)
            if statement.orelse is not None:
                self._block(statement.orelse.body.body, scope, out)
            if statement.finalbody is not None:
                self._block(statement.finalbody.body.body, scope, out)
        elif isinstance(statement, cst.Match):
            self._expression(statement.subject, scope, out)
            for case in statement.cases:
                self._block(case.body.body, scope, out)
        # Function and class definitions are roots of their own; nothing runs here.

    def _if(self, statement: cst.If, scope: _Scope, out: list[Event]) -> None:
        self._expression(statement.test, scope, out)
        accumulation, count = self._guard(statement.test, scope.function)
        body_frame = Frame(FrameKind.BRANCH, statement, "if", accumulation, count, exits=_leaves(statement.body))
        self._block(statement.body.body, _within(scope, body_frame), out)
        orelse = statement.orelse
        if orelse is None:
            return
        else_frame = Frame(FrameKind.BRANCH, statement, "else", accumulation, count, exits=not isinstance(orelse, cst.If) and _leaves(orelse.body))
        if isinstance(orelse, cst.If):
            self._if(orelse, _within(scope, else_frame), out)
        else:
            self._block(orelse.body.body, _within(scope, else_frame), out)

    def _continue_guard(self, statement: cst.CSTNode, function: cst.FunctionDef | None) -> Frame | None:
        """``if not boundary: continue`` puts the rest of the block under an accumulation guard."""
        if not isinstance(statement, cst.If) or statement.orelse is not None:
            return None
        body = statement.body.body
        if not (len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine)):
            return None
        if not all(isinstance(s, cst.Continue) for s in body[0].body):
            return None
        accumulation, count = self._guard(statement.test, function)
        if not accumulation:
            return None
        return Frame(FrameKind.BRANCH, statement, "after", True, count)

    def _guard(self, test: cst.BaseExpression, function: cst.FunctionDef | None, depth: int = 0) -> tuple[bool, cst.BaseExpression | None]:
        """Whether a branch test is an accumulation guard, and the micro-batch count it uses."""
        for node in walk(test):
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
                return True, node.right
        for node in walk(test):
            name = dotted_name(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
            if name is None:
                continue
            if _ACCUMULATION_WORDS.search(name):
                return True, None
            if depth < 2 and isinstance(node, cst.Name):
                for value in self._assigned(name, function):
                    if not isinstance(value, _Unpacked):
                        found, count = self._guard(value, function, depth + 1)
                        if found:
                            return True, count
        return False, None

    def _assigned(self, name: str, function: cst.FunctionDef | None) -> list[cst.BaseExpression]:
        values = list(self.index.assignments.get(function, {}).get(name, []))
        if function is not None:
            values += self.index.assignments.get(None, {}).get(name, [])
        return values

    def _with_context(self, item: cst.BaseExpression) -> str | None:
        for node in walk(item):
            if isinstance(node, cst.Call):
                name = callee_name(node)
                if name in ("no_sync", "no_backward_sync"):
                    return "no_sync"
                if name == "accumulate":
                    return "accumulate"
                if name == "autocast":
                    return "autocast"
        return None

    # -- simple statements and expressions

    def _simple(self, small: cst.BaseSmallStatement, scope: _Scope, out: list[Event]) -> None:
        self._expression(small, scope, out)
        if isinstance(small, cst.Assign):
            for target in small.targets:
                self._grad_assignment(target.target, small.value, small, scope, out)
            if _switches_off_grad_sync(small):
                owner = small.targets[-1].target.value
                out.append(Event(NO_SYNC, small, scope.frames, dotted_name(owner), ObjKind.DDP_MODEL, call_chain=scope.chain))
        elif isinstance(small, cst.AugAssign) and _is_grad(small.target):
            if isinstance(small.operator, (cst.DivideAssign, cst.MultiplyAssign)):
                out.append(Event(GRAD_DIVIDE, small, scope.frames, call_chain=scope.chain))

    def _grad_assignment(self, target: cst.BaseExpression, value: cst.BaseExpression, small: cst.CSTNode, scope: _Scope, out: list[Event]) -> None:
        """``p.grad = None`` clears and frees; ``p.grad = 0 * p.grad`` clears and keeps the buffer."""
        if not _is_grad(target):
            return
        if isinstance(value, cst.Name) and value.value == "None":
            set_to_none = True
        elif _is_zeroing_value(value):
            set_to_none = False
        elif isinstance(value, cst.Call) and callee_name(value) in ("zeros_like", "zeros"):
            set_to_none = None  # p.grad = torch.zeros_like(p): a fresh buffer, often made on purpose for a step
        else:
            if scales_down(value):
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
            if frame.kind is not FrameKind.LOOP or not isinstance(frame.node, cst.For):
                continue
            bound = {n.value for n in walk(frame.node.target) if isinstance(n, cst.Name)}
            if name not in bound:
                continue
            loop_bound = True
            for node in walk(frame.node.iter):
                if isinstance(node, cst.Call) and callee_name(node) in ("parameters", "named_parameters"):
                    owner = dotted_name(receiver(node))
                    if owner:
                        return owner, ObjKind.MODEL
                if isinstance(node, cst.Attribute) and node.attr.value == "param_groups":
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
        for call in calls_in_evaluation_order(node):
            self._call(call, scope, out)

    def _call(self, call: cst.Call, scope: _Scope, out: list[Event]) -> None:
        index = self.index
        method = method_name(call)
        recv = receiver(call)
        recv_name = dotted_name(recv)
        qualified = index.qualified_names(call.func)
        frames, chain = scope.frames, scope.chain

        def emit(kind: Kind, **fields) -> None:
            out.append(Event(kind, call, frames, call_chain=chain, **fields))

        # ``self.backward(loss)`` or ``self.step()`` defined by the class itself: judge what the method does.
        if isinstance(recv, cst.Name) and recv.value in ("self", "cls"):
            helper = index.resolve_function(call, scope.function)
            if helper is not None:
                self._inline(helper, call, scope, out)
                return
        if "torch.autograd.backward" in qualified:  # the tensors are the first argument, not a receiver
            emit(EventKind.BACKWARD, **self._backward_fields(call, None, None, None, scope))
            return
        if method == "backward" or method == "manual_backward":
            emit(EventKind.BACKWARD, **self._backward_fields(call, method, recv, recv_name, scope))
            return
        if method == "zero_grad":
            kind = self._kind(recv_name)
            target_kind = ObjKind.OPTIMIZER if kind is ObjKind.OPTIMIZER else ObjKind.MODEL
            emit(EventKind.ZERO, target=recv_name, target_kind=target_kind, set_to_none=_set_to_none(call))
            return
        if method in ("zero_", "fill_", "mul_") and _is_grad(recv):
            if method == "zero_" or _is_zero_literal(positional_args(call)):
                owner, kind = self._grad_owner(recv, scope)
                emit(EventKind.ZERO, target=owner, target_kind=kind, set_to_none=False, manual=True)
            return
        if method in ("div_",) and _is_grad(recv):
            emit(GRAD_DIVIDE)
            return
        recv_kind = self._kind(recv_name)
        if method == "step":
            args = positional_args(call)
            if recv_kind is ObjKind.SCALER and args:
                emit(EventKind.STEP, target=dotted_name(args[0].value), target_kind=ObjKind.OPTIMIZER, via_scaler=recv_name)
                return
            if recv_kind is ObjKind.OPTIMIZER:
                closure = args[0].value if args else (keyword_arg(call, "closure").value if keyword_arg(call, "closure") else None)
                if closure is not None:
                    self._inline_closure(closure, scope, out)
                emit(EventKind.STEP, target=recv_name, target_kind=ObjKind.OPTIMIZER, framework="closure" if closure is not None else None)
                return
            if recv_kind is ObjKind.SCHEDULER:
                emit(EventKind.SCHED_STEP, target=recv_name, target_kind=ObjKind.SCHEDULER, has_args=bool(call.args))
                return
        if method == "unscale_" and recv_kind is ObjKind.SCALER:
            args = positional_args(call)
            emit(EventKind.UNSCALE, target=dotted_name(args[0].value) if args else None, target_kind=ObjKind.OPTIMIZER, via_scaler=recv_name)
            return
        if method == "update" and recv_kind is ObjKind.SCALER:
            emit(EventKind.SCALER_UPDATE, target=recv_name, target_kind=ObjKind.SCALER)
            return
        if method in ("no_sync", "no_backward_sync"):
            args = positional_args(call)  # fabric.no_backward_sync(model, ...) names the model first
            owner = dotted_name(args[0].value) if method == "no_backward_sync" and args else recv_name
            emit(NO_SYNC, target=owner, target_kind=ObjKind.DDP_MODEL)
            return
        name = callee_name(call)
        if name in _CLIP_FUNCTIONS or name == "clip_gradients":
            emit(EventKind.CLIP, framework=self._clip_framework(recv_name, qualified))
            return
        if name == "optimizer_step" and any(q.startswith("torch_xla") for q in qualified):
            args = positional_args(call)
            emit(EventKind.STEP, target=dotted_name(args[0].value) if args else None, target_kind=ObjKind.OPTIMIZER)
            return
        helper = index.resolve_function(call, scope.function)
        if helper is not None:
            self._inline(helper, call, scope, out)
            return
        if name and _CLEAR_HELPER.search(name):
            emit(EventKind.ZERO, target=None, target_kind=ObjKind.UNKNOWN)
            return
        for arg in call.args:
            arg_name = dotted_name(arg.value)
            if arg_name and self._kind(arg_name) is ObjKind.OPTIMIZER:
                emit(HANDOFF, target=arg_name, target_kind=ObjKind.OPTIMIZER)

    def _clip_framework(self, recv_name: str | None, qualified: set[str]) -> str | None:
        """None for torch's own clipping; otherwise who clips (accelerate unscales first, FSDP shards)."""
        if any(q.startswith("torch.") for q in qualified) or recv_name is None:
            return None
        if self._kind(recv_name) is ObjKind.ACCELERATOR:
            return "accelerate"
        if recv_name.split(".")[0] in ("torch", "nn", "utils", "clip_grad"):
            return None
        return "module"

    def _kind(self, name: str | None) -> ObjKind:
        if name is None:
            return ObjKind.UNKNOWN
        known = self.index.objects.get(name)
        if known is not None and known.kind is not ObjKind.UNKNOWN:
            return known.kind
        return kind_from_name(name)

    def _backward_fields(self, call: cst.Call, method: str | None, recv, recv_name: str | None, scope: _Scope) -> dict:
        args = positional_args(call)
        if method == "manual_backward":
            return {"framework": "lightning", "normalised": True, "loss": args[0].value if args else None}
        if method is None:  # torch.autograd.backward(loss)
            loss = args[0].value if args else None
            return {"loss": loss, "normalised": loss is not None and self._normalised(loss, scope)}
        recv_last = last_name(recv_name or "")
        if args and (recv_last in _FRAMEWORK_BACKWARD or self._kind(recv_name) is ObjKind.ACCELERATOR):
            framework = _FRAMEWORK_BACKWARD.get(recv_last, "accelerate")
            return {"framework": framework, "normalised": True, "loss": args[0].value}
        scaled = False
        recv = _uncast(recv)
        loss = recv
        if isinstance(recv, cst.Call) and method_name(recv) == "scale" and self._kind(dotted_name(receiver(recv))) is ObjKind.SCALER:
            scaled = True
            inner = positional_args(recv)
            loss = inner[0].value if inner else recv
        elif recv_name is not None:
            for value in self._assigned(recv_name, scope.function):
                if isinstance(value, cst.Call) and method_name(value) == "scale" and self._kind(dotted_name(receiver(value))) is ObjKind.SCALER:
                    scaled = True
        return {"scaled": scaled, "loss": loss, "normalised": loss is not None and self._normalised(loss, scope)}

    def _normalised(self, loss: cst.BaseExpression, scope: _Scope) -> bool:
        """Whether the loss handed to backward was divided (or scaled down) on its way there."""
        if scales_down(loss):
            return True
        name = dotted_name(loss)
        if name is None:
            return False
        if name in self.index.divided_names.get(scope.function, set()):
            return True
        for value in self._assigned(name, scope.function):
            if isinstance(value, cst.Call):
                helper = self.index.resolve_function(value, scope.function)
                if helper is not None and helper in self.index.returns_divided:
                    return True
        return False

    # -- helpers

    def _inline(self, helper: cst.FunctionDef, call: cst.Call, scope: _Scope, out: list[Event]) -> None:
        """Append a helper's events as if its body were written at the call site."""
        if helper in scope.stack or scope.depth >= MAX_INLINE_DEPTH:
            return
        events = self._summary(helper, scope.depth + 1, scope.stack)
        bindings = _bind_arguments(helper, call)
        for event in events:
            out.append(self._rebind(event, bindings, scope, call))

    def _inline_closure(self, closure: cst.BaseExpression, scope: _Scope, out: list[Event]) -> None:
        """``optimizer.step(closure)`` runs the closure first: its events belong before the step."""
        if isinstance(closure, cst.Name):
            helper = self.index.resolve_function(cst.Call(func=closure), scope.function)
            if helper is not None and helper not in scope.stack and scope.depth < MAX_INLINE_DEPTH:
                for event in self._summary(helper, scope.depth + 1, scope.stack):
                    out.append(dataclasses.replace(event, frames=scope.frames + event.frames, framework=event.framework or "closure", call_chain=scope.chain + event.call_chain))
        elif isinstance(closure, cst.Lambda):
            self._expression(closure.body, scope, out)

    def _rebind(self, event: Event, bindings: dict[str, cst.BaseExpression], scope: _Scope, call: cst.Call) -> Event:
        changes: dict = {"frames": scope.frames + event.frames, "call_chain": scope.chain + (call,) + event.call_chain}
        if event.target is not None:
            head, _, rest = event.target.partition(".")
            if head in bindings:
                bound = dotted_name(bindings[head])
                if bound is not None:
                    new_target = f"{bound}.{rest}" if rest else bound
                    changes["target"] = new_target
                    if event.target_kind is ObjKind.UNKNOWN:
                        changes["target_kind"] = self._kind(new_target)
        if event.kind is EventKind.BACKWARD and not event.normalised and isinstance(event.loss, cst.Name):
            bound_loss = bindings.get(event.loss.value)
            if bound_loss is not None and self._normalised(bound_loss, scope):
                changes["normalised"] = True
        return dataclasses.replace(event, **changes)


def _leaves(block: cst.BaseSuite) -> bool:
    """Whether a block's last statement leaves it: ``continue``, ``break``, ``return`` or ``raise``."""
    if not isinstance(block, cst.IndentedBlock) or not block.body:
        return False
    last = block.body[-1]
    return isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], (cst.Continue, cst.Break, cst.Return, cst.Raise))


def _uncast(node: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """``x`` for ``cast(T, x)`` / ``typing.cast(T, x)``: a type cast changes nothing at run time."""
    if isinstance(node, cst.Call) and callee_name(node) == "cast":
        args = positional_args(node)
        if len(args) == 2:
            return args[1].value
    return node


def _within(scope: _Scope, frame: Frame) -> _Scope:
    return dataclasses.replace(scope, frames=scope.frames + (frame,))


def _bind_arguments(helper: cst.FunctionDef, call: cst.Call) -> dict[str, cst.BaseExpression]:
    """Which caller expression each helper parameter receives (positional and keyword, no ``*args``)."""
    params = [p.name.value for p in helper.params.posonly_params] + [p.name.value for p in helper.params.params]
    if params and params[0] in ("self", "cls") and isinstance(call.func, cst.Attribute):
        params = params[1:]
    bindings: dict[str, cst.BaseExpression] = {}
    for name, arg in zip(params, positional_args(call)):
        bindings[name] = arg.value
    for arg in call.args:
        if arg.keyword is not None:
            bindings[arg.keyword.value] = arg.value
    return bindings


def _is_grad(node: cst.BaseExpression | None) -> bool:
    """``p.grad`` or ``p.grad.data``."""
    if isinstance(node, cst.Attribute) and node.attr.value == "data":
        node = node.value
    return isinstance(node, cst.Attribute) and node.attr.value == "grad"


def _switches_off_grad_sync(assign: cst.Assign) -> bool:
    """``ddp.require_backward_grad_sync = flag``: DDP's attribute form of ``no_sync()`` (anything but a literal True)."""
    target = assign.targets[-1].target
    return (
        isinstance(target, cst.Attribute)
        and target.attr.value == "require_backward_grad_sync"
        and bool_literal(assign.value) is not True
    )


def _is_zero_literal(args: list[cst.Arg]) -> bool:
    return bool(args) and number(args[0].value) == 0


def _grad_holder(grad: cst.BaseExpression) -> cst.BaseExpression:
    """``p`` for ``p.grad`` or ``p.grad.data``."""
    if isinstance(grad, cst.Attribute) and grad.attr.value == "data":
        grad = grad.value
    return grad.value if isinstance(grad, cst.Attribute) else grad


def _is_zeroing_value(value: cst.BaseExpression) -> bool:
    """``0 * p.grad``, ``p.grad * 0``, ``torch.zeros_like(p.grad)``: the old gradient's shape, all zeros."""
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Multiply):
        return any(number(side) == 0 for side in (value.left, value.right))
    if isinstance(value, cst.Call) and callee_name(value) == "zeros_like":
        args = positional_args(value)
        return bool(args) and _is_grad(args[0].value)
    return False


def _set_to_none(call: cst.Call) -> bool | None:
    """The literal ``set_to_none`` given to ``zero_grad``; None when it is left to the default (True)."""
    arg = keyword_arg(call, "set_to_none")
    if arg is None:
        args = positional_args(call)
        arg = args[0] if args else None
    return bool_literal(arg.value) if arg is not None else None
