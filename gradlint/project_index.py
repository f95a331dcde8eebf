"""The project index: which functions of a run are called once per batch from a loop, in any of its files.

Real trainers put the training step in a function of its own
(``def train_step(self, batch)``, a trainer's ``step()``) and call it from a
loop elsewhere, often in another module of the package. Such a function is a
loop body: a step without a clear in it repeats every batch. The event
builder only inlines calls it can resolve inside one module, so the run first
notes, for every file, the names its loops call (:func:`scan_calls`, Python's
own parser, no LibCST), and :class:`ProjectIndex` joins them.

Names are joined within a *unit* of code that can call each other: a
package, or scripts beside each other that import one another (see
:class:`ProjectIndex`). A name counts as a *per-batch body* only when every
loop of its unit that calls it does no gradient work of its own beside the call (no clear, step,
backward, update, clipping or ``no_sync`` spelled in that loop, nor a call
to another function whose name says it does such work): then the function
alone is the whole iteration, and what it lacks, the iteration lacks. The
loop that decides is the innermost one around the call: what an enclosing
loop does once per epoch (``model.update_learning_rate()``) shares no
iteration with a call made once per batch. Names
are matched by their last part (``trainer.train_step(b)`` calls every
function named ``train_step``); a name called from one sharing loop anywhere
is no per-batch body anywhere in that unit.

What a file's findings depend on is :meth:`ProjectIndex.context_of`: the
per-batch names among the functions it defines. The cache keys a file's
result with it, and a run over one file (the flake8 plugin, ``lint_text``)
uses that file's own loops only.
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
import functools
import os
import re
from collections.abc import Iterable, Iterator

from gradlint.device_constructions import device_arguments, may_hand_devices
from gradlint.objects import ObjKind, kind_from_name
from gradlint.python_nodes import FiledTree, child_nodes, own_nodes, walk
from gradlint.scaler_release_facts import scaler_release_facts
from gradlint.setting_defaults import count_names, declared_defaults, may_declare, merged
from gradlint.summed_losses import may_sum, summing_forwards

# A called name that says the call does gradient work itself.
_GRADIENT_WORK = re.compile(r"zero|grad|step|backward|update|optimi[sz]|unscale|clip|sync|accum", re.IGNORECASE)
# Receivers whose ``step()`` is not a call of a project's own step function.
_NOT_PROJECT_STEP = (ObjKind.OPTIMIZER, ObjKind.SCHEDULER, ObjKind.SCALER)
_SKIPPED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


@dataclasses.dataclass(frozen=True)
class FileCalls:
    """What one file's loops call, and which functions it defines."""

    alone: frozenset[str] = frozenset()  # names called from a loop that does no other gradient work
    shared: frozenset[str] = frozenset()  # names called from a loop that does gradient work of its own
    defines: frozenset[str] = frozenset()  # the names of the functions and methods the file defines
    imports: frozenset[str] = frozenset()  # the first part of every module it imports absolutely
    after_unscale: frozenset[str] = frozenset()  # names called by a function (or the module body) that also calls unscale_
    # ``function:argument:wrapper`` for each call handed a data-parallel model the file wraps (:func:`_wrapped_passed`)
    passes_wrapped: frozenset[str] = frozenset()
    hands: frozenset[str] = frozenset()  # names called with an optimizer argument (``trainer.optimize(self.opt)``)
    steps_handed: frozenset[str] = frozenset()  # functions defined here, each definition stepping an optimizer it is handed
    clears_handed: frozenset[str] = frozenset()  # functions defined here, some definition of which may clear gradients
    classes: frozenset[str] = frozenset()  # the names of the classes the file defines
    wraps_optimizer: frozenset[str] = frozenset()  # those whose step() and zero_grad() call an optimizer's (_wraps_optimizer)
    # What the file tells about grad scalers and gradient release (:mod:`gradlint.scaler_release_facts`): names it
    # calls with a scaler as an argument, its functions that set gradient release up, the callbacks it runs by name
    # while the gradients are still scaled.
    hands_scaler: frozenset[str] = frozenset()
    releases: frozenset[str] = frozenset()
    scaled_dispatch: frozenset[str] = frozenset()
    # ``function:wrapper`` for functions defined here whose every return is a wrapper class's construction
    # (``def smart_DDP(model): return DDP(model, ...)``): what :func:`_returned_wraps` finds
    returns_wrap: frozenset[str] = frozenset()
    # ``target:callee`` for each assignment of a call of a name the file imports (the target's last name; the callee by
    # the name it has where it is defined): ``model = smart_DDP(model)``, ``loss_scaler = NativeScaler()``
    assigned: frozenset[str] = frozenset()
    # ``name:shape`` for the functions, and the classes by their ``__call__``, defined here that backpropagate the loss
    # they are handed on every call and step the optimizer they are handed only when a flag says so (:func:`_backward_helper`)
    backward_helpers: frozenset[str] = frozenset()
    top_level: frozenset[str] = frozenset()  # the names of the module-level functions the file defines
    # Its functions that clip gradients by hooks on a model's parameters (:mod:`gradlint.scaler_release_facts`)
    clamp_hooks: frozenset[str] = frozenset()
    # ``Class:position`` for the classes defined here whose ``forward`` returns a loss summed over samples or tokens, at
    # that place of the returned tuple (-1: the loss alone): what :func:`gradlint.summed_losses.summing_forwards` finds
    sums_loss: frozenset[str] = frozenset()
    # ``name=1`` for the settings the file declares with the default 1, ``name=*`` for those it declares with another
    # (:func:`gradlint.setting_defaults.declared_defaults`), and the names it reads as counts (``% accum``, ``/ accum``,
    # ``range(accum)``): what the run's other files tell it about those
    defaults: frozenset[str] = frozenset()
    count_names: frozenset[str] = frozenset()
    # Its module-level functions that read the values of the gradients of a model they are handed
    # (:mod:`gradlint.scaler_release_facts`)
    reads_grads: frozenset[str] = frozenset()
    # ``Class:slot=cpu`` / ``Class:slot=other`` for the arguments of its constructions that hand a device
    # (:mod:`gradlint.device_constructions`)
    device_args: frozenset[str] = frozenset()

    def to_json(self) -> list[list[str]]:
        """A form the cache can store."""
        return [
            sorted(self.alone), sorted(self.shared), sorted(self.defines), sorted(self.imports),
            sorted(self.after_unscale), sorted(self.passes_wrapped),
            sorted(self.hands), sorted(self.steps_handed), sorted(self.clears_handed),
            sorted(self.classes), sorted(self.wraps_optimizer),
            sorted(self.hands_scaler), sorted(self.releases), sorted(self.scaled_dispatch),
            sorted(self.returns_wrap), sorted(self.assigned), sorted(self.backward_helpers), sorted(self.top_level),
            sorted(self.clamp_hooks),
            sorted(self.sums_loss),
            sorted(self.defaults), sorted(self.count_names),
            sorted(self.reads_grads),
            sorted(self.device_args),
        ]

    @classmethod
    def from_json(cls, data: list[list[str]]) -> "FileCalls":
        """The inverse of :meth:`to_json`."""
        return cls(*(frozenset(names) for names in data))


# In a file's context, the prefixes of a function some loop of the run calls, and of one
# some caller of the run unscales gradients around; a plain name is a per-batch body.
CALLED_IN_LOOP = "called:"
UNSCALED_BY_CALLER = "unscaled:"
# ``wrapped:function:argument:wrapper``: some call of the run hands this function a data-parallel model.
WRAPPED_BY_CALLER = "wrapped:"
# In a file's context, names it hands an optimizer to: functions of the run that step the optimizer
# they are handed, and functions of the run that never clear gradients.
STEPS_HANDED = "steps:"
KEEPS_HANDED = "keeps:"
# In a file's context, the classes of the run that wrap an optimizer (every definition of the name in the unit does).
WRAPS_OPTIMIZER = "wraps:"
# In a file's context: its functions some call of the run hands a grad scaler; the functions of the run's other files
# that set gradient release up (every definition of the name does); its callbacks some function of the run runs by
# name while the gradients are still scaled.
HANDED_SCALER = "scaler:"
RELEASES = "releases:"
SCALED_DISPATCH = "scaled:"
# ``returns:function:wrapper``: a function of another file of the run, whose result this file assigns, returns a model
# wrapped for data parallelism (every definition of the name in the unit does, with the same wrapper).
RETURNS_WRAP = "returns:"
# ``backs:name:shape``: a name this file calls with an optimizer is, in the whole run, a helper that backpropagates the
# loss it is handed on every call and steps the optimizer only when a flag argument is true (:class:`BackwardHelper`).
BACKWARD_HELPER = "backs:"
# ``clamps:name``: a function of the run (every definition of the name agreeing) that clips gradients by hooks on the
# parameters of a model, inside the backward (:mod:`gradlint.scaler_release_facts`).
CLAMP_HOOKS = "clamps:"
# ``sums:name:position``: every class construction this file assigns to ``name`` builds, apart from data-parallel
# wrappers, a class of the run (or of a folder beside it that the file imports) whose ``forward`` returns a loss summed
# over samples or tokens, at ``position`` of the returned tuple (:mod:`gradlint.summed_losses`).
SUMS_LOSS = "sums:"
# ``ships_at_one:name``: a name this file reads as a count, declared with the default 1 by the run's other files (every
# declaration agreeing) and not by this one (:mod:`gradlint.setting_defaults`).
SHIPS_AT_ONE = "ships_at_one:"
# ``reads_grads:name``: a function of the run (every definition of the name agreeing) that reads the values of the
# gradients of a model it is handed (:mod:`gradlint.scaler_release_facts`).
READS_GRADS = "reads_grads:"
# ``devices:Class:slot=kind``: what a construction somewhere in the run hands a class this file defines at one argument,
# the CPU or something else (:mod:`gradlint.device_constructions`).
DEVICE_ARGS = "devices:"


@dataclasses.dataclass(frozen=True)
class Context:
    """What the other files of a run say about one file's functions, read back from its context names."""

    per_batch: frozenset[str] = frozenset()  # called once per batch by loops that leave the gradient work to them
    called_in_loop: frozenset[str] = frozenset()  # called from some loop of the run
    unscaled_by_caller: frozenset[str] = frozenset()  # called by a function that also calls unscale_
    wrapped_by_caller: frozenset[str] = frozenset()  # ``function:argument:wrapper``: handed a data-parallel model
    steps_handed: frozenset[str] = frozenset()  # called with an optimizer here; every definition in the run steps it
    keeps_handed: frozenset[str] = frozenset()  # called with an optimizer here; defined in the run, never clearing
    wraps_optimizer: frozenset[str] = frozenset()  # classes of the run whose step() and zero_grad() are an optimizer's
    handed_scaler: frozenset[str] = frozenset()  # its functions some call of the run hands a grad scaler
    release_helpers: frozenset[str] = frozenset()  # functions of the run's other files that set gradient release up
    scaled_dispatch: frozenset[str] = frozenset()  # ``callback:function``: ``function`` runs its callback while gradients are scaled
    returns_wrap: frozenset[str] = frozenset()  # ``function:wrapper``: functions of the run returning a wrapped model
    backward_helpers: frozenset[str] = frozenset()  # ``name:shape``: helpers of the run that backpropagate (BackwardHelper)
    clamp_hooks: frozenset[str] = frozenset()  # functions of the run that clip gradients by hooks on a model's parameters
    sums_loss: frozenset[str] = frozenset()  # ``name:position``: models built from classes whose forward sums the loss
    ships_at_one: frozenset[str] = frozenset()  # counts it reads that another file of the run declares with default 1
    grad_readers: frozenset[str] = frozenset()  # functions of the run that read the gradients of a model they are handed
    device_args: frozenset[str] = frozenset()  # ``Class:slot=kind``: devices the run's constructions hand its classes

    @classmethod
    def of(cls, names: Iterable[str]) -> "Context":
        """The context a file's context names (:meth:`ProjectIndex.context_of`) stand for."""
        prefixes = (
            CALLED_IN_LOOP, UNSCALED_BY_CALLER, WRAPPED_BY_CALLER, STEPS_HANDED, KEEPS_HANDED, WRAPS_OPTIMIZER,
            HANDED_SCALER, RELEASES, SCALED_DISPATCH,
            RETURNS_WRAP, BACKWARD_HELPER, CLAMP_HOOKS, SUMS_LOSS, SHIPS_AT_ONE, READS_GRADS, DEVICE_ARGS,
        )
        found: dict[str, set[str]] = {prefix: set() for prefix in ("", *prefixes)}
        for name in names:
            prefix = next((p for p in prefixes if name.startswith(p)), "")
            found[prefix].add(name[len(prefix):])
        return cls(*(frozenset(found[p]) for p in ("", *prefixes)))


def python_tree(text: str) -> FiledTree | None:
    """Python's tree of ``text``, or None when Python cannot read it (what :func:`scan_calls` then assumes)."""
    try:
        return FiledTree(ast.parse(text))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def might_call(text: str) -> bool:
    """Whether :func:`scan_calls` can find anything in ``text``: a loop or a function definition is spelled in it."""
    return "for " in text or "while " in text or "def " in text


def scan_calls(text: str, tree: FiledTree | None = None) -> FileCalls:
    """The names a file's loops call, and the functions it defines; empty when Python cannot parse it.

    ``tree``, Python's tree of ``text`` when the caller has parsed it already, saves parsing it again.
    """
    declares = may_declare(text)
    if not might_call(text) and not declares and not may_hand_devices(text):
        return FileCalls()
    if tree is None:
        tree = python_tree(text)
        if tree is None:
            return FileCalls()
    defaults = declared_defaults(tree) if declares else frozenset()
    devices = device_arguments(tree) if may_hand_devices(text) else frozenset()
    if not might_call(text):
        return FileCalls(defaults=defaults, device_args=devices)
    calls = _Scan(_lines_naming("unscale_", text)).file(tree.tree)
    facts = scaler_release_facts(text, tree)
    if facts:
        calls = dataclasses.replace(calls, **facts)
    calls = _with_handed_and_wrapped(calls, text, tree)
    if may_sum(text):
        calls = dataclasses.replace(calls, sums_loss=summing_forwards(tree))
    calls = dataclasses.replace(calls, defaults=defaults, count_names=count_names(tree), device_args=devices)
    return _with_assigned_and_helpers(calls, text, tree)


def _lines_naming(word: str, text: str) -> list[int]:
    """The numbers of the lines of ``text`` that contain ``word``, counted as Python's parser counts them."""
    if word not in text:
        return []
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return [number for number, line in enumerate(lines, 1) if word in line]


_LOOPS = (ast.For, ast.AsyncFor, ast.While)


class _Scan:
    """One file's scan: every statement is visited once, and only the insides of loops are walked to their expressions.

    A loop's calls are those of its body and ``else``; an enclosing loop takes
    an inner loop's from its summary instead of walking its body again.
    """

    def __init__(self, unscale_lines: list[int]) -> None:
        self.unscale_lines = unscale_lines  # where ``unscale_`` is spelled: only a function spanning one can call it
        self.alone: set[str] = set()
        self.shared: set[str] = set()
        self.defines: set[str] = set()
        self.imports: set[str] = set()
        self.after_unscale: set[str] = set()
        self.classes: set[str] = set()
        self.wraps_optimizer: set[str] = set()
        self.loops: dict[ast.AST, tuple[set[str], bool]] = {}  # each loop visited so far: what its body calls, and whether it does gradient work

    def file(self, tree: ast.Module) -> FileCalls:
        """What :func:`scan_calls` returns for ``tree``."""
        self._scope(tree)
        loops = []
        stack: list[ast.stmt] = list(reversed(tree.body))
        while stack:  # every statement, in source order (an ``elif`` chain nests too deeply to recurse)
            statement = stack.pop()
            kind = type(statement)
            if kind is ast.FunctionDef or kind is ast.AsyncFunctionDef:
                self.defines.add(statement.name)
                self._scope(statement)
            elif kind is ast.Import:
                self.imports.update(alias.name.split(".")[0] for alias in statement.names)
                continue
            elif kind is ast.ImportFrom:
                if not statement.level and statement.module:
                    self.imports.add(statement.module.split(".")[0])
                continue
            elif kind is ast.ClassDef:
                self.classes.add(statement.name)
                if _wraps_optimizer(statement):
                    self.wraps_optimizer.add(statement.name)
            elif kind in _LOOPS:
                loops.append(statement)
            stack.extend(reversed(_statements_inside(statement)))
        for loop in reversed(loops):  # inner loops first: an enclosing loop reads their summaries
            self._loop(loop)
        return FileCalls(
            frozenset(self.alone), frozenset(self.shared), frozenset(self.defines), frozenset(self.imports), frozenset(self.after_unscale),
            classes=frozenset(self.classes), wraps_optimizer=frozenset(self.wraps_optimizer),
        )

    def _scope(self, node: ast.Module | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        lines = self.unscale_lines
        if not lines:
            return
        if not isinstance(node, ast.Module):
            first = bisect.bisect_left(lines, node.lineno)
            if first == len(lines) or lines[first] > node.end_lineno:
                return  # no line of the function names unscale_
        if "unscale_" in _plain_calls(node):
            self.after_unscale |= _loop_calls(node)[0]

    def _loop(self, loop: ast.For | ast.AsyncFor | ast.While) -> None:
        direct: set[str] = set()
        called, work = _calls_in(loop.body + loop.orelse, self.loops, direct)
        self.loops[loop] = (called, work)
        doing_work = sum(1 for name in called if _GRADIENT_WORK.search(name))
        # A name called in an inner loop was judged there: it runs once per inner iteration, which this
        # loop's own calls (``model.update_learning_rate()`` once per epoch) do not share.
        for name in direct:
            others_work = work or doing_work - (1 if _GRADIENT_WORK.search(name) else 0) > 0
            (self.shared if others_work else self.alone).add(name)


def _wraps_optimizer(cls: ast.ClassDef) -> bool:
    """Whether a class's own ``step()`` and ``zero_grad()`` each call the same method of an attribute of ``self``
    named as an optimizer (``self.optimizer.step()``): an optimizer by another name, as the event builder reads a
    class of its own module (``event_builder._delegates``)."""
    methods = {node.name: node for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return all(name in methods and _delegates(methods[name], name) for name in ("step", "zero_grad"))


def _delegates(method: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
    for node in walk(method):
        if isinstance(node, ast.Call):
            called, receiver = _callee(node.func)
            if called == name and receiver is not None and receiver.startswith("self.") and kind_from_name(receiver) is ObjKind.OPTIMIZER:
                return True
    return False


# A positional argument or a parameter whose name holds "opt" (``helper(opt)``, ``def f(self, optimizer: Optimizer)``):
# only a file that spells one can hand an optimizer to a function or define one that is handed it.
_OPTIMIZER_ARGUMENT = re.compile(r"[(,]\s*(?:\w+\.)*\w*opt\w*\s*[,):=]", re.IGNORECASE)
# The same with comments and line continuations allowed around the name (``f(  # why\n    opt)``): where to read.
_GAP = r"(?:\s|\\|#[^\n]*+)*+"  # possessive: a run of comment marks never makes the search backtrack
_OPTIMIZER_ARGUMENT_ANYHOW = re.compile(rf"[(,]{_GAP}(?:\w+{_GAP}\.{_GAP})*\w*opt\w*{_GAP}[,):=]", re.IGNORECASE)


def _with_handed_and_wrapped(calls: FileCalls, text: str, tree: FiledTree) -> FileCalls:
    """``calls`` with the facts about handed optimizers and wrapped models, read in one walk of the tree when the
    text can hold any of them (a name of an optimizer as an argument, a spelling of a wrap)."""
    wraps = _may_wrap(text)  # only then can a call hand on a wrapped model
    optimizers = _OPTIMIZER_ARGUMENT.search(text) is not None
    if not wraps and not optimizers:
        return dataclasses.replace(calls, clears_handed=calls.defines)  # a function not read may clear
    functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    found_calls: list[ast.Call] = []
    assigns: list[ast.Assign] = []
    from_imports: list[ast.ImportFrom] = []
    # Every call may hand on a wrapped model: then the whole tree is read. Else only the statements spanning a
    # line where an optimizer may be an argument (most of a file); lines are counted on "\n" alone.
    if wraps or "\r" in text:
        by_type = tree.by_type()
        calls_read = by_type.get(ast.Call, [])
        if optimizers:
            functions.extend(by_type.get(ast.FunctionDef, ()))
            functions.extend(by_type.get(ast.AsyncFunctionDef, ()))
        if wraps:
            found_calls, assigns, from_imports = calls_read, by_type.get(ast.Assign, []), by_type.get(ast.ImportFrom, [])
            from_imports = [*from_imports, *by_type.get(ast.Import, [])]
    else:  # _near_lines lists every function definition as it goes
        near = _near_lines(tree.tree, _lines_matching(_OPTIMIZER_ARGUMENT_ANYHOW, text), functions)
        calls_read = [node for node in near if type(node) is ast.Call]
    hands = _handing_optimizers(calls_read) if optimizers else set()
    steps_handed, clears_handed = _what_handed_optimizers_get(functions, set(calls.defines))
    return dataclasses.replace(
        calls,
        passes_wrapped=_wrapped_passed(found_calls, assigns, from_imports) if wraps else frozenset(),
        returns_wrap=_returned_wraps(tree, from_imports) if wraps else frozenset(),
        hands=frozenset(hands),
        steps_handed=steps_handed,
        clears_handed=clears_handed,
    )


def _returned_wraps(tree: FiledTree, from_imports: list[ast.ImportFrom]) -> frozenset[str]:
    """``function:wrapper`` for each module-level function of the file every ``return`` of which hands back a wrapper class's
    construction (``return DistributedDataParallel(model, ...)``, or a name the function assigned one to), the same
    wrapper each time, or the model it was handed unchanged (the one-process path): a project's own way to wrap
    (``smart_DDP(model)``), which another file may call."""
    class_names = _wrapper_names(from_imports)
    found = set()
    for function in tree.tree.body:
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue  # a module's own functions: a method is no callee of a plain call
        built: dict[str, str] = {}
        returned: set[str | None] = set()
        handed = {a.arg for a in function.args.posonlyargs + function.args.args + function.args.kwonlyargs}
        for node in own_nodes(function):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                by = _wrapper(node.value, class_names)
                for target in node.targets:
                    if by is not None and _dotted(target):
                        built[_dotted(target)] = by
            elif isinstance(node, ast.Return) and node.value is not None:
                value = node.value
                if isinstance(value, ast.Name) and value.id in handed and value.id not in built:
                    continue  # ``if world_size == 1: return model``: the one-process path hands the model back unwrapped
                returned.add(_wrapper(value, class_names) if isinstance(value, ast.Call) else built.get(_dotted(value) or ""))
        if len(returned) == 1 and None not in returned:
            found.add(f"{function.name}:{returned.pop()}")
    return frozenset(found)


def _with_assigned_and_helpers(calls: FileCalls, text: str, tree: FiledTree) -> FileCalls:
    """``calls`` with the calls the file assigns (``target:callee``) and, when the text backpropagates, its backward
    helpers (:func:`_backward_helper`)."""
    by_type = _statements_by_type(tree.tree)
    # A callee the file imports by name may be another file's function or class (``from utils.torch_utils import
    # smart_DDP``, ``from util.misc import NativeScalerWithGradNormCount as NativeScaler``); any class construction
    # (a capitalised callee, ``torch.cuda.amp.GradScaler()``) binds its target to something else.
    imported = {a.asname or a.name: a.name for node in by_type.get(ast.ImportFrom, ()) for a in node.names}
    assigned = set()
    for node in by_type.get(ast.Assign, ()):
        if not isinstance(node.value, ast.Call):
            continue
        callee, _ = _callee(node.value.func)
        if isinstance(node.value.func, ast.Name) and callee in imported:
            callee = imported[callee]
        elif callee is None or not callee[:1].isupper():
            continue
        for target in node.targets:
            last = _dotted(target)
            if last is not None:
                assigned.add(f"{last.rsplit('.', 1)[-1]}:{callee}")
    helpers = set()
    lines = _lines_naming("backward", text)
    if lines:
        for function in (*by_type.get(ast.FunctionDef, ()), *by_type.get(ast.AsyncFunctionDef, ())):
            if not _spans_one_of(function, lines):
                continue  # no line of it names backward
            if not _may_hand_optimizer(function):
                if function in tree.tree.body and (shape := _backpropagating_function(function)) is not None:
                    helpers.add(f"{function.name}:{shape}")
                continue
            first = (function.args.posonlyargs + function.args.args)[:1]
            shape = _backward_helper(function, skip_self=bool(first) and first[0].arg in ("self", "cls"))
            if shape is None:
                continue
            owner = next((c for c in by_type.get(ast.ClassDef, ()) if function in c.body), None) if function.name == "__call__" else None
            if owner is not None:
                helpers.add(f"{owner.name}():{shape}")  # its instances are the helpers, not calls of the class
            elif not function.name.startswith("__"):
                helpers.add(f"{function.name}:{shape}")
    top_level = frozenset(n.name for n in tree.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return dataclasses.replace(calls, assigned=frozenset(assigned), backward_helpers=frozenset(helpers), top_level=top_level)


def _statements_by_type(module: ast.Module) -> dict[type, list[ast.stmt]]:
    """Every statement of ``module``, nested ones included, filed by exact type. Reading statements only (no
    expression is visited) costs a fraction of filing every node, and imports, assignments, functions and classes
    are all statements."""
    table: dict[type, list[ast.stmt]] = {}
    pending = list(module.body)
    while pending:
        statement = pending.pop()
        table.setdefault(type(statement), []).append(statement)
        pending.extend(_statements_inside(statement))
    return table


def _spans_one_of(function: ast.AST, lines: list[int]) -> bool:
    """Whether one of ``lines`` (sorted) falls inside the function's lines."""
    first = bisect.bisect_left(lines, function.lineno)
    return first < len(lines) and lines[first] <= function.end_lineno


def _may_hand_optimizer(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    args = function.args
    return any("opt" in a.arg.lower() for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))


@dataclasses.dataclass(frozen=True)
class BackwardHelper:
    """A helper that backpropagates the loss it is handed on every call and steps the optimizer it is handed only when
    a flag argument is true: ``loss_scaler(loss, optimizer, update_grad=(i + 1) % accum == 0)`` of MAE-style code
    (``NativeScalerWithGradNormCount.__call__``: ``self._scaler.scale(loss).backward()``, then ``if update_grad:
    ... self._scaler.step(optimizer)``). Each argument is found by its position or its keyword."""

    loss: tuple[int, str]
    optimizer: tuple[int, str]
    flag: tuple[int, str]
    flag_default: str  # the flag's default as written (``True``), or "" when it must be given
    scaled: bool  # the loss goes through a gradient scaler's ``scale`` on its way to backward
    divides: bool = False  # a backward-only helper divides (or scales) the loss on its way to backward
    divisor: tuple[int, str] = (-1, "")  # the parameter a backward-only helper divides the loss by, when one is

    @property
    def steps(self) -> bool:
        """Whether the helper steps the optimizer it is handed (under its flag); False for a helper that only
        backpropagates (:func:`_backpropagating_function`)."""
        return bool(self.optimizer[1])

    def encode(self) -> str:
        """The form a context name holds (no ``:`` in it)."""
        return ",".join((
            f"{self.loss[0]}={self.loss[1]}", f"{self.optimizer[0]}={self.optimizer[1]}", f"{self.flag[0]}={self.flag[1]}",
            self.flag_default, "scaled" if self.scaled else "plain", "divides" if self.divides else "whole",
            f"{self.divisor[0]}={self.divisor[1]}",
        ))

    @classmethod
    def decode(cls, text: str) -> "BackwardHelper":
        """The inverse of :meth:`encode`."""
        loss, optimizer, flag, default, scaled, divides, divisor = text.split(",")
        pair = lambda item: (int(item.split("=")[0]), item.split("=")[1])  # noqa: E731
        return cls(pair(loss), pair(optimizer), pair(flag), default, scaled == "scaled", divides == "divides", pair(divisor))


def _backward_helper(function: ast.FunctionDef | ast.AsyncFunctionDef, skip_self: bool) -> str | None:
    """The encoded :class:`BackwardHelper` shape of a function, or None when it is not one.

    It is one when, in its own top-level statements and before any ``return``, it calls ``backward()`` on one of its
    parameters (or on a scaler's ``scale(param)``), and its one parameter named as an optimizer is stepped
    (``optimizer.step()``, ``scaler.step(optimizer)``) only inside a top-level ``if flag:`` on another parameter and
    nowhere else.
    """
    args = function.args
    positional = list(args.posonlyargs) + list(args.args)
    if skip_self:
        if not positional:
            return None
        positional = positional[1:]
    names = [a.arg for a in positional]
    keyword_only = [a.arg for a in args.kwonlyargs]
    every = names + keyword_only
    defaults = dict(zip(names[len(names) - len(args.defaults):], args.defaults)) if args.defaults else {}
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    optimizers = [a for a in (*positional, *args.kwonlyargs) if _names_optimizer(a)]
    if len(optimizers) != 1:
        return None
    optimizer = optimizers[0].arg
    loss, scaled = None, False
    for statement in function.body:
        if any(isinstance(node, ast.Return) for node in walk(statement)):
            return None  # a way out before the backward: it may be skipped
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
            name, _ = _callee(statement.value.func)
            receiver = statement.value.func.value if isinstance(statement.value.func, ast.Attribute) else None
            if name == "backward" and receiver is not None:
                if isinstance(receiver, ast.Call) and _callee(receiver.func)[0] == "scale" and len(receiver.args) == 1:
                    receiver, scaled = receiver.args[0], True
                if isinstance(receiver, ast.Name) and receiver.id in every and receiver.id != optimizer:
                    loss = receiver.id
                    break
    if loss is None:
        return None
    flag = None
    for statement in function.body:
        steps = _steps_of(statement, optimizer)
        if not steps:
            continue
        test = statement.test if isinstance(statement, ast.If) else None
        if not isinstance(test, ast.Name) or test.id not in every or test.id in (loss, optimizer) or flag not in (None, test.id):
            return None  # stepped outside a flag's branch, or under two flags
        if any(_steps_of(other, optimizer) for other in statement.orelse):
            return None
        flag = test.id
    if flag is None:
        return None
    default = defaults.get(flag)
    written = ast.unparse(default) if default is not None else ""
    if written not in ("", "True", "False"):
        return None

    def where(name: str) -> tuple[int, str]:
        return (names.index(name) if name in names else -1, name)

    return BackwardHelper(where(loss), where(optimizer), where(flag), written, scaled).encode()


# Calls that make a function more than a backward: it steps, clears, unscales, clips or syncs itself.
_MORE_THAN_BACKWARD = frozenset({"step", "zero_grad", "unscale_", "update", "clip_grad_norm_", "clip_grad_value_", "no_sync"})


def _backpropagating_function(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The encoded :class:`BackwardHelper` shape of a module-level function that only backpropagates, or None.

    ``def sft_microbatch_train_step(log_probs, mask, accumulation_steps): loss = ... / accumulation_steps;
    loss.backward(); return loss, meta``: one of its own top-level statements, before any ``return``, calls
    ``backward()`` on a name (a parameter or a local; also ``scaler.scale(name).backward()``), and nothing in it
    steps, clears, unscales, clips or enters ``no_sync``. Whether a division (or a multiplication) comes before the
    backward is noted (a caller's finding about an undivided loss needs the helper not to divide), and the parameter
    it divides by when it is the only one (``/ accumulation_steps``): the caller hands it its count.
    """
    for node in walk(function):
        if isinstance(node, ast.Call) and _callee(node.func)[0] in _MORE_THAN_BACKWARD:
            return None
    names = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
    divides, divisors = False, set()
    for statement in function.body:
        if any(isinstance(node, ast.Return) for node in walk(statement)):
            return None  # a way out before the backward: it may be skipped
        for node in walk(statement):
            if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mult)):
                divides = True
                by = node.right if isinstance(node, ast.BinOp) else node.value
                if isinstance(node.op, ast.Div) and isinstance(by, ast.Name) and by.id in names:
                    divisors.add(by.id)
        if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)):
            continue
        name, _ = _callee(statement.value.func)
        receiver = statement.value.func.value if isinstance(statement.value.func, ast.Attribute) else None
        if name != "backward" or receiver is None:
            continue
        scaled = isinstance(receiver, ast.Call) and _callee(receiver.func)[0] == "scale" and len(receiver.args) == 1
        if scaled:
            receiver = receiver.args[0]
        if not isinstance(receiver, ast.Name):
            return None
        loss = (names.index(receiver.id), receiver.id) if receiver.id in names else (-1, "")
        divisor = divisors.pop() if len(divisors) == 1 else None
        divided_by = (names.index(divisor), divisor) if divisor else (-1, "")
        return BackwardHelper(loss, (-1, ""), (-1, ""), "", scaled, divides, divided_by).encode()
    return None


def _steps_of(statement: ast.AST, optimizer: str) -> bool:
    """Whether ``statement`` steps ``optimizer`` anywhere in it: ``optimizer.step()`` or ``scaler.step(optimizer)``."""
    for node in walk(statement):
        if isinstance(node, ast.Call):
            name, receiver = _callee(node.func)
            if name == "step" and (receiver == optimizer or any(isinstance(a, ast.Name) and a.id == optimizer for a in node.args)):
                return True
    return False


def _handing_optimizers(calls: list[ast.Call]) -> set[str]:
    """The callees of the calls handed an argument named as an optimizer."""
    hands = set()
    for node in calls:
        if node.args:
            name, _ = _callee(node.func)
            if name is not None and any(_names_optimizer(a) for a in node.args):
                hands.add(name)
    return hands


def _lines_matching(pattern: "re.Pattern[str]", text: str) -> list[int]:
    """The lines (counted from 1, as Python's parser counts them) on which a match of ``pattern`` starts, in order."""
    lines = []
    line, position = 1, 0
    for match in pattern.finditer(text):
        line += text.count("\n", position, match.start())
        position = match.start()
        if not lines or lines[-1] != line:
            lines.append(line)
    return lines


def _near_lines(tree: ast.Module, lines: list[int], functions: list) -> Iterator[ast.AST]:
    """The nodes of the statements that span one of ``lines``, each statement's own expressions walked; every
    function definition of the tree goes into ``functions`` (a name decides only when all its definitions are read).

    A statement none of ``lines`` falls in is skipped whole, nested statements included.
    """
    stack: list[ast.stmt] = list(reversed(tree.body))
    while stack:
        statement = stack.pop()
        kind = type(statement)
        if kind is ast.FunctionDef or kind is ast.AsyncFunctionDef:
            functions.append(statement)
        decorators = getattr(statement, "decorator_list", None)
        first = bisect.bisect_left(lines, decorators[0].lineno if decorators else statement.lineno)
        if first == len(lines) or lines[first] > statement.end_lineno:
            stack.extend(reversed(_nested_definitions(statement)))
            continue
        inner = _statements_inside(statement)
        nested = set(map(id, inner))
        pending = [statement]
        while pending:
            node = pending.pop()
            yield node
            pending.extend(child for child in child_nodes(node) if id(child) not in nested)
        stack.extend(reversed(inner))


def _nested_definitions(statement: ast.stmt) -> list[ast.stmt]:
    """The function and class definitions among the statements inside ``statement``, not inside those definitions."""
    found = []
    stack = _statements_inside(statement)
    while stack:
        statement = stack.pop()
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append(statement)
            continue
        stack.extend(_statements_inside(statement))
    return found


def _statements_inside(statement: ast.AST) -> list[ast.stmt]:
    """The statements of a statement's own blocks, in source order: body, ``else``, ``finally``, handlers or cases."""
    inner: list[ast.stmt] = []
    for field in ("body", "orelse", "finalbody"):
        inner.extend(getattr(statement, field, None) or ())
    for part in getattr(statement, "handlers", None) or getattr(statement, "cases", None) or ():
        inner.extend(part.body)
    return inner


@dataclasses.dataclass(frozen=True)
class _FrameworkNames:
    """The names the frameworks' declarations give this index: read once, when the first file is scanned.

    :mod:`gradlint.frameworks` loads LibCST (its declarations judge LibCST
    nodes), and this index reads Python's own tree: importing it late keeps
    the command line's start-up free of LibCST.
    """

    wraps: dict
    constructors: dict  # the qualified names of the wrapping functions without a class name, and their wraps' keys
    wrap_classes: dict
    shard_functions: dict
    prepare_methods: dict
    preparer_names: frozenset[str]
    # What a file must spell to wrap a model for data parallelism (the wrapper classes, sharding functions and
    # preparing objects). A call or an aliased import of the wrapper, not the name in prose: a wrap is an assignment
    # from a call. ``plain`` holds substrings tried first: the pattern is slow to scan.
    wrap_tokens: re.Pattern[str]
    plain: tuple[str, ...]
    # Calls that take a wrapped model and are no call of the project's own: the wraps themselves and the frameworks'
    # contexts for the model (``model.no_sync()``, ``accelerator.accumulate(model)``).
    framework_calls: frozenset[str]
    # Calls that do gradient work: a backward (the frameworks' too), a clear, an unscale, a no-sync context of the model.
    work_calls: frozenset[str]
    # Attributes whose store does gradient work: ``p.grad`` (a clear) and the wrappers' sync flags.
    work_attributes: frozenset[str]


@functools.cache
def _names() -> _FrameworkNames:
    from gradlint import frameworks

    constructors = {c: w.key for w in frameworks.WRAPS.values() if w.class_name is None for c in w.constructors}
    wrappers = tuple(dict.fromkeys((*frameworks.WRAP_CLASSES, *frameworks.SHARD_FUNCTIONS, *(c.rsplit(".", 1)[-1] for c in constructors))))
    owners = sorted(frameworks.PREPARER_NAMES)
    return _FrameworkNames(
        wraps=frameworks.WRAPS,
        constructors=constructors,
        wrap_classes=frameworks.WRAP_CLASSES,
        shard_functions=frameworks.SHARD_FUNCTIONS,
        prepare_methods=frameworks.PREPARE_METHODS,
        preparer_names=frozenset(frameworks.PREPARER_NAMES),
        wrap_tokens=re.compile(
            rf"(?:{'|'.join(wrappers)})(?:[\s\\)]|#[^\n]*(?![^\n]))*(?:\(|as(?!\w))"
            rf"|({'|'.join(owners)})\.({'|'.join(sorted(frameworks.PREPARE_METHODS))})"
        ),
        plain=(*wrappers, *(f"{owner}." for owner in owners)),
        framework_calls=frozenset({*frameworks.SHARD_FUNCTIONS, *frameworks.NO_SYNC, *frameworks.ACCUMULATE}),
        work_calls=frozenset({"backward", "zero_grad", "unscale_", *frameworks.BACKWARD_METHODS, *frameworks.MODEL_NO_SYNC}),
        work_attributes=frozenset({"grad", *frameworks.SYNC_FLAGS}),
    )


def _may_wrap(text: str) -> bool:
    """Whether ``text`` can wrap a model (:attr:`_FrameworkNames.wrap_tokens`)."""
    names = _names()
    if any(token in text for token in names.plain):
        return names.wrap_tokens.search(text) is not None
    return False


def _wrapped_passed(calls: list[ast.Call], assigns: list[ast.Assign], from_imports: list[ast.ImportFrom]) -> frozenset[str]:
    """``function:argument:wrapper`` for each call handed, as argument ``argument`` (a position or a keyword), a name
    the file assigns a data-parallel model to: a wrapper class's instance (``DistributedDataParallel(...)``, or an
    alias), a model returned by a framework object's ``prepare``/``setup``, a module given to a sharding function
    (``fully_shard``) of the module its framework names (other libraries have functions of that name)."""
    names = _names()
    class_names = _wrapper_names(from_imports)
    shard_names: dict[str, str] = {}
    for node in from_imports:
        if not isinstance(node, ast.ImportFrom):
            continue
        for a in node.names:
            wrap = names.shard_functions.get(a.name)
            if wrap is not None and (node.module or "").startswith(wrap.function_module):
                shard_names[a.asname or a.name] = wrap.key
    wrapped: dict[str, str] = {}
    for call in calls:
        callee = _dotted(call.func) or ""
        shard = shard_names.get(callee) or _shard_of(callee)
        if shard is not None and call.args and _dotted(call.args[0]):
            wrapped.setdefault(_dotted(call.args[0]), shard)
    built: dict[str, list[ast.Call]] | None = None  # each name the file assigns calls to, and those calls
    for node in assigns:
        by = _wrapper(node.value, class_names) if isinstance(node.value, ast.Call) else None
        if by is not None and built is None:
            built = _calls_assigned(assigns)
        if by is None or _built_to_wrap_nothing(node.value, by, built):
            continue
        for target in node.targets:
            elements = target.elts if isinstance(target, ast.Tuple) else [target]
            first = _dotted(elements[0]) if elements and not isinstance(elements[0], ast.Starred) else None
            if first is not None:  # the model comes first (prepare keeps the order; setup returns it first)
                wrapped.setdefault(first, by)
    if not wrapped:
        return frozenset()
    passed = set()
    for call in calls:
        name, _ = _callee(call.func)
        if name is None or name in names.framework_calls or _wrapper(call, class_names):
            continue  # the wrap itself, or a framework's own context for the model
        for position, arg in enumerate(call.args):
            if isinstance(arg, ast.Starred):
                break
            by = wrapped.get(_dotted(arg) or "")
            if by is not None:
                passed.add(f"{name}:{position}:{by}")
        for keyword in call.keywords:
            by = wrapped.get(_dotted(keyword.value) or "") if keyword.arg else None
            if by is not None:
                passed.add(f"{name}:{keyword.arg}:{by}")
    return frozenset(passed)


def _wrapper_names(imports: list[ast.ImportFrom | ast.Import]) -> dict[str, str]:
    """The callee spellings that wrap a model in a file, and each wrap's key: the wrapper classes by name and by the
    aliases the file imports them under (``DistributedDataParallel as DDP``), and a wrapping function known by its
    full name under the names the file calls it by (``from ray.train.torch import prepare_model``, or
    ``train.torch.prepare_model`` after ``from ray import train``; ``_wrapper`` matches that dotted form)."""
    names = _names()
    found = {name: wrap.key for name, wrap in names.wrap_classes.items()}
    for node in imports:
        for a in node.names:
            if isinstance(node, ast.ImportFrom):
                if a.name in names.wrap_classes and a.asname:
                    found[a.asname] = names.wrap_classes[a.name].key
                qualified = f"{node.module}.{a.name}" if node.module and not node.level else None
            else:
                qualified = a.name if a.asname else a.name.split(".")[0]
            if qualified is None:
                continue
            local = a.asname or (a.name if isinstance(node, ast.ImportFrom) else a.name.split(".")[0])
            for constructor, key in names.constructors.items():
                if constructor == qualified:
                    found[local] = key
                elif constructor.startswith(qualified + "."):
                    found[local + constructor[len(qualified):]] = key  # ``train.torch.prepare_model``
    return found


def _wrapper(call: ast.Call, class_names: dict[str, str]) -> str | None:
    """What a call wraps a model with, when it visibly does (the key of the framework's wrap)."""
    name, owner = _callee(call.func)
    dotted = f"{owner}.{name}" if owner is not None and name is not None else None
    key = class_names.get(dotted) if dotted is not None else None
    if key is None and name in class_names:
        key = class_names[name]
        if _names().wraps[key].class_name is None and owner is not None:
            key = None  # a wrapping function's name called on something else (``self.prepare_model(model)``)
    if key is not None:
        wrap = _names().wraps[key]
        return None if wrap.leaves_unwrapped is not None and wrap.leaves_unwrapped(_literal_arguments(call)) else key
    names = _names()
    wrap = names.prepare_methods.get(name) if name is not None else None
    if wrap is not None and owner is not None and owner.rsplit(".", 1)[-1] in names.preparer_names:
        return wrap.key
    return None


def _calls_assigned(assigns: list[ast.Assign]) -> dict[str, list[ast.Call]]:
    """Each dotted name the file assigns a call to (``fabric = Fabric(devices=1)``), and those calls in order."""
    found: dict[str, list[ast.Call]] = {}
    for node in assigns:
        if isinstance(node.value, ast.Call):
            for target in node.targets:
                name = _dotted(target)
                if name is not None:
                    found.setdefault(name, []).append(node.value)
    return found


def _built_to_wrap_nothing(call: ast.Call, key: str, built: dict[str, list[ast.Call]]) -> bool:
    """Whether a framework object's ``prepare``/``setup`` call prepares for one process only: every construction the
    file assigns to its owner (``fabric = Fabric(devices=1)``, from :func:`_calls_assigned`) says so (the wrap's
    ``quiet_when_built``), as the rules read it on LibCST's tree."""
    wrap = _names().wraps[key]
    _, owner = _callee(call.func)
    if wrap.quiet_when_built is None or owner is None or not wrap.prepare_methods:
        return False
    constructions = built.get(owner, [])
    return bool(constructions) and all(wrap.quiet_when_built(_literal_arguments(value)) for value in constructions)


def _literal_arguments(call: ast.Call) -> dict[str, object]:
    """A call's arguments as :func:`gradlint.frameworks.framework.literal_arguments` reads them on LibCST's tree: by
    keyword and by position (``"0"``...), each literal's value or ``...``; ``"*"``/``"**"`` for handed-on arguments."""
    found: dict[str, object] = {}
    values = [(str(i), arg) for i, arg in enumerate(a for a in call.args if not isinstance(a, ast.Starred))]
    if any(isinstance(a, ast.Starred) for a in call.args):
        found["*"] = ...
    values += [(k.arg, k.value) for k in call.keywords if k.arg is not None]
    if any(k.arg is None for k in call.keywords):
        found["**"] = ...
    for key, value in values:
        try:
            found[key] = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            found[key] = ...
    return found


def _shard_of(callee: str) -> str | None:
    """The wrap key of a sharding function called by its full name (``torch.distributed.fsdp.fully_shard(...)``)."""
    wrap = _names().shard_functions.get(callee.rpartition(".")[2])
    if wrap is not None and callee.startswith(f"{wrap.function_module}.") and callee.endswith(f".{wrap.function}"):
        return wrap.key
    return None


def _dotted(node: ast.AST) -> str | None:
    """``self.model`` for an attribute chain of plain names."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


_OPT = re.compile("opt", re.IGNORECASE)


def _names_optimizer(node: ast.AST) -> bool:
    """``opt``, ``self.optimizer``, a parameter ``optimizer``: a name that says it is an optimizer."""
    last = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else node.arg if isinstance(node, ast.arg) else None
    return last is not None and _OPT.search(last) is not None and kind_from_name(last) is ObjKind.OPTIMIZER


def _what_handed_optimizers_get(functions: list, defines: set[str]) -> tuple[frozenset[str], frozenset[str]]:
    """Which of a file's functions step a parameter (every definition of the name), and which may clear gradients.

    Only parameters named as optimizers are followed. A function steps one when ``p.step()`` (or a scaler's
    ``scaler.step(p)``) runs whatever path the
    body takes, early returns aside (a skipped step, as a scaler's): in its
    own top-level statements, inside ``with``, in both branches of an
    ``if``/``else``, or through a call handing ``p`` to another function of
    the file that steps it (``return self._optimize_fp16(opt)``). A function
    may clear when it calls ``zero_grad``, stores into ``.grad``, or calls
    anything whose name says zero, clear or reset.
    """
    stepping: set[str] = set()
    changed = True
    by_name: dict[str, list] = {}
    handed = {}
    for function in functions:
        by_name.setdefault(function.name, []).append(function)
        handed[function] = {a.arg for a in _arguments(function) if _names_optimizer(a)}
    unread = {name for name, definitions in by_name.items() if not all(handed[f] for f in definitions)}
    while changed:  # a function steps through another of the file: until nothing more is learnt
        changed = False
        for name, definitions in by_name.items():
            if name not in stepping and name not in unread and all(_steps_parameter(f.body, handed[f], stepping) for f in definitions):
                stepping.add(name)
                changed = True
    # A function not read (no parameter named as an optimizer, or none at all in a file without one) may clear.
    clearing = (set(defines) - set(by_name)) | unread | {f.name for f in functions if handed[f] and _may_clear(f)}
    return frozenset(stepping), frozenset(clearing)


def _arguments(function) -> list[ast.arg]:
    args = function.args
    return [a for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a.arg not in ("self", "cls")]


def _parameters(function) -> set[str]:
    return {a.arg for a in _arguments(function)}


def _steps_parameter(body: list[ast.stmt], params: set[str], stepping: set[str]) -> bool:
    for statement in body:
        value = statement.value if isinstance(statement, (ast.Expr, ast.Return, ast.Assign)) else None
        if isinstance(value, ast.Call):
            name, receiver = _callee(value.func)
            if name == "step" and receiver in params:
                return True
            if name == "step" and receiver is not None and kind_from_name(receiver) is ObjKind.SCALER and any(
                isinstance(a, ast.Name) and a.id in params for a in value.args
            ):
                return True  # ``scaler.step(optimizer)``
            if name in stepping and any(isinstance(a, ast.Name) and a.id in params for a in value.args):
                return True
        elif isinstance(statement, ast.If) and statement.orelse:
            if _steps_parameter(statement.body, params, stepping) and _steps_parameter(statement.orelse, params, stepping):
                return True
        elif isinstance(statement, ast.With) and _steps_parameter(statement.body, params, stepping):
            return True
    return False


_CLEARING_NAME = re.compile(r"zero|clear|reset", re.IGNORECASE)
_READS_OPTIMIZER = ("step", "state_dict")  # calls on a handed optimizer that leave its gradients alone


def _may_clear(function) -> bool:
    """Whether a function may clear gradients: unless it visibly cannot, it may.

    It may when it calls ``zero_grad`` or anything named for zeroing, clearing
    or resetting, stores into ``.grad``, calls a name the scan cannot read, or
    hands a parameter or ``self`` on to other code, which the scan does not follow.
    """
    reachable = _parameters(function) | {"self", "cls"}
    for node in walk(function):
        if isinstance(node, ast.Call):
            name, receiver = _callee(node.func)
            if name is None or _CLEARING_NAME.search(name):
                return True
            if receiver is not None and receiver.split(".")[0] in reachable and name not in _READS_OPTIMIZER:
                return True
            arguments = [*node.args, *(k.value for k in node.keywords)]
            if any(isinstance(a, (ast.Name, ast.Attribute, ast.Starred)) and _root(a) in reachable for a in arguments):
                return True
        elif isinstance(node, ast.Attribute) and node.attr == "grad" and isinstance(node.ctx, ast.Store):
            return True
    return False


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _plain_calls(scope: ast.AST) -> set[str]:
    """Every called last name in a scope's own body (nested functions and classes left out)."""
    names = set()
    stack = list(getattr(scope, "body", []))
    while stack:
        node = stack.pop()
        if isinstance(node, _SKIPPED):
            continue
        if isinstance(node, ast.Call):
            name, _ = _callee(node.func)
            if name is not None:
                names.add(name)
        stack.extend(child_nodes(node))
    return names


def _loop_calls(loop: ast.AST) -> tuple[set[str], bool]:
    """The project-callable names a loop's (or a scope's) body calls, and whether it does gradient work spelled out in it."""
    return _calls_in(list(getattr(loop, "body", [])) + list(getattr(loop, "orelse", [])), {})


def _calls_in(
    statements: list[ast.stmt], loops: dict[ast.AST, tuple[set[str], bool]], direct: set[str] | None = None
) -> tuple[set[str], bool]:
    """The project-callable names ``statements`` call, and whether they do gradient work spelled out in them.

    ``loops`` holds the summaries of inner loops already read: such a loop's
    body is not walked again, only its header. ``direct``, when given, gets
    the names called outside those inner loops' bodies.
    """
    names = _names()
    called: set[str] = set()
    work = False
    stack: list[ast.AST] = list(statements)
    while stack:
        node = stack.pop()
        if isinstance(node, _SKIPPED):
            continue
        inner = loops.get(node)
        if inner is not None:
            called |= inner[0]
            work = work or inner[1]
            stack.extend([node.test] if type(node) is ast.While else [node.target, node.iter])
            continue
        if isinstance(node, ast.Call):
            name, receiver = _callee(node.func)
            if name is not None:
                if name in names.work_calls:
                    work = True
                elif name == "step" and receiver is not None and kind_from_name(receiver) in _NOT_PROJECT_STEP:
                    work = work or kind_from_name(receiver) is not ObjKind.SCHEDULER
                elif not name.startswith("__"):
                    called.add(name)
                    if direct is not None:
                        direct.add(name)
        elif isinstance(node, ast.Attribute) and node.attr in names.work_attributes:
            work = work or isinstance(node.ctx, ast.Store)  # a read of ``p.grad`` is logging, a store clears
        stack.extend(child_nodes(node))
    return called, work


def _callee(func: ast.AST) -> tuple[str | None, str | None]:
    """The last name of a callee and the dotted receiver, when they are plain names."""
    if isinstance(func, ast.Name):
        return func.id, None
    if isinstance(func, ast.Attribute):
        parts = []
        value = func.value
        while isinstance(value, ast.Attribute):
            parts.append(value.attr)
            value = value.value
        receiver = ".".join([value.id, *reversed(parts)]) if isinstance(value, ast.Name) else None
        return func.attr, receiver
    return None, None


class ProjectIndex:
    """The per-batch bodies of a run, per unit of code that can call each other.

    A unit is a package (the outermost folder of a chain of folders with an
    ``__init__.py``), or a script outside any package together with the
    scripts beside it that it imports (``from trainer import Trainer``):
    unrelated scripts of one tree never decide for each other.
    """

    def __init__(self, files: Iterable[tuple[str, FileCalls]]) -> None:
        files = list(files)
        unit_of = _units([path for path, _ in files], {path: calls.imports for path, calls in files})
        alone: dict[str, set[str]] = {}
        shared: dict[str, set[str]] = {}
        unscaled: dict[str, set[str]] = {}
        wrapped: dict[str, set[str]] = {}
        defined: dict[str, set[str]] = {}
        stepping: dict[str, set[str]] = {}
        not_stepping: dict[str, set[str]] = {}
        clearing: dict[str, set[str]] = {}
        wrapping: dict[str, set[str]] = {}
        not_wrapping: dict[str, set[str]] = {}
        scalers_handed: dict[str, set[str]] = {}
        releasing: dict[str, set[str]] = {}
        not_releasing: dict[str, set[str]] = {}
        dispatched: dict[str, set[str]] = {}
        clamping: dict[str, set[str]] = {}  # unit -> functions that clip gradients by hooks
        not_clamping: dict[str, set[str]] = {}
        reading: dict[str, set[str]] = {}  # unit -> functions that read the gradients of a model they are handed
        not_reading: dict[str, set[str]] = {}
        returning: dict[str, dict[str, set[str]]] = {}  # unit -> function -> what each definition returns ("" for no wrap)
        helper_shapes: dict[str, dict[str, set[str]]] = {}  # unit -> function or class -> shapes ("" for none)
        summing: dict[str, dict[str, set[str]]] = {}  # unit -> class -> where its forward returns a summed loss ("" for no)
        bound: dict[str, dict[str, set[str]]] = {}  # unit -> assigned name -> the callees assigned to it
        declared: dict[str, set[str]] = {}  # unit -> ``name=1`` / ``name=*`` of every file's declared settings
        wrapped_here: dict[str, set[str]] = {}  # path -> wrapped facts of calls of the file's own functions
        devices: dict[str, set[str]] = {}  # class name -> what the run's constructions hand it (every file of the run)
        for path, calls in files:
            unit = unit_of[path]
            alone.setdefault(unit, set()).update(calls.alone)
            shared.setdefault(unit, set()).update(calls.shared)
            unscaled.setdefault(unit, set()).update(calls.after_unscale)
            if calls.passes_wrapped:
                # A call of a function the calling file defines itself reaches that definition, not a namesake in
                # another file of the unit (``train_one_epoch(model=ddp_model)`` beside ``def train_one_epoch``).
                own = {fact for fact in calls.passes_wrapped if fact.split(":", 1)[0] in calls.top_level}
                wrapped.setdefault(unit, set()).update(calls.passes_wrapped - own)
                if own:
                    wrapped_here.setdefault(path, set()).update(own)
            defined.setdefault(unit, set()).update(calls.defines)
            stepping.setdefault(unit, set()).update(calls.steps_handed)
            not_stepping.setdefault(unit, set()).update(calls.defines - calls.steps_handed)
            clearing.setdefault(unit, set()).update(calls.clears_handed)
            wrapping.setdefault(unit, set()).update(calls.wraps_optimizer)
            not_wrapping.setdefault(unit, set()).update(calls.classes - calls.wraps_optimizer)
            scalers_handed.setdefault(unit, set()).update(calls.hands_scaler)
            releasing.setdefault(unit, set()).update(calls.releases)
            not_releasing.setdefault(unit, set()).update((calls.defines | calls.classes) - calls.releases)
            dispatched.setdefault(unit, set()).update(calls.scaled_dispatch)
            clamping.setdefault(unit, set()).update(calls.clamp_hooks)
            not_clamping.setdefault(unit, set()).update(calls.defines - calls.clamp_hooks)
            reading.setdefault(unit, set()).update(calls.reads_grads)
            not_reading.setdefault(unit, set()).update(calls.defines - calls.reads_grads)
            _join_definitions(returning.setdefault(unit, {}), calls.top_level, calls.returns_wrap)
            _join_definitions(helper_shapes.setdefault(unit, {}), calls.defines | {f"{c}()" for c in calls.classes}, calls.backward_helpers)
            _join_definitions(summing.setdefault(unit, {}), calls.classes, calls.sums_loss)
            declared.setdefault(unit, set()).update(calls.defaults)
            for fact in calls.device_args:
                devices.setdefault(fact.split(":", 1)[0], set()).add(fact)
            for fact in calls.assigned:
                target, callee = fact.split(":", 1)
                bound.setdefault(unit, {}).setdefault(target, set()).add(callee)
        self._per_batch = {unit: frozenset(alone[unit] - shared[unit]) for unit in alone}
        self._called = {unit: frozenset(alone[unit] | shared[unit]) for unit in alone}
        self._unscaled = {unit: frozenset(names) for unit, names in unscaled.items()}
        self._wrapped = {unit: frozenset(names) for unit, names in wrapped.items()}
        self._wrapped_here = {path: frozenset(names) for path, names in wrapped_here.items()}
        # A name decides only when every definition of it in the unit agrees.
        self._steps_handed = {unit: frozenset(stepping[unit] - not_stepping[unit]) for unit in stepping}
        self._keeps_handed = {unit: frozenset(defined[unit] - clearing[unit]) for unit in defined}
        self._wraps_optimizer = {unit: frozenset(wrapping[unit] - not_wrapping[unit]) for unit in wrapping}
        self._handed_scaler = {unit: frozenset(names) for unit, names in scalers_handed.items()}
        self._releases = {unit: frozenset(releasing[unit] - not_releasing[unit]) for unit in releasing}
        self._scaled_dispatch = {unit: frozenset(names) for unit, names in dispatched.items()}
        self._clamp_hooks = {unit: frozenset(clamping[unit] - not_clamping[unit]) for unit in clamping}
        self._reads_grads = {unit: frozenset(reading[unit] - not_reading[unit]) for unit in reading}
        self._defined = {unit: frozenset(names) for unit, names in defined.items()}
        self._returns_wrap = {unit: _agreed(found) for unit, found in returning.items()}
        self._helper_shapes = {unit: _agreed(found) for unit, found in helper_shapes.items()}
        self._summing = {unit: _agreed(found) for unit, found in summing.items()}
        self._bound = bound
        self._declared = declared
        self._devices = devices
        self._units_in: dict[str, set[str]] = {}  # each folder's units: a package beside a script, or a folder of modules
        self._imported_folders: dict[str, set[str]] = {}  # each unit's folders beside its files that they import
        for path, calls in files:
            folder = os.path.dirname(os.path.abspath(path))
            self._units_in.setdefault(folder, set()).add(unit_of[path])
            self._imported_folders.setdefault(unit_of[path], set()).update(os.path.join(folder, name) for name in calls.imports)
        # each package's importers: the units whose files import the package's folder (a script beside it)
        self._importers: dict[str, set[str]] = {}
        for unit, folders in self._imported_folders.items():
            for folder in folders:
                imported = f"package\0{os.path.abspath(folder)}"
                if imported != unit and imported in self._called:
                    self._importers.setdefault(imported, set()).add(unit)
        self._unit_of = unit_of
        self._known: dict[str, tuple[dict[str, str], dict[str, str], dict[str, str]]] = {}  # _known_to's answer per unit
        self._ones: dict[str, frozenset[str]] = {}  # _shipping_at_one's answer per unit

    def context_of(self, path: str, calls: FileCalls) -> tuple[str, ...]:
        """What a file's findings depend on beyond its own text, among its own functions' names.

        The per-batch bodies; prefixed ``called:``, those some loop of the unit calls;
        prefixed ``unscaled:``, those some function of the unit calls in a body that
        also calls ``unscale_``; prefixed ``wrapped:``, ``function:argument:wrapper`` for
        those some call of the unit hands a data-parallel model. Beyond its own functions,
        among the names it hands an optimizer to: prefixed ``steps:``, those every definition
        of which in the unit steps the optimizer it is handed; prefixed ``keeps:``, those
        defined in the unit and never clearing. Prefixed ``wraps:``, the classes of the unit's other
        files whose ``step()`` and ``zero_grad()`` are an optimizer's (every definition agreeing), which
        this file may build. Prefixed ``scaler:``, its functions some call of the unit hands a grad
        scaler; prefixed ``releases:``, the functions of the unit's other files that set gradient release
        up (every definition agreeing), which this file may call; prefixed ``scaled:``, ``callback:function``
        for its callbacks some function of the unit runs by name while the gradients are still scaled
        (:mod:`gradlint.scaler_release_facts`). Prefixed ``returns:``, ``function:wrapper`` for the functions
        of the unit or of a folder beside it that it imports whose result this file assigns and which return a
        wrapped model; prefixed ``backs:``, ``name:shape`` for the backward helpers it hands an optimizer to
        (:meth:`_known_to`); prefixed ``clamps:``, the functions of the unit that clip gradients by hooks on a
        model's parameters (every definition agreeing), its own among them;
        prefixed ``sums:``, ``name:position`` for the names it binds only to models whose
        ``forward`` returns a summed loss (:func:`_summing_models`); prefixed ``ships_at_one:``, the names it reads as
        counts that the unit (or a folder it imports) declares with the default 1, every declaration agreeing
        (:mod:`gradlint.setting_defaults`); prefixed ``reads_grads:``, the functions of the unit's other files that read
        the gradients of a model they are handed (every definition agreeing); prefixed ``devices:``, ``Class:slot=kind`` for
        what the constructions anywhere in the run hand its classes at an argument spelled as a device (every file of the
        run, not the unit: a class is often built by scripts that import it from afar). :class:`Context` reads them all
        back.
        """
        unit = self._unit_of.get(path, path)
        per_batch = self._per_batch.get(unit, frozenset()) & calls.defines
        # a loop of a script importing the package calls its functions too (``for epoch in ...: train_epoch(...)``)
        called = self._called.get(unit, frozenset()).union(
            *(self._called.get(importer, frozenset()) for importer in sorted(self._importers.get(unit, ())))
        ) & calls.defines
        unscaled = self._unscaled.get(unit, frozenset()) & calls.defines
        wrapped = [
            fact for fact in self._wrapped.get(unit, frozenset()) | self._wrapped_here.get(path, frozenset())
            if fact.split(":", 1)[0] in calls.defines
        ]
        steps = self._steps_handed.get(unit, frozenset()) & calls.hands
        keeps = self._keeps_handed.get(unit, frozenset()) & calls.hands
        # A file's own wrappers it reads itself; a class of another file is named here only if this file may build it.
        wrappers = sorted(self._wraps_optimizer.get(unit, frozenset()) - calls.classes)
        handed_scaler = self._handed_scaler.get(unit, frozenset()) & calls.defines
        # A file's own release set-ups it reads itself; those of other files apply where it calls them.
        releases = self._releases.get(unit, frozenset()) - calls.defines - calls.classes
        scaled = [fact for fact in self._scaled_dispatch.get(unit, ()) if fact.split(":", 1)[0] in calls.defines]
        callees = {fact.split(":", 1)[1] for fact in calls.assigned}
        returned, helpers, summing = self._known_to(unit)
        returns = sorted(f"{name}:{returned[name]}" for name in callees - calls.top_level if name in returned)
        # A helper that steps is known where it is handed an optimizer; one that only backpropagates, where a loop calls it.
        backs = sorted(
            f"{name}:{helpers[name]}" for name in calls.hands | calls.alone | calls.shared
            if name in helpers and (name in calls.hands or not BackwardHelper.decode(helpers[name]).steps)
        )
        return (
            tuple(sorted(per_batch))
            + tuple(CALLED_IN_LOOP + name for name in sorted(called))
            + tuple(UNSCALED_BY_CALLER + name for name in sorted(unscaled))
            + tuple(WRAPPED_BY_CALLER + fact for fact in sorted(wrapped))
            + tuple(STEPS_HANDED + name for name in sorted(steps))
            + tuple(KEEPS_HANDED + name for name in sorted(keeps))
            + tuple(WRAPS_OPTIMIZER + name for name in wrappers)
            + tuple(HANDED_SCALER + name for name in sorted(handed_scaler))
            + tuple(RELEASES + name for name in sorted(releases))
            + tuple(SCALED_DISPATCH + name for name in sorted(scaled))
            + tuple(RETURNS_WRAP + fact for fact in returns)
            + tuple(BACKWARD_HELPER + fact for fact in backs)
            + tuple(CLAMP_HOOKS + name for name in sorted(self._clamp_hooks.get(unit, frozenset())))
            + tuple(SUMS_LOSS + fact for fact in _summing_models(calls.assigned, summing))
            + tuple(SHIPS_AT_ONE + name for name in sorted(calls.count_names & self._shipping_at_one(unit)))
            + tuple(READS_GRADS + name for name in sorted(self._grad_readers(unit) - calls.defines))
            + tuple(DEVICE_ARGS + fact for name in sorted(calls.classes) for fact in sorted(self._devices.get(name, ())))
        )

    def _known_to(self, unit: str) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        """The functions returning a wrapped model, the backward helpers and the classes whose forward sums the loss
        that a unit's files can call: the unit's own,
        and those of the folders beside its files that they import, a package or a folder of modules
        (``from utils.torch_utils import smart_DDP`` in a script beside ``utils/``, ``import util.misc as misc``); the
        unit decides a name both know. A helper class is reached through the names the unit binds to its instances.
        Computed once per unit: every file of a unit asks the same (on a package of thousands of files, merging the
        tables again for each file made the run's cost grow with the square of the package)."""
        known = self._known.get(unit)
        if known is None:
            known = self._known[unit] = self._merge_known(unit)
        return known

    def _grad_readers(self, unit: str) -> frozenset[str]:
        """The functions that read a handed model's gradients in the unit and the folders beside it that it imports; a
        name the unit itself defines otherwise decides."""
        units = self._units_known_to(unit)
        found = frozenset().union(*(self._reads_grads.get(each, frozenset()) for each in units[1:]))
        return self._reads_grads.get(unit, frozenset()) | (found - self._defined.get(unit, frozenset()))

    def _units_known_to(self, unit: str) -> list[str]:
        """The unit, then the units of the folders beside its files that they import."""
        units = [unit]
        for folder in sorted(self._imported_folders.get(unit, ())):
            units.extend(sorted(self._units_in.get(folder, set()) - set(units)))
        return units

    def _shipping_at_one(self, unit: str) -> frozenset[str]:
        """The settings every declaration of which, in the unit and the folders it imports, ships at 1 (computed once
        per unit)."""
        found = self._ones.get(unit)
        if found is None:
            found = self._ones[unit] = merged(frozenset(), frozenset().union(
                *(self._declared.get(each, ()) for each in self._units_known_to(unit))
            ))
        return found

    def _merge_known(self, unit: str) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        units = self._units_known_to(unit)
        returned: dict[str, str] = {}
        shapes: dict[str, str] = {}
        summing: dict[str, str] = {}
        for each in units:
            for name, key in self._returns_wrap.get(each, {}).items():
                returned.setdefault(name, key)
            for name, shape in self._helper_shapes.get(each, {}).items():
                shapes.setdefault(name, shape)
            for name, position in self._summing.get(each, {}).items():
                summing.setdefault(name, position)
        return returned, _helpers_by_name(shapes, self._bound.get(unit, {})), summing


def _join_definitions(table: dict[str, set[str]], defined: Iterable[str], facts: Iterable[str]) -> None:
    """Add what one file says of the names it defines: each ``name:value`` fact, and ``""`` for a definition without one."""
    said = {}
    for fact in facts:
        name, value = fact.split(":", 1)
        said[name] = value
    for name in defined:
        table.setdefault(name, set()).add(said.get(name, ""))


def _agreed(table: dict[str, set[str]]) -> dict[str, str]:
    """The names whose every definition in the unit says the same (and says something)."""
    return {name: next(iter(values)) for name, values in table.items() if len(values) == 1 and "" not in values}


def _helpers_by_name(shapes: dict[str, str], bound: dict[str, set[str]]) -> dict[str, str]:
    """The names a call may reach a backward helper by: a helper function's own name, or a name every assignment of a
    call in the unit binds to an instance of helper classes of one shape (``loss_scaler = NativeScaler()``; classes
    are noted as ``Name()``)."""
    found = {name: shape for name, shape in shapes.items() if not name.endswith("()")}
    for name, callees in bound.items():
        known = {shapes.get(f"{callee}()", "") for callee in callees}
        if len(known) == 1 and "" not in known:
            found.setdefault(name, known.pop())
    return found


def _summing_models(assigned: frozenset[str], summing: dict[str, str]) -> list[str]:
    """``name:position`` for each name the file binds to models of classes whose forward returns a summed loss: every
    class construction assigned to it (``target:callee`` in ``assigned``) builds one of them, the same place of the
    returned tuple each time, or wraps a model for data parallelism (``model = DDP(model)``)."""
    built: dict[str, set[str]] = {}
    for fact in assigned:
        target, callee = fact.split(":", 1)
        built.setdefault(target, set()).add(callee)
    if not any(c in summing for callees in built.values() for c in callees):
        return []  # the frameworks' wrapper names are loaded only when needed
    wrappers = set(_names().wrap_classes)
    found = []
    for target, callees in sorted(built.items()):
        positions = {summing[c] for c in callees if c in summing}
        if len(positions) == 1 and all(c in summing or c in wrappers for c in callees):
            found.append(f"{target}:{positions.pop()}")
    return found


def alone_in_its_run(calls: FileCalls) -> tuple[str, ...]:
    """The context of a file checked on its own (the flake8 plugin, ``lint_text``): its own code decides."""
    return ProjectIndex([("<alone>", calls)]).context_of("<alone>", calls)


def join_scope(path: str, known: dict[str, str | None]) -> str:
    """The widest set of files ``path``'s unit can span, named: its outermost package, or outside packages its folder
    (a script joins only the scripts beside it). ``known`` caches package roots between calls."""
    folder = os.path.dirname(path)
    root = _package_root(folder, known)
    return "package\0" + root if root is not None else "scripts\0" + os.path.abspath(folder or ".")


def _units(paths: list[str], imports: dict[str, frozenset[str]]) -> dict[str, str]:
    """Each path's unit: its top package folder, or, outside packages, a name shared with the sibling scripts it imports."""
    packages: dict[str, str | None] = {}
    parent = {path: path for path in paths}

    def find(path: str) -> str:
        while parent[path] != path:
            parent[path] = parent[parent[path]]
            path = parent[path]
        return path

    by_folder_module = {(os.path.dirname(p), os.path.splitext(os.path.basename(p))[0]): p for p in paths}
    for path in paths:
        if _package_root(os.path.dirname(path), packages) is not None:
            continue
        folder = os.path.dirname(path)
        for name in imports.get(path, ()):
            sibling = by_folder_module.get((folder, name))
            if sibling is not None and _package_root(folder, packages) is None:
                parent[find(sibling)] = find(path)
    units = {}
    for path in paths:
        root = _package_root(os.path.dirname(path), packages)
        units[path] = ("package", root) if root is not None else ("scripts", find(path))
    return {path: "\0".join(unit) for path, unit in units.items()}


def _package_root(folder: str, known: dict[str, str | None]) -> str | None:
    """The outermost folder of the chain of packages holding ``folder``; None when ``folder`` is no package."""
    if folder in known:
        return known[folder]
    root = None
    if os.path.isfile(os.path.join(folder or ".", "__init__.py")):
        above = os.path.dirname(os.path.abspath(folder or "."))
        outer = _package_root(above, known) if above != os.path.abspath(folder or ".") else None
        root = outer if outer is not None else os.path.abspath(folder or ".")
    known[folder] = root
    return root
