"""What one walk of a module reads for the frameworks: accumulation settings, framework subclasses, wraps.

Each framework module declares the constructors whose keyword sets its
accumulation count (:class:`~gradlint.frameworks.framework.AccumulationSetting`),
the functions handed a configuration that does
(:class:`~gradlint.frameworks.framework.ConfigSetting`), the bases whose
subclasses it calls (:class:`~gradlint.frameworks.framework.Subclasses`)
and the wrapper classes and sharding functions it wraps models with
(:class:`~gradlint.frameworks.framework.Wrap`). One walk of the module
answers for all of them, skipped when the text names none of the last
parts of the names they match (:data:`LAST_NAMES`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import libcst as cst

from gradlint.frameworks import FRAMEWORKS
from gradlint.frameworks.framework import literal_arguments
from gradlint.imports import ImportMap
from gradlint.syntax import TRIVIA, ChildrenOf, children, dotted_name, keyword_arg, number, parameter_names, walk

if TYPE_CHECKING:
    from gradlint.model import LoopModel

_ACCUMULATION = [(key, setting) for framework in FRAMEWORKS for key, setting in framework.accumulation_settings.items()]
_CONFIGS = [(key, setting) for framework in FRAMEWORKS for key, setting in framework.config_settings.items()]
_SUBCLASSES = [subclasses for framework in FRAMEWORKS for subclasses in framework.subclasses]
_WRAP_CONSTRUCTORS = [(wrap, wrap.constructors) for framework in FRAMEWORKS for wrap in framework.wraps if wrap.constructors]
_WRAP_FUNCTIONS = [
    (wrap.key, f"{wrap.function_module}.", f".{wrap.function}")
    for framework in FRAMEWORKS for wrap in framework.wraps if wrap.function is not None
]
# The last part of every name above: a module names one of them (in the call, the base class or its
# import) wherever a setting, subclass or wrap can be read.
LAST_NAMES = tuple(dict.fromkeys(name for framework in FRAMEWORKS for name in framework.settings_names()))


@dataclasses.dataclass
class AccumulationSettings:
    """What a module shows of one framework's accumulation count."""

    counts: list[cst.BaseExpression] = dataclasses.field(default_factory=list)  # the value given to each construction
    # Whether the module builds the framework's object, and whether one of them may accumulate (a count that may
    # exceed 1, a plugin, ``**kwargs``); one that cannot syncs on every batch.
    built: bool = False
    without_count: int = 0  # constructions given no count
    may_accumulate: bool = False
    # The configurations handed to the framework, by name, and the key that holds the count in them: a
    # ``config["gradient_accumulation_steps"]`` read of one is the count, however the configuration was made.
    config_reads: list[tuple[str, str]] = dataclasses.field(default_factory=list)


_NONE = AccumulationSettings()


@dataclasses.dataclass
class FrameworkSettings:
    """The accumulation settings, framework subclasses and wraps one module shows."""

    accumulation: dict[str, AccumulationSettings] = dataclasses.field(default_factory=dict)  # by setting name
    classes: dict[str, list[cst.ClassDef]] = dataclasses.field(default_factory=dict)  # by subclass role
    wraps: dict[str, list[cst.Call]] = dataclasses.field(default_factory=dict)  # wrapping calls by wrap key

    def accumulation_of(self, name: str) -> AccumulationSettings:
        """The settings named ``name`` (empty when the module shows none)."""
        return self.accumulation.get(name, _NONE)

    def classes_of(self, role: str) -> list[cst.ClassDef]:
        """The classes of one role (empty when there are none)."""
        return self.classes.get(role, [])

    def wrap_calls(self, key: str) -> list[cst.Call]:
        """The calls of one wrap (empty when there are none)."""
        return self.wraps.get(key, [])


def framework_settings(model: LoopModel) -> FrameworkSettings:
    """The framework settings of ``model``'s module (computed once per file)."""
    return model.file.once(framework_settings, lambda: _settings_of(model))


def _settings_of(model: LoopModel) -> FrameworkSettings:
    if model.text is not None and not any(name in model.text for name in LAST_NAMES):
        return FrameworkSettings()  # nothing below can match: the walk is skipped
    return _read(model.module, model.file.children)


def counts_more_than_one(value: cst.BaseExpression) -> bool:
    """Whether an accumulation setting may be above 1: anything but a literal 0 or 1."""
    literal = number(value)
    return literal is None or literal > 1


def _read(module: cst.Module, children_of: ChildrenOf = children) -> FrameworkSettings:
    imports = ImportMap()
    calls: list[cst.Call] = []
    classes: list[cst.ClassDef] = []
    dicts: dict[str, list[cst.Dict]] = {}
    keyed: dict[tuple[str, str], list[cst.BaseExpression]] = {}  # ``config["key"] = value``, by (config, key)
    names: dict[str, list[cst.BaseExpression]] = {}  # ``name = value`` anywhere in the module (a base class made by a factory)
    functions: dict[str, list[cst.FunctionDef]] = {}
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind in (cst.Import, cst.ImportFrom):
            imports.add(node)
            continue
        if kind is cst.Call:
            calls.append(node)
        elif kind is cst.ClassDef:
            classes.append(node)
        elif kind is cst.FunctionDef:
            functions.setdefault(node.name.value, []).append(node)
        if kind is cst.Assign:
            for target in node.targets:
                if type(target.target) is cst.Name:
                    names.setdefault(target.target.value, []).append(node.value)
        if kind is cst.Assign and type(node.value) is cst.Dict:
            for target in node.targets:
                name = dotted_name(target.target)
                if name:
                    dicts.setdefault(name, []).append(node.value)
        elif kind is cst.Assign:
            for target in node.targets:
                read = subscript_key(target.target)
                if read is not None:
                    keyed.setdefault(read, []).append(node.value)
        if kind not in TRIVIA:
            stack.extend(children_of(node))
    settings = FrameworkSettings()
    for call in calls:
        _read_call(call, imports.qualify(call.func), dicts, keyed, settings)
    local = {c.name.value: c for c in classes}
    factories = _Factories(imports, names, functions, calls, children_of)
    for cls in classes:
        for subclasses in _SUBCLASSES:
            if _subclasses(cls, subclasses.bases, imports, local, set(), factories):
                settings.classes.setdefault(subclasses.role, []).append(cls)
    return settings


def _read_call(
    call: cst.Call,
    names: set[str],
    dicts: dict[str, list[cst.Dict]],
    keyed: dict[tuple[str, str], list[cst.BaseExpression]],
    settings: FrameworkSettings,
) -> None:
    """What one call sets: the first declaration whose names it matches (the declarations' names never overlap)."""
    for key, setting in _ACCUMULATION:
        if names & setting.constructors:
            found = settings.accumulation.setdefault(key, AccumulationSettings())
            found.built = True
            arg = keyword_arg(call, setting.keyword)
            if arg is not None:
                found.counts.append(arg.value)
            else:
                found.without_count += 1
            if (
                (arg is not None and counts_more_than_one(arg.value))
                or any(keyword_arg(call, keyword) is not None for keyword in setting.may_accumulate_keywords)
                or any(a.star for a in call.args)
            ):
                found.may_accumulate = True
            return
    for wrap, constructors in _WRAP_CONSTRUCTORS:
        if names & constructors:
            if wrap.leaves_unwrapped is None or not wrap.leaves_unwrapped(literal_arguments(call)):
                settings.wraps.setdefault(wrap.key, []).append(call)
            return
    for key, prefix, suffix in _WRAP_FUNCTIONS:
        if any(n.startswith(prefix) and n.endswith(suffix) for n in names):
            settings.wraps.setdefault(key, []).append(call)
            return
    for key, setting in _CONFIGS:
        if names & setting.functions:
            found = settings.accumulation.setdefault(key, AccumulationSettings())
            for keyword in setting.keywords:
                arg = keyword_arg(call, keyword)
                if arg is not None:
                    found.counts.extend(_config_counts(arg.value, setting.key, dicts))
                    name = dotted_name(arg.value)
                    if name is not None:
                        found.counts.extend(keyed.get((name, setting.key), ()))
                        found.config_reads.append((name, setting.key))
            return


def _config_counts(value: cst.BaseExpression, key: str, dicts: dict[str, list[cst.Dict]]) -> list[cst.BaseExpression]:
    """The ``key`` of a config dict written inline or assigned to a name of the module."""
    name = dotted_name(value)
    candidates = [value] if type(value) is cst.Dict else dicts.get(name, []) if name else []
    found = []
    for config in candidates:
        for element in config.elements:
            if type(element) is cst.DictElement and type(element.key) is cst.SimpleString:
                if element.key.evaluated_value == key:
                    found.append(element.value)
    return found


def subscript_key(node: cst.BaseExpression) -> tuple[str, str] | None:
    """``config["key"]`` or ``config.get("key")``: the configuration's name and the key read, else None."""
    if type(node) is cst.Subscript and len(node.slice) == 1 and type(node.slice[0].slice) is cst.Index:
        key = node.slice[0].slice.value
        name = dotted_name(node.value)
    elif type(node) is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value == "get" and node.args:
        key = node.args[0].value
        name = dotted_name(node.func.value)
    else:
        return None
    if name is None or type(key) is not cst.SimpleString:
        return None
    value = key.evaluated_value
    return (name, value) if isinstance(value, str) else None


def _subclasses(
    cls: cst.ClassDef,
    bases: frozenset[str],
    imports: ImportMap,
    local: dict[str, cst.ClassDef],
    seen: set[str],
    factories: _Factories | None = None,
) -> bool:
    """Whether ``cls`` derives from one of ``bases``, directly, through classes of the same module, or through a
    base class a factory of the module makes (``_Factories``)."""
    if cls.name.value in seen:
        return False
    seen.add(cls.name.value)
    for arg in cls.bases:
        if imports.qualify(arg.value) & bases:
            return True
        name = dotted_name(arg.value)
        parent = local.get(name) if name else None
        if parent is not None and _subclasses(parent, bases, imports, local, seen, factories):
            return True
        if parent is None and factories is not None and factories.makes(cls, arg.value, bases):
            return True
    return False


class _Factories:
    """Base classes a module makes rather than imports: ``class X(base_cls)``.

    ``base_cls`` is assigned a class (``base_cls = SFTTrainer if sft else Trainer``),
    or what a function of the module returns (``base_cls = get_trainer_class(args)``
    with every ``return`` a class), or it is a parameter of the function that
    defines the class, and every call of that function in the module hands it a
    class (``def make_trainer(base_cls): class X(base_cls): ...`` and
    ``make_trainer(Trainer)``). Every way must give one of the bases: a factory
    that may return another class is not followed.
    """

    _DEPTH = 3

    def __init__(
        self,
        imports: ImportMap,
        names: dict[str, list[cst.BaseExpression]],
        functions: dict[str, list[cst.FunctionDef]],
        calls: list[cst.Call],
        children_of: ChildrenOf,
    ) -> None:
        self.imports, self.names, self.functions, self.calls, self.children_of = imports, names, functions, calls, children_of
        self._classes_in: dict[int, cst.FunctionDef] | None = None  # id of a class -> the function it is defined in

    def makes(self, cls: cst.ClassDef, base: cst.BaseExpression, bases: frozenset[str]) -> bool:
        """Whether the base expression of ``cls`` is always one of ``bases``."""
        if type(base) is not cst.Name:
            return False
        enclosing = self._enclosing(cls)
        if enclosing is not None and base.value in parameter_names(enclosing):
            return self._handed(enclosing, base.value, bases)
        return self._always(base, bases, 0)

    def _always(self, value: cst.BaseExpression, bases: frozenset[str], depth: int) -> bool:
        if depth > self._DEPTH:
            return False
        if self.imports.qualify(value) & bases:
            return True
        kind = type(value)
        if kind is cst.IfExp:
            return self._always(value.body, bases, depth + 1) and self._always(value.orelse, bases, depth + 1)
        if kind is cst.Name:
            values = self.names.get(value.value, [])
            return bool(values) and all(self._always(v, bases, depth + 1) for v in values)
        if kind is cst.Call and type(value.func) is cst.Name:
            defined = self.functions.get(value.func.value, [])
            returned = [r.value for f in defined for r in _returns(f, self.children_of)]
            return len(defined) == 1 and bool(returned) and all(
                r is not None and self._always(r, bases, depth + 1) for r in returned
            )
        return False

    def _handed(self, function: cst.FunctionDef, parameter: str, bases: frozenset[str]) -> bool:
        """Whether every call of ``function`` in the module hands ``parameter`` one of ``bases`` (and there is one)."""
        position = parameter_names(function).index(parameter)
        handed = []
        for call in self.calls:
            if type(call.func) is not cst.Name or call.func.value != function.name.value:
                continue
            given = keyword_arg(call, parameter)
            if given is None:
                positional = [a for a in call.args if a.keyword is None]
                if any(a.star for a in positional) or position >= len(positional):
                    return False
                given = positional[position]
            handed.append(given.value)
        return bool(handed) and all(self._always(v, bases, 1) for v in handed)

    def _enclosing(self, cls: cst.ClassDef) -> cst.FunctionDef | None:
        """The first function (in the order of ``functions``) whose body defines ``cls``. Each function body is walked
        once for all classes: walking them again for every class made a module's cost grow with its square."""
        if self._classes_in is None:
            self._classes_in = {}
            for defined in self.functions.values():
                for function in defined:
                    for node in walk(function.body, children_of=self.children_of):
                        if type(node) is cst.ClassDef:
                            self._classes_in.setdefault(id(node), function)
        return self._classes_in.get(id(cls))


def _returns(function: cst.FunctionDef, children_of: ChildrenOf) -> list[cst.Return]:
    """The ``return`` statements of a function's own body (not of nested functions)."""
    return [node for node in walk(function.body, children_of=children_of) if type(node) is cst.Return]
