"""The training-loop model: what each piece of a module does to gradients, in program order.

A :class:`LoopModel` holds the tracked objects (optimizers, scalers,
schedulers, models), and for the module body and every function a *root*:
the ordered :class:`Event` list of that code, with calls into helpers of the
same module replaced by the helper's own events. Each event carries its
*frames*: the loops, branches and ``with`` blocks around it, outermost first,
so a rule can ask "is this step under an accumulation guard?" or "which loop
holds both the backward and the step?" without walking the syntax tree itself.

This module holds the data only; :func:`gradlint.build.build_model` builds it.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Union

import libcst as cst

from gradlint.events import EventKind
from gradlint.objects import ObjInfo, ObjKind, kind_from_name, last_name
from gradlint.module_index import ModuleIndex
from gradlint.parsed_file import ParsedFile
from gradlint.positions import Positions
from gradlint.release_setups import ReleaseInfo


# Events the model records beyond the shared vocabulary: they matter to the
# static rules only (what the source shows but a run does not need).
HANDOFF = "HANDOFF"  # an optimizer is passed to code the model cannot see
GRAD_DIVIDE = "GRAD_DIVIDE"  # gradients are divided in place (p.grad /= n): accumulation normalised by hand
NO_SYNC = "NO_SYNC"  # gradient all-reduce switched off: model.no_sync(), model.require_backward_grad_sync = flag
GRAD_READ = "GRAD_READ"  # a statistic of the gradients is read: p.grad.norm(), torch.norm(p.grad), a histogram of p.grad

Kind = Union[EventKind, str]


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
    block after ``if not boundary: continue``). ``fixed`` marks a branch whose
    test has the same value on every batch (``if accumulation_steps > 1:``):
    its two branches never both run in one training run.
    """

    kind: FrameKind
    node: cst.CSTNode
    branch: str = ""
    accumulation: bool = False
    count: cst.BaseExpression | None = None
    context: str | None = None  # WITH: "no_sync", "accumulate", "autocast"
    exits: bool = False  # BRANCH: its block ends by leaving (continue, break, return, raise)
    called_by: str | None = None  # LOOP over a whole function: who runs it once per batch (for messages)
    fixed: bool = False  # BRANCH: the test is a setting, the same on every batch (accumulation on or off)
    # BRANCH of ``if accum_steps > 1:`` / ``== 1``: the setting tested, and whether this branch runs with accumulation on
    accumulation_on: tuple[str, bool] | None = None

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
    has_args: bool = False  # SCHED_STEP: stepped with an argument (a metric or an epoch); STEP: handed a rate, no closure
    call_chain: tuple[cst.Call, ...] = ()  # the helper calls this event was inlined through
    upstream: bool = False  # BACKWARD: ``y.backward(dy)`` feeds a given gradient, there is no mean loss to divide
    divided_by: cst.BaseExpression | None = None  # BACKWARD in a helper that divides its loss by what the call hands it

    @property
    def loops(self) -> tuple[Frame, ...]:
        """The loops around this event, outermost first."""
        return tuple(f for f in self.frames if f.kind is FrameKind.LOOP)

    def inside(self, frame: Frame) -> bool:
        """Whether ``frame`` surrounds this event."""
        return any(f is frame for f in self.frames)

    @property
    def recovers(self) -> bool:
        """Whether the event runs in an ``except`` handler that recovers from a failed batch: one inside the
        outermost loop around it, or any when no loop is (a handler around the whole loop, ``except: net = Net();
        train(net)``, runs the loop's own bookkeeping)."""
        loops = [at for at, f in enumerate(self.frames) if f.kind is FrameKind.LOOP]
        return any(f.branch == "except" for f in self.frames[loops[0] if loops else 0:])

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
    _probes: frozenset[int] | None = dataclasses.field(default=None, repr=False, compare=False)  # queries.probe_events

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

    file: ParsedFile  # the file the model was built from: its text, trees and node tables
    objects: dict[str, ObjInfo]
    roots: list[Root]
    uses_cuda_graphs: bool
    _positions: Positions | None = None
    release: ReleaseInfo = dataclasses.field(default_factory=ReleaseInfo)  # gradient-release set-ups
    index: ModuleIndex | None = None  # the module index the model was built from (what the fixes ask of the whole module)
    called_in_loop: frozenset[str] = frozenset()  # functions some loop of the run calls
    unscaled_by_caller: frozenset[str] = frozenset()  # functions some caller in the run unscales gradients around
    wrapped_by_caller: frozenset[str] = frozenset()  # ``function:argument:wrapper``: a caller hands it a data-parallel model
    returned_wraps: frozenset[str] = frozenset()  # ``function:wrapper``: functions of other files that return a wrapped model
    summing_models: frozenset[str] = frozenset()  # ``name:position``: names bound only to models whose forward sums the loss
    keeps_handed: frozenset[str] = frozenset()  # functions of the run handed an optimizer here that never clear gradients
    handed_scaler: frozenset[str] = frozenset()  # functions some call of the run hands a grad scaler
    scaled_dispatch: frozenset[str] = frozenset()  # ``callback:function``: ``function`` runs it while gradients are scaled
    clamp_hooks: frozenset[str] = frozenset()  # functions of the run that clip gradients by hooks on a model's parameters
    ships_at_one: frozenset[str] = frozenset()  # settings it reads as counts, declared with the default 1 in the run
    device_args: frozenset[str] = frozenset()  # ``Class:slot=kind``: devices the run's constructions hand its classes
    _codes: dict[cst.CSTNode, str] = dataclasses.field(default_factory=dict, repr=False)
    _param_sources: dict[str, frozenset[str]] | None = dataclasses.field(default=None, repr=False)

    @property
    def module(self) -> cst.Module:
        """The LibCST module."""
        return self.file.module

    @property
    def text(self) -> str | None:
        """The source, when the caller had it: positions are read against it."""
        return self.file.text

    @property
    def parents(self) -> dict[cst.CSTNode, cst.CSTNode] | None:
        """Each node's parent, as the module index recorded it."""
        return self.file.parents

    def position(self, node: cst.CSTNode) -> tuple[int, int, int, int]:
        """``(line, column, end_line, end_column)`` of a node, 1-based columns, end exclusive.

        Positions are resolved on first use only, one top-level statement at a time: most modules have no findings.
        """
        if self._positions is None:
            self._positions = Positions(self.file)
        code_range = self._positions[node]
        return (code_range.start.line, code_range.start.column + 1, code_range.end.line, code_range.end.column + 1)

    def line(self, node: cst.CSTNode) -> int:
        """The 1-based line a node starts on."""
        if self._positions is None:
            self._positions = Positions(self.file)
        return self._positions.start_line(node)

    def code(self, node: cst.CSTNode) -> str:
        """The source text of a node, as written (rendered once per node: several rules compare the same tests)."""
        code = self._codes.get(node)  # keyed by the node itself, which the table keeps alive: no id is reused
        if code is None:
            code = self._codes[node] = self.module.code_for_node(node).strip()
        return code

    def info(self, name: str | None) -> ObjInfo:
        """What is known about a dotted name; guessed from the spelling when nothing else is."""
        if name is None:
            return ObjInfo(ObjKind.UNKNOWN)
        known = self.objects.get(name)
        if known is not None:
            return known
        return ObjInfo(kind_from_name(name))

    def all_param_sources(self) -> dict[str, frozenset[str]]:
        """For each optimizer whose parameters are known: the models it was built from (read once per module: the
        clearing queries ask it for every pair of a clear and a step)."""
        if self._param_sources is None:
            self._param_sources = {
                last_name(name): info.param_sources
                for name, info in self.objects.items()
                if info.kind is ObjKind.OPTIMIZER and info.param_sources
            }
        return self._param_sources

