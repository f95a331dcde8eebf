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
alone is the whole iteration, and what it lacks, the iteration lacks. Names
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
import os
import re
from collections.abc import Iterable

from gradlint.objects import ObjKind, kind_from_name

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

    def to_json(self) -> list[list[str]]:
        """A form the cache can store."""
        return [sorted(self.alone), sorted(self.shared), sorted(self.defines), sorted(self.imports), sorted(self.after_unscale)]

    @classmethod
    def from_json(cls, data: list[list[str]]) -> "FileCalls":
        """The inverse of :meth:`to_json`."""
        alone, shared, defines, imports, after_unscale = data
        return cls(frozenset(alone), frozenset(shared), frozenset(defines), frozenset(imports), frozenset(after_unscale))


# In a file's context, the prefixes of a function some loop of the run calls, and of one
# some caller of the run unscales gradients around; a plain name is a per-batch body.
CALLED_IN_LOOP = "called:"
UNSCALED_BY_CALLER = "unscaled:"


@dataclasses.dataclass(frozen=True)
class Context:
    """What the other files of a run say about one file's functions, read back from its context names."""

    per_batch: frozenset[str] = frozenset()  # called once per batch by loops that leave the gradient work to them
    called_in_loop: frozenset[str] = frozenset()  # called from some loop of the run
    unscaled_by_caller: frozenset[str] = frozenset()  # called by a function that also calls unscale_

    @classmethod
    def of(cls, names: Iterable[str]) -> "Context":
        """The context a file's context names (:meth:`ProjectIndex.context_of`) stand for."""
        per_batch, called, unscaled = set(), set(), set()
        for name in names:
            if name.startswith(CALLED_IN_LOOP):
                called.add(name[len(CALLED_IN_LOOP):])
            elif name.startswith(UNSCALED_BY_CALLER):
                unscaled.add(name[len(UNSCALED_BY_CALLER):])
            else:
                per_batch.add(name)
        return cls(frozenset(per_batch), frozenset(called), frozenset(unscaled))


def python_tree(text: str) -> ast.Module | None:
    """Python's tree of ``text``, or None when Python cannot read it (what :func:`scan_calls` then assumes)."""
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def might_call(text: str) -> bool:
    """Whether :func:`scan_calls` can find anything in ``text``: a loop or a function definition is spelled in it."""
    return "for " in text or "while " in text or "def " in text


def scan_calls(text: str, tree: ast.Module | None = None) -> FileCalls:
    """The names a file's loops call, and the functions it defines; empty when Python cannot parse it.

    ``tree``, Python's tree of ``text`` when the caller has parsed it already, saves parsing it again.
    """
    if not might_call(text):
        return FileCalls()
    if tree is None:
        tree = python_tree(text)
        if tree is None:
            return FileCalls()
    return _Scan(_lines_naming("unscale_", text)).file(tree)


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
            elif kind in _LOOPS:
                loops.append(statement)
            inner: list[ast.stmt] = []
            for field in ("body", "orelse", "finalbody"):
                inner.extend(getattr(statement, field, None) or ())
            for part in getattr(statement, "handlers", None) or getattr(statement, "cases", None) or ():
                inner.extend(part.body)
            stack.extend(reversed(inner))
        for loop in reversed(loops):  # inner loops first: an enclosing loop reads their summaries
            self._loop(loop)
        return FileCalls(
            frozenset(self.alone), frozenset(self.shared), frozenset(self.defines), frozenset(self.imports), frozenset(self.after_unscale)
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
        called, work = self._calls_in(loop.body + loop.orelse)
        self.loops[loop] = (called, work)
        doing_work = sum(1 for name in called if _GRADIENT_WORK.search(name))
        for name in called:
            others_work = work or doing_work - (1 if _GRADIENT_WORK.search(name) else 0) > 0
            (self.shared if others_work else self.alone).add(name)

    def _calls_in(self, statements: list[ast.stmt]) -> tuple[set[str], bool]:
        """The project-callable names these statements call, and whether they do gradient work spelled out in them."""
        called: set[str] = set()
        work = False
        stack: list[ast.AST] = list(statements)
        loops = self.loops
        while stack:
            node = stack.pop()
            if isinstance(node, _SKIPPED):
                continue
            inner = loops.get(node)
            if inner is not None:  # an inner loop: its body is summarised, only its header is left to read
                called |= inner[0]
                work = work or inner[1]
                stack.extend([node.test] if type(node) is ast.While else [node.target, node.iter])
                continue
            if isinstance(node, ast.Call):
                name, receiver = _callee(node.func)
                if name is not None:
                    if name in ("backward", "zero_grad", "no_sync", "unscale_", "manual_backward"):
                        work = True
                    elif name == "step" and receiver is not None and kind_from_name(receiver) in _NOT_PROJECT_STEP:
                        work = work or kind_from_name(receiver) is not ObjKind.SCHEDULER
                    elif not name.startswith("__"):
                        called.add(name)
            elif isinstance(node, ast.Attribute) and node.attr in ("grad", "require_backward_grad_sync"):
                work = work or isinstance(node.ctx, ast.Store)  # a read of ``p.grad`` is logging, a store clears
            stack.extend(ast.iter_child_nodes(node))
        return called, work


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
        stack.extend(ast.iter_child_nodes(node))
    return names


def _loop_calls(loop: ast.AST) -> tuple[set[str], bool]:
    """The project-callable names a loop's body calls, and whether it does gradient work spelled out in it."""
    called: set[str] = set()
    work = False
    stack = list(getattr(loop, "body", [])) + list(getattr(loop, "orelse", []))
    while stack:
        node = stack.pop()
        if isinstance(node, _SKIPPED):
            continue
        if isinstance(node, ast.Call):
            name, receiver = _callee(node.func)
            if name is not None:
                if name in ("backward", "zero_grad", "no_sync", "unscale_", "manual_backward"):
                    work = True
                elif name == "step" and receiver is not None and kind_from_name(receiver) in _NOT_PROJECT_STEP:
                    work = work or kind_from_name(receiver) is not ObjKind.SCHEDULER
                elif not name.startswith("__"):
                    called.add(name)
        elif isinstance(node, ast.Attribute) and node.attr in ("grad", "require_backward_grad_sync"):
            work = work or isinstance(node.ctx, ast.Store)  # a read of ``p.grad`` is logging, a store clears
        stack.extend(ast.iter_child_nodes(node))
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
        for path, calls in files:
            unit = unit_of[path]
            alone.setdefault(unit, set()).update(calls.alone)
            shared.setdefault(unit, set()).update(calls.shared)
            unscaled.setdefault(unit, set()).update(calls.after_unscale)
        self._per_batch = {unit: frozenset(alone[unit] - shared[unit]) for unit in alone}
        self._called = {unit: frozenset(alone[unit] | shared[unit]) for unit in alone}
        self._unscaled = {unit: frozenset(names) for unit, names in unscaled.items()}
        self._unit_of = unit_of

    def context_of(self, path: str, calls: FileCalls) -> tuple[str, ...]:
        """What a file's findings depend on beyond its own text, among its own functions' names.

        The per-batch bodies; prefixed ``called:``, those some loop of the unit calls;
        prefixed ``unscaled:``, those some function of the unit calls in a body that
        also calls ``unscale_`` (:class:`Context` reads them back).
        """
        unit = self._unit_of.get(path, path)
        per_batch = self._per_batch.get(unit, frozenset()) & calls.defines
        called = self._called.get(unit, frozenset()) & calls.defines
        unscaled = self._unscaled.get(unit, frozenset()) & calls.defines
        return (
            tuple(sorted(per_batch))
            + tuple(CALLED_IN_LOOP + name for name in sorted(called))
            + tuple(UNSCALED_BY_CALLER + name for name in sorted(unscaled))
        )


def alone_in_its_run(calls: FileCalls) -> tuple[str, ...]:
    """The context of a file checked on its own (the flake8 plugin, ``lint_text``): its own code decides."""
    return ProjectIndex([("<alone>", calls)]).context_of("<alone>", calls)


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
