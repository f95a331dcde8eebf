"""Whether an LR scheduler stepped inside ``accelerator.accumulate`` is certainly not accelerate's prepared one.

accelerate's ``prepare`` wraps a scheduler in ``AcceleratedScheduler``, whose ``step()`` returns
without stepping on the micro-batches where gradients are not synchronised. A plain scheduler
has no such check. The module is read by names (``lr_scheduler`` and ``self.lr_scheduler`` are
one name here); any sign that the scheduler might be prepared elsewhere keeps the answer "no".
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import libcst as cst

from gradlint.module_index import ModuleIndex
from gradlint.syntax import every_node

TORCH_SCHEDULERS = frozenset({
    "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR",
    "SequentialLR", "CosineAnnealingLR", "ChainedScheduler", "CyclicLR", "CosineAnnealingWarmRestarts",
    "OneCycleLR", "PolynomialLR",
})
SCHEDULE_FACTORY_MODULES = ("transformers", "diffusers")
SCHEDULE_FACTORY = re.compile(r"get_(\w*_)?schedul")
PREPARE_CALLS = frozenset({"prepare", "prepare_scheduler"})


def terminal(node: cst.BaseExpression) -> str | None:
    """The last name of ``x`` or ``a.b.x``."""
    if type(node) is cst.Name:
        return node.value
    if type(node) is cst.Attribute:
        return node.attr.value
    return None


class ModuleFacts:
    """What one module does with its schedulers and its ``prepare`` calls, by name.

    Fed every node of the module (:meth:`read`), in any order: each fact is a set or an any-of.
    """

    def __init__(self) -> None:
        self.classes: set[str] = set()
        self.functions: set[str] = set()
        self.factories: set[str] = set()  # names imported as schedule factories or torch scheduler classes
        self.built: set[str] = set()  # names assigned a new scheduler
        self.assigned_otherwise: set[str] = set()  # names assigned something that is not certainly a new scheduler
        self.calls: list[cst.Call] = []
        self.prepared: set[str] = set()  # names handed to prepare()
        self.prepare_unclear = False  # a prepare() call with *args or **kwargs
        self.unpacked: list[tuple[str, str | None]] = []  # (name, helper function) of ``a, b = helper(...)``
        self._assignments: list[cst.Assign | cst.AnnAssign | cst.AugAssign] = []  # judged once the imports are read

    def read(self, nodes: Iterable[cst.CSTNode]) -> ModuleFacts:
        """Note what each node says; the node types that say nothing are skipped on one dictionary lookup.

        Assignments are judged last, once every import has named the module's scheduler factories.
        """
        readers = _READERS
        for node in nodes:
            reader = readers.get(type(node))
            if reader is not None:
                reader(self, node)
        for node in self._assignments:
            self._read_assignment(node)
        self._assignments.clear()
        return self

    def _read_class(self, node: cst.ClassDef) -> None:
        self.classes.add(node.name.value)

    def _read_function(self, node: cst.FunctionDef) -> None:
        self.functions.add(node.name.value)

    def _read_import(self, node: cst.ImportFrom) -> None:
        module = _dotted(node.module) if node.module else ""
        if type(node.names) is cst.ImportStar:
            return
        for alias in node.names:
            name = terminal(alias.name)
            local = terminal(alias.asname.name) if alias.asname else name
            if module == "torch.optim.lr_scheduler" and name in TORCH_SCHEDULERS:
                self.factories.add(local)
            elif module.split(".")[0] in SCHEDULE_FACTORY_MODULES and name and SCHEDULE_FACTORY.match(name):
                self.factories.add(local)

    def _read_call(self, node: cst.Call) -> None:
        self.calls.append(node)
        if terminal(node.func) in PREPARE_CALLS:
            for arg in node.args:
                if arg.star:
                    self.prepare_unclear = True
                self.prepared |= _names_in(arg.value)

    def _defer_assignment(self, node: cst.Assign | cst.AnnAssign | cst.AugAssign) -> None:
        self._assignments.append(node)

    def _read_assignment(self, node: cst.Assign | cst.AnnAssign | cst.AugAssign) -> None:
        if type(node) is cst.Assign:
            for target in node.targets:
                self._assign(target.target, node.value)
        elif type(node) is cst.AnnAssign:
            if node.value is not None:
                self._assign(node.target, node.value)
        else:
            self._assign(node.target, None)

    def _assign(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        if type(target) in (cst.Tuple, cst.List):
            # ``opt, sched = setup(...)``: fine only from a helper of this module, whose body is read here too
            helper = value.func.value if type(value) is cst.Call and type(value.func) is cst.Name else None
            for element in target.elements:
                name = terminal(element.value)
                if name:
                    self.unpacked.append((name, helper))
            return
        name = terminal(target)
        if name is None:
            return
        if value is not None and self._builds_scheduler(value):
            self.built.add(name)
        elif value is not None and terminal(value) == name:
            pass  # self.lr_scheduler = lr_scheduler
        else:
            self.assigned_otherwise.add(name)

    def _builds_scheduler(self, value: cst.BaseExpression) -> bool:
        if type(value) is not cst.Call:
            return False
        func = value.func
        if type(func) is cst.Name:
            return func.value in self.factories
        if type(func) is cst.Attribute:
            return func.attr.value in TORCH_SCHEDULERS and _dotted(func.value).endswith("lr_scheduler")
        return False


_READERS = {
    cst.ClassDef: ModuleFacts._read_class,
    cst.FunctionDef: ModuleFacts._read_function,
    cst.ImportFrom: ModuleFacts._read_import,
    cst.Call: ModuleFacts._read_call,
    cst.Assign: ModuleFacts._defer_assignment,
    cst.AnnAssign: ModuleFacts._defer_assignment,
    cst.AugAssign: ModuleFacts._defer_assignment,
}


def certainly_unprepared(index: ModuleIndex, scheduler: str, optimizer: str, accelerator: str) -> bool:
    """Whether ``scheduler`` is a plain scheduler built here that no ``prepare`` call can have wrapped,
    while ``optimizer`` is prepared (or handed to a helper together with ``accelerator``)."""
    facts = _facts(index)
    if facts.prepare_unclear or scheduler in facts.prepared or scheduler not in facts.built:
        return False
    if scheduler in facts.assigned_otherwise:
        return False
    if any(name == scheduler and helper not in facts.functions for name, helper in facts.unpacked):
        return False
    optimizer_prepared = optimizer in facts.prepared
    for call in facts.calls:
        names: set[str] = set()
        for arg in call.args:
            names |= _names_in(arg.value)
        if scheduler in names and not (type(call.func) is cst.Name and call.func.value in facts.classes):
            return False  # handed to a function that might prepare it
        if optimizer in names and accelerator in names:
            optimizer_prepared = True
    return optimizer_prepared


def prepared_in(function: cst.FunctionDef, name: str) -> bool:
    """Whether ``function`` hands an object of this last name to a ``prepare`` call (accelerate wraps it)."""
    return name in ModuleFacts().read(every_node(function)).prepared


def _facts(index: ModuleIndex) -> ModuleFacts:
    """The facts of the module ``index`` was built from, read from its parent map (which holds every node but the
    module); once per file: GL301 asks once per scheduler step."""
    return index.file.once(_facts, lambda: ModuleFacts().read(index.parents))


def _names_in(node: cst.BaseExpression) -> set[str]:
    """The objects an argument hands over: ``x``, ``self.x`` (by last name), in tuples, lists, dicts, ``a if c else b``.

    ``x.get_last_lr()`` or ``f"{x}"`` use ``x`` without handing it over.
    """
    if type(node) in (cst.Name, cst.Attribute):
        return {terminal(node)}
    if type(node) in (cst.Tuple, cst.List, cst.Set):
        return set().union(*(_names_in(e.value) for e in node.elements))
    if type(node) is cst.Dict:
        return set().union(*(_names_in(e.value) for e in node.elements))
    if type(node) is cst.IfExp:
        return _names_in(node.body) | _names_in(node.orelse)
    if type(node) is cst.BooleanOperation:
        return _names_in(node.left) | _names_in(node.right)
    return set()


def _dotted(node: cst.BaseExpression) -> str:
    if type(node) is cst.Name:
        return node.value
    if type(node) is cst.Attribute:
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""
