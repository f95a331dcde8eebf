"""The module index: one pass over a module noting its functions, classes, imports, assignments and tracked objects.

The event builder and the release set-up finder ask it which function a call
lands in, what a name was assigned, and what kind of object a name holds.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator

import libcst as cst

from gradlint import frameworks
from gradlint.imports import ImportMap
from gradlint.parsed_file import ParsedFile
from gradlint.objects import ObjInfo, ObjKind, kind_of_constructor, last_name
from gradlint.syntax import (
    TRIVIA,
    ChildrenOf,
    bool_literal,
    callee_name,
    children,
    dotted_name,
    frees_gradients,
    is_grad,
    tracked_name,
    number,
    positional_args,
    receiver,
    scales_down,
    writes_grad_in_place,
    walk,
)


# The node types ``ModuleIndex._note`` looks at; the scan skips the call for all others.
_NOTED = frozenset(
    {cst.Import, cst.ImportFrom, cst.Assign, cst.AnnAssign, cst.AugAssign, cst.WithItem, cst.Return, cst.Attribute, cst.Name, cst.Arg, cst.Call, cst.ListComp, cst.GeneratorExp, cst.For}
)


class ModuleIndex:
    """One pass over the module: functions, classes, assignments and tracked objects."""

    def __init__(self, parsed: ParsedFile) -> None:
        self.file = parsed  # the file indexed: the walk fills in its tables of children and parents
        self.module = module = parsed.module
        self.text = text = parsed.text  # the source, when the caller has it
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
        # ``nets.append(Mlp(...))``: what each function puts into a named list, by the list's name
        self.appended: dict[cst.FunctionDef | None, dict[str, list[cst.BaseExpression]]] = {}
        self._anywhere: dict[str, list[cst.BaseExpression]] | None = None  # assigned_anywhere's table, once built
        self._only_from: dict[str, set[str]] | None = None  # names_assigned_only_from's table, once built
        self._outside_loops: frozenset[str] | None = None  # called_outside_loops, once built
        self.divided_names: dict[cst.FunctionDef | None, set[str]] = {}
        # Per function (None: module level): the augmented assignments of its own code, not of nested defs or class bodies.
        self.augmented: dict[cst.FunctionDef | None, list[cst.AugAssign]] = {}
        self.returns_divided: set[cst.FunctionDef] = set()
        # ``return loss, ce_loss, z_loss`` with ``loss`` divided: (function, position) of each divided element.
        self.returns_divided_at: set[tuple[cst.FunctionDef, int]] = set()
        self._returned: dict[cst.FunctionDef, list[cst.BaseExpression]] = {}
        self.objects: dict[str, ObjInfo] = {}
        self.uses_cuda_graphs = False
        # Every name of a CUDA graph API holds "graph": in a text without it, no name needs looking at.
        self._graph_names_possible = text is None or "graph" in text.lower()
        # Each node's parent (names and literals are children, never parents): how a reported node finds its statement.
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        # What the fixes ask of the whole module, noted here so that no fix walks it again.
        self.divides_by_assignment = False  # a line of its own normalises a value: ``x = x / n`` or ``x /= n``
        self.constructions: dict[str, list[cst.Call]] = {}  # last name assigned -> ``name = Call(...)`` values
        self.variable_names: set[str] = set()  # every bare name used (not an attribute or a keyword)
        # ``.grad`` used as a buffer that must exist: pre-allocated (``p.grad = torch.zeros_like(p)``), added or
        # copied into (``p.grad += g``, ``p.grad.copy_(g)``), or read for every parameter with no None check
        # (``flatten([p.grad for p in params])``). Zeroing in place is then what keeps the code working.
        self.grads_used_as_buffers = False
        self._scan(module)
        self._find_divided_returns()
        self._classify_objects()

    # -- names

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """The qualified names a name or attribute node stands for, through the module's imports."""
        return self.imports.qualify(node)

    def resolve_function(
        self, call: cst.Call, function: cst.FunctionDef | None, self_class: str | None = None
    ) -> cst.FunctionDef | None:
        """The function of this module a call lands in: a nested def, a module function or ``self.method``; with
        ``self_class``, ``self.method`` as an instance of that class dispatches it (a base class's method calling
        what a subclass overrides)."""
        func = call.func
        if type(func) is cst.Name:
            scope = function
            while True:
                found = self.nested.get(scope, {}).get(func.value)
                if found is not None:
                    return found
                if scope is None:
                    return None
                scope = self.parent_function.get(scope)
        if type(func) is cst.Attribute and type(func.value) is cst.Name and func.value.value in ("self", "cls"):
            method = self.method_holding(function)
            owner = self.class_of.get(method) if method is not None else None
            if self_class is not None and owner is not None and (self_class == owner or self.inherits(self_class, owner)):
                owner = self_class
            return self._method(owner, func.attr.value, set()) if owner else None
        return None

    def method_holding(self, function: cst.FunctionDef | None) -> cst.FunctionDef | None:
        """The method of a class that holds ``function``: itself, or the method a nested function is defined in."""
        while function is not None and self.class_of.get(function) is None:
            function = self.parent_function.get(function)
        return function

    def inherits(self, class_name: str, ancestor: str) -> bool:
        """Whether a class of this module derives from ``ancestor``, directly or through classes of the module."""
        return self.derives_from(class_name, lambda base: base == ancestor)

    def derives_from(self, class_name: str, test: Callable[[str], bool]) -> bool:
        """Whether a class of this module has a base (by last name), directly or through classes of the module, for
        which ``test`` holds (``lambda base: base.endswith("Module")``)."""
        seen: set[str] = set()
        pending = [class_name]
        while pending:
            current = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            bases = self.class_bases.get(current, [])
            if any(test(base) for base in bases):
                return True
            pending.extend(bases)
        return False

    def method_of(self, class_name: str, name: str) -> cst.FunctionDef | None:
        """A method of one of this module's classes, found on the class or its bases of this module."""
        return self._method(class_name, name, set())

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
        parents = self.file.parents = self.parents
        known: dict[int, list[cst.CSTNode]] = {}
        self.file.note_children(known)
        while stack:
            node, function, class_name, prefix = stack.pop()
            kids = known[id(node)] = children(node)
            for child in kids:
                parents[child] = node
                if type(child) is cst.Name:
                    if not (type(node) is cst.Attribute and child is node.attr) and not (type(node) is cst.Arg and child is node.keyword):
                        self.variable_names.add(child.value)
                    if self._graph_names_possible and not self.uses_cuda_graphs:
                        self._note(child, function)
                    continue
                kind = type(child)
                if kind is cst.FunctionDef:
                    self._add_function(child, function, class_name, prefix)
                    stack.append((child, child, None, f"{prefix}{child.name.value}."))
                elif kind is cst.ClassDef:
                    name = child.name.value
                    self.class_bases[name] = [last_name(b) for b in (dotted_name(a.value) for a in child.bases) if b]
                    self.class_methods.setdefault(name, {})
                    stack.append((child, function, name, f"{prefix}{name}."))
                else:
                    if kind in _NOTED:
                        self._note(child, function)
                        if kind is cst.AugAssign and class_name is None:
                            self.augmented.setdefault(function, []).append(child)
                    if kind not in TRIVIA:
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
        kind = type(node)  # LibCST's node classes are final: an exact type test is isinstance without its cost
        if kind is cst.Import or kind is cst.ImportFrom:
            self.imports.add(node)
        elif kind is cst.Assign:
            for target in node.targets:
                self._assign(target.target, node.value, function)
                if is_grad(target.target) and _allocates(node.value):
                    self.grads_used_as_buffers = True
            if len(node.targets) == 1:
                self._note_single_assignment(node)
        elif kind is cst.AnnAssign and node.value is not None:
            self._assign(node.target, node.value, function)
        elif kind is cst.AugAssign:
            if type(node.operator) is cst.AddAssign and is_grad(node.target):
                self.grads_used_as_buffers = True
            if type(node.operator) is cst.DivideAssign:
                self.divides_by_assignment = True
            name = tracked_name(node.target)
            if name and type(node.operator) in (cst.DivideAssign, cst.MultiplyAssign):
                if type(node.operator) is cst.DivideAssign or scales_down(node.value) or _is_fraction(node.value):
                    self.divided_names.setdefault(function, set()).add(name)
        elif kind is cst.ListComp or kind is cst.GeneratorExp:
            if _reads_every_grad(node):
                self.grads_used_as_buffers = True
        elif kind is cst.For:
            if _loop_reads_every_grad(node):
                self.grads_used_as_buffers = True
        elif kind is cst.Call:
            # ``loss.mul_(mb_size / batch_size)`` / ``loss.div_(n)``: the loss normalised in place
            func = node.func
            if writes_grad_in_place(node):
                self.grads_used_as_buffers = True
            if type(func) is cst.Attribute and func.attr.value in ("mul_", "div_") and type(func.value) is cst.Name and node.args:
                if func.attr.value == "div_" or scales_down(node.args[0].value) or _is_fraction(node.args[0].value):
                    self.divided_names.setdefault(function, set()).add(func.value.value)
            if type(func) is cst.Attribute and func.attr.value == "append" and len(node.args) == 1 and node.args[0].keyword is None:
                collection = dotted_name(func.value)
                if collection is not None:
                    self.appended.setdefault(function, {}).setdefault(collection, []).append(node.args[0].value)
        elif kind is cst.WithItem and node.asname is not None:
            self._assign(node.asname.name, node.item, function)
        elif kind is cst.Return and node.value is not None and function is not None:
            self._returned.setdefault(function, []).append(node.value)
        elif (kind is cst.Attribute or kind is cst.Name) and self._graph_names_possible and not self.uses_cuda_graphs:
            name = dotted_name(node) or ""
            if name.endswith(("CUDAGraph", "cuda.graph", "make_graphed_callables")) or "cudagraph" in name.lower() or "cuda_graph" in name.lower():
                self.uses_cuda_graphs = True
        elif kind is cst.Arg and node.keyword is not None and node.keyword.value == "capturable":
            if bool_literal(node.value) is True:
                self.uses_cuda_graphs = True

    def _note_single_assignment(self, node: cst.Assign) -> None:
        """``opt = AdamW(...)`` (a construction the GL204 fix may rewrite) and ``x = x / n`` (how the module normalises)."""
        target, value = dotted_name(node.targets[0].target), node.value
        if target is None:
            return
        if type(value) is cst.Call:
            self.constructions.setdefault(last_name(target), []).append(value)
        elif type(value) is cst.BinaryOperation and type(value.operator) is cst.Divide and dotted_name(value.left) == target:
            self.divides_by_assignment = True

    def _find_divided_returns(self) -> None:
        """Helpers that return a divided loss: ``return loss / n``, or ``loss = loss / n`` then ``return loss``.

        Run after the whole scan: a function's assignments are not all seen before its returns.
        """
        for function in self.assignments:
            self._add_sums_of_divided(function)
        for function, values in self._returned.items():
            divided = self.divided_names.get(function, set())
            if any(_made_of_divided(v, divided, self.file.children) for v in values):
                self.returns_divided.add(function)
            for value in values:
                if type(value) is cst.Tuple:
                    for position, element in enumerate(value.elements):
                        if _made_of_divided(element.value, divided, self.file.children):
                            self.returns_divided_at.add((function, position))

    def _add_sums_of_divided(self, function: cst.FunctionDef | None) -> None:
        """Count as divided every name of the function all of whose values are sums of divided ones.

        ``ce_loss = ce_loss / tokens`` then ``loss = ce_loss + z_loss`` (``z_loss`` divided too) or
        ``loss = ce_loss``: ``loss`` is divided as well.
        """
        divided = self.divided_names.get(function)
        if not divided:
            return
        table = self.assignments[function]
        for _ in range(2):  # a second round sees names built from names the first added
            for name, values in table.items():
                if name not in divided and all(_made_of_divided(v, divided, self.file.children) for v in values):
                    divided.add(name)

    def returned(self, function: cst.FunctionDef) -> list[cst.BaseExpression]:
        """The values a function's own ``return`` statements hand back."""
        return self._returned.get(function, [])

    def assigned_anywhere(self, name: str | None) -> list[cst.BaseExpression]:
        """Every value the module assigns to ``name``, in any function, in the order of ``assignments`` (its functions,
        then each one's values). One table for all names: a rule asking this for each call no longer walks every
        function's table each time (which made a large module's cost grow with its square)."""
        if self._anywhere is None:
            self._anywhere = {}
            for table in self.assignments.values():
                for each, values in table.items():
                    self._anywhere.setdefault(each, []).extend(values)
        return self._anywhere.get(name, []) if name is not None else []

    def appended_anywhere(self, name: str | None) -> list[cst.BaseExpression]:
        """Every value the module appends to the list ``name`` (``name.append(value)``), in any function."""
        return [value for table in self.appended.values() for value in table.get(name or "", [])]

    def names_assigned_only_from(self, source: str) -> set[str]:
        """The attributes some function assigns only the bare name ``source`` (``self.batch_index = b_idx``).

        One table for all sources, built once: a rule asking this per loop no
        longer walks every function's assignments each time.
        """
        if self._only_from is None:
            self._only_from = {}
            for table in self.assignments.values():
                for name, values in table.items():
                    first = values[0] if values else None
                    if "." in name and type(first) is cst.Name and all(type(v) is cst.Name and v.value == first.value for v in values):
                        self._only_from.setdefault(first.value, set()).add(name)
        return self._only_from.get(source, set())

    def called_outside_loops(self) -> frozenset[str]:
        """The callee names of the module's calls that run outside every ``for`` and ``while``, found in one walk."""
        if self._outside_loops is None:
            found: set[str] = set()
            for node in self.file.every_node(self.module):
                if type(node) is cst.Call and (name := callee_name(node)) is not None:
                    above = self.parents.get(node)
                    while above is not None and type(above) not in (cst.For, cst.While):
                        above = self.parents.get(above)
                    if above is None:
                        found.add(name)
            self._outside_loops = frozenset(found)
        return self._outside_loops

    def _assign(self, target: cst.BaseExpression, value: cst.BaseExpression, function: cst.FunctionDef | None) -> None:
        self._anywhere = None
        self._only_from = None
        table = self.assignments.setdefault(function, {})
        if type(target) in (cst.Tuple, cst.List) and type(value) in (cst.Tuple, cst.List) and len(target.elements) == len(value.elements):
            for t, v in zip(target.elements, value.elements):
                self._assign(t.value, v.value, function)
            return
        if type(target) in (cst.Tuple, cst.List):
            for position, element in enumerate(target.elements):
                name = dotted_name(element.value)
                if name:
                    table.setdefault(name, []).append(Unpacked(value, position))
            return
        name = dotted_name(target)
        if name:
            table.setdefault(name, []).append(value)
            if scales_down(value):
                self.divided_names.setdefault(function, set()).add(name)
        elif scales_down(value) and (entry := tracked_name(target)) is not None:
            self.divided_names.setdefault(function, set()).add(entry)  # ``out["loss"] = out["loss"] / n``

    # -- objects

    def _classify_objects(self) -> None:
        """Give each assigned name a kind from what was assigned to it."""
        pending: list[tuple[str, cst.BaseExpression, cst.FunctionDef | None]] = []
        for function, table in self.assignments.items():
            for name, values in table.items():
                for value in values:
                    pending.append((name, value, function))
        # Two passes: the second sees aliases (``opt = self.optimizer``) of names the first classified.
        for _ in range(2):
            for name, value, function in pending:
                info = self._classify_value(value)
                if info is not None and info.kind is ObjKind.OPTIMIZER and not info.param_sources and type(value) is cst.Call:
                    info = ObjInfo(info.kind, param_sources=self._sources_through_locals(value, function))
                if info is None and type(value) is cst.Call:
                    info = self._classify_built_by_helper(value, function)
                if info is not None and (name not in self.objects or self.objects[name].kind is ObjKind.UNKNOWN):
                    self.objects[name] = info
        self._classify_filled_lists()

    def _sources_through_locals(self, call: cst.Call, function: cst.FunctionDef | None) -> frozenset[str]:
        """The models an optimizer is built over through a local its function binds once (``params =
        list(self.Encoder.parameters()) + list(self.Decoder.parameters())``, then ``Adam(params)``)."""
        table = self.assignments.get(function, {})
        sources: set[str] = set()
        for arg in call.args:
            values = table.get(arg.value.value, []) if type(arg.value) is cst.Name else []
            if len(values) == 1 and isinstance(values[0], cst.BaseExpression):
                sources |= _models_whose_parameters(values[0], self.file.walk)
        return frozenset(sources)

    def _classify_filled_lists(self) -> None:
        """``self.q_optimizers = []`` then ``self.q_optimizers.append(Adam(net.parameters()))`` in a loop: a list the
        module fills only with optimizers (or schedulers, or scalers) holds that kind, as a list written out does."""
        filled: dict[str, list[cst.BaseExpression]] = {}
        for table in self.appended.values():
            for name, values in table.items():
                filled.setdefault(name, []).extend(values)
        for name, values in filled.items():
            if name in self.objects and self.objects[name].kind is not ObjKind.UNKNOWN:
                continue
            infos = [self._classify_value(value) for value in values]
            kinds = {info.kind if info is not None else None for info in infos}
            if len(kinds) == 1 and (kind := kinds.pop()) in (ObjKind.OPTIMIZER, ObjKind.SCHEDULER, ObjKind.SCALER):
                self.objects[name] = ObjInfo(kind)

    def _classify_built_by_helper(self, call: cst.Call, function: cst.FunctionDef | None) -> ObjInfo | None:
        """``self._accelerator = self._create_accelerator()``: a function of this module whose every return builds one kind.

        Only constructors count (``return Accelerator(...)``), so what a
        helper returns is known from the helper alone.
        """
        helper = self.resolve_function(call, function)
        returned = self._returned.get(helper) if helper is not None else None
        if not returned:
            return None
        kinds = set()
        for value in returned:
            if type(value) is not cst.Call or not any(kind_of_constructor(q) is not None for q in self.qualified_names(value.func)):
                return None
            info = self._classify_value(value)
            if info is None:
                return None
            kinds.add(info.kind)
        return ObjInfo(kinds.pop()) if len(kinds) == 1 else None

    def _classify_value(self, value: cst.BaseExpression) -> ObjInfo | None:
        if isinstance(value, Unpacked):
            return self._classify_unpacked(value)
        if type(value) in (cst.Name, cst.Attribute):
            alias = dotted_name(value)
            return self.objects.get(alias) if alias else None
        element = _element(value)
        if element is not None:  # ``{p: AdamW([p]) for p in params}``, ``[opt_g, opt_d]``: a container holds its elements' kind
            info = self._classify_value(element)
            return ObjInfo(info.kind) if info is not None and info.kind in (ObjKind.OPTIMIZER, ObjKind.SCHEDULER, ObjKind.SCALER) else None
        if type(value) is not cst.Call:
            return None
        for qualified in sorted(self.qualified_names(value.func)):  # star imports may offer several: one answer each run
            kind = kind_of_constructor(qualified)
            if kind is ObjKind.OPTIMIZER:
                return ObjInfo(kind, param_sources=_parameter_sources(value, self.file.walk))
            if kind is ObjKind.PARALLEL_MODEL:
                args = positional_args(value)
                wrap = frameworks.wrap_of_constructor(qualified)
                return ObjInfo(kind, wraps=dotted_name(args[0].value) if args else None, wrapped_by=wrap.key if wrap else None)
            if kind is not None:
                return ObjInfo(kind)
        name = callee_name(value) or ""
        if self._steps_without_gradients(name) and (
            type(value.func) is cst.Name or dotted_name(value.func) == f"self.{name}"  # a class nested in ``self``'s
        ):
            return ObjInfo(ObjKind.OTHER)  # ``ema_optimizer = WeightEMA(...)``: named like an optimizer, steps no gradient
        if name in frameworks.RETURNS_GIVEN_ALONE and len(positional_args(value)) == 1:  # ``model = accelerator.prepare(model)``
            return self._classify_value(positional_args(value)[0].value)
        if re.search(r"optimi[sz]er", name, re.IGNORECASE) and not name.endswith("_step"):
            if re.search(r"(Sched(uler)?|_sched(uler)?)$", name):
                return ObjInfo(ObjKind.SCHEDULER)  # ``OptimizerScheduler(...)``: the last word says what it is
            return ObjInfo(ObjKind.OPTIMIZER)
        if re.search(r"GradScaler|NativeScaler", name):
            return ObjInfo(ObjKind.SCALER)
        return None

    def _steps_without_gradients(self, class_name: str) -> bool:
        """Whether a class of this module has a ``step`` that neither reads a gradient nor steps or clears anything (a
        weight average, ``ema_param.mul_(a).add_(param * (1 - a))``), and derives from no class named for an optimizer."""
        step = self.class_methods.get(class_name, {}).get("step")
        if step is None or any("ptimi" in base for base in self.class_bases.get(class_name, [])):
            return False
        for node in self.file.walk(step.body):
            if type(node) is cst.Attribute and node.attr.value == "grad":
                return False
            if type(node) is cst.Call and callee_name(node) in ("step", "zero_grad", "backward"):
                return False
        return True

    def step_clears(self, class_name: str) -> bool:
        """Whether a class of this module clears gradients in its own ``step()``: a ``p.grad = None`` store or a
        ``zero_grad()`` call there (an optimizer written for the project that frees what it applied)."""
        step = self.class_methods.get(class_name, {}).get("step")
        return step is not None and frees_gradients(self.file.walk(step.body))

    def _classify_unpacked(self, value: "Unpacked") -> ObjInfo | None:
        """``model, opt = accelerator.prepare(model, opt)``: element ``i`` is what argument ``i`` was; or, for a call
        a framework declares so (``engine, opt, _, sched = deepspeed.initialize(...)``), the kind it returns there."""
        call = value.value
        if type(call) is not cst.Call:
            return None
        name = callee_name(call)
        # by what the import says the callee is: ``amp.initialize`` of apex is no ``deepspeed.initialize``
        qualified = self.qualified_names(call.func) or {dotted_name(call.func)}
        returned = next((frameworks.RETURNS_BY_POSITION[q] for q in sorted(qualified) if q in frameworks.RETURNS_BY_POSITION), None)
        if returned is not None:
            kind = returned.get(value.position)
            return ObjInfo(kind) if kind is not None else None
        if name in frameworks.RETURNS_GIVEN:
            args = positional_args(call)
            if value.position < len(args):
                return self._classify_value(args[value.position].value)
        return None


def _made_of_divided(value, divided: set[str], children_of: ChildrenOf | None = None) -> bool:
    """``loss / n``, a divided name, or a sum or difference of such terms."""
    if not isinstance(value, cst.BaseExpression):
        return False
    if scales_down(value, children_of) or dotted_name(value) in divided:
        return True
    if type(value) is cst.BinaryOperation and type(value.operator) in (cst.Add, cst.Subtract):
        return _made_of_divided(value.left, divided, children_of) and _made_of_divided(value.right, divided, children_of)
    return False


@dataclasses.dataclass(frozen=True)
class Unpacked:
    """Element ``position`` of a value unpacked into a tuple (``model, opt = accelerator.prepare(...)``)."""

    value: cst.BaseExpression
    position: int


def _element(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """What a container literal or comprehension holds: its (first) element, or a dict's (first) value."""
    if type(value) is cst.DictComp:
        return value.value
    if type(value) in (cst.ListComp, cst.SetComp, cst.GeneratorExp):
        return value.elt
    if type(value) is cst.Dict:
        first = next((e for e in value.elements if type(e) is cst.DictElement), None)
        return first.value if first is not None else None
    if type(value) in (cst.List, cst.Tuple) and value.elements:
        return value.elements[0].value
    return None


def _allocates(value: cst.BaseExpression) -> bool:
    """``torch.zeros_like(p)``, ``torch.empty_like(p)``, ``torch.zeros(shape)``: a fresh buffer, not built from a gradient."""
    if type(value) is not cst.Call or callee_name(value) not in ("zeros_like", "empty_like", "zeros", "empty"):
        return False
    return not any(is_grad(n) for arg in value.args for n in walk(arg.value) if type(n) is cst.Attribute)


def _reads_every_grad(node: cst.ListComp | cst.GeneratorExp) -> bool:
    """``[p.grad.data for p in params]`` with no ``if``: a None gradient would break it."""
    loop = node.for_in
    if loop.ifs or loop.inner_for_in is not None:
        return False
    bound = {n.value for n in walk(loop.target) if type(n) is cst.Name}
    for sub in walk(node.elt):
        if type(sub) is cst.Attribute and sub.attr.value == "grad" and type(sub.value) is cst.Name and sub.value.value in bound:
            return not any(type(n) in (cst.IfExp, cst.Comparison) for n in walk(node.elt))
    return False


# What a loop that clears the gradients calls on them: no use of their values.
_CLEARING_METHODS = frozenset({"zero_", "detach_", "requires_grad_", "fill_", "mul_"})


def _loop_reads_every_grad(loop: cst.For) -> bool:
    """``for name, p in model.named_parameters(): H = (p.grad / n).reshape(p.grad.nelement(), 1)`` with no test of the
    gradient in the body: computing with a None gradient would raise, so the code counts on every buffer."""
    if type(loop.iter) is not cst.Call or callee_name(loop.iter) not in ("parameters", "named_parameters"):
        return False
    bound = {n.value for n in walk(loop.target) if type(n) is cst.Name}
    computed = False
    for sub in walk(loop.body):
        if type(sub) in (cst.Assign, cst.AugAssign) and _updates_parameter(sub, bound):
            return False  # ``p -= lr * p.grad``: an update on the gradients, which a None gradient would skip or break alike
        kind = type(sub)
        if kind is cst.Try:
            return False  # a handler may catch what a missing gradient raises
        if kind in (cst.If, cst.IfExp, cst.Assert) and any(_grad_of(n, bound) for n in walk(sub.test)):
            return False  # ``if p.grad is not None:``: the missing gradients are skipped
        if kind is cst.BinaryOperation and any(_grad_of(side, bound) for side in (sub.left, sub.right)):
            computed = True
        elif kind is cst.Call and type(sub.func) is cst.Attribute and _grad_of(sub.func.value, bound) and (
            sub.func.attr.value not in _CLEARING_METHODS
        ):
            computed = True
    return computed


def _updates_parameter(statement: cst.Assign | cst.AugAssign, bound: set[str]) -> bool:
    """``p -= lr * p.grad`` or ``p.data = p.data - lr * p.grad``: the loop's parameter updated from its gradient."""
    targets = [t.target for t in statement.targets] if type(statement) is cst.Assign else [statement.target]
    for target in targets:
        if type(target) is cst.Attribute and target.attr.value == "data":
            target = target.value
        if type(target) is cst.Name and target.value in bound:
            return True
    return False


def _grad_of(node: cst.BaseExpression, bound: set[str]) -> bool:
    """``p.grad`` (or ``p.grad.data``) of a name in ``bound``."""
    if not is_grad(node):
        return False
    grad = node.value if node.attr.value == "data" else node
    return type(grad.value) is cst.Name and grad.value.value in bound


def _is_fraction(node: cst.BaseExpression) -> bool:
    value = number(node)
    return value is not None and value < 1


def _parameter_sources(call: cst.Call, walk: Callable[[cst.CSTNode], Iterator[cst.CSTNode]] = walk) -> frozenset[str]:
    """The models whose ``.parameters()`` an optimizer constructor was given."""
    return frozenset().union(*(_models_whose_parameters(arg, walk) for arg in call.args))


def _models_whose_parameters(node: cst.CSTNode, walk: Callable[[cst.CSTNode], Iterator[cst.CSTNode]] = walk) -> set[str]:
    """The models whose ``.parameters()`` (or ``.named_parameters()``) an expression reads, by their last names."""
    sources = set()
    for sub in walk(node):
        if type(sub) is cst.Call and callee_name(sub) in ("parameters", "named_parameters"):
            owner = dotted_name(receiver(sub))
            if owner:
                sources.add(last_name(owner))
    return sources
