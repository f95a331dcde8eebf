"""Gradient-release set-ups of a module: which optimizer steps inside backward, in which style, and where.

Gradient release (optimizer-in-backward, a fused backward and optimizer step)
updates each parameter from a ``register_post_accumulate_grad_hook`` as soon
as its gradient is complete and frees that gradient at once. Code sets it up
in several ways, all recognised here:

- a framework's calls, each named by the framework's style
  (:class:`gradlint.frameworks.framework.ReleaseCall`: torch-optimi's
  ``prepare_for_gradient_release`` and ``gradient_release=True``,
  torchtune's optimizer-in-backward helpers);
- ``hook``: PyTorch's own pattern, ``p.register_post_accumulate_grad_hook(hook)`` where ``hook`` steps;
- ``apply_in_backward``: ``torch.distributed.optim._apply_optimizer_in_backward``;
- ``flag``: code that branches on a configuration flag such as ``optimizer_in_bwd``.

Besides the set-ups, :func:`find_release` notes what the release rules weigh
against them: grad-scaler constructors, float16 autocasts, accumulation
settings, the optimizer attribute that switches a framework's accumulation
under release on (``optimizer_accumulation``), and the ``raise``
statements with which a recipe refuses a combination. Every spelling
recognised here contains one of :data:`RELEASE_TOKENS`, so a file without
any of them can be skipped unparsed.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

import libcst as cst

from gradlint import frameworks
from gradlint.objects import ObjKind, kind_from_name, last_name
from gradlint.syntax import (
    TRIVIA, bool_literal, callee_name, dotted_name, frees_gradients, keyword_arg, method_name, positional_args, receiver,
    root_name, walk,
)

# Substrings one of which every release set-up recognised here contains: torch's and the frameworks'.
RELEASE_TOKENS = ("post_accumulate_grad_hook", "in_backward", *frameworks.RELEASE_TOKENS)

# A name or configuration key that switches gradient release on (``self._optimizer_in_bwd``).
_FLAG = re.compile(r"in_bwd|in_backward|gradient_release")
# ``gradient_accumulation_steps``, ``grad_accum``, ``accum_iter``, ``accumulate_grad_batches``, ``accum``.
_ACCUMULATION_SETTING = re.compile(r"accum\w*(grad|step|batch|iter)|(grad|step|batch|iter)\w*accum|^(n_|num_)?accum(ulation|ulate)?$", re.IGNORECASE)
_SCALER_CALLEES = {"GradScaler", "ShardedGradScaler"}
# ``p.grad``, ``p.grad.data`` (not ``grad_fn``): code that handles gradients itself.
_GRAD_ATTRIBUTE = re.compile(r"\.grad\b")
_FP16_AUTOCAST = {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}
# What a ``raise`` guard's tests must mention to refuse release together with each feature.
_REFUSALS = {
    "accumulation": re.compile(r"accum", re.IGNORECASE),
    "clipping": re.compile(r"clip", re.IGNORECASE),
    "scaler": re.compile(r"scaler|fp16|float16|half|amp\b|mixed_precision", re.IGNORECASE),
}

_HOOK_CALL_DEPTH = 2  # how many calls deep a release hook is followed to the optimizer step it makes

# A branch test and which side of it a node is on: ("if" or "else").
Branch = tuple[cst.BaseExpression, str]


@dataclasses.dataclass(frozen=True)
class ReleaseSetup:
    """One gradient-release set-up: how it is written, where, and what it releases."""

    style: str  # "hook", "apply_in_backward", "flag", or a framework's style (``frameworks.RELEASE_STYLES``)
    node: cst.CSTNode  # the call (or branch test) that sets it up
    function: cst.FunctionDef | None  # where it is set up (None: module level)
    optimizer: str | None = None  # the optimizer (or per-parameter optimizer dict) stepped in backward
    model: str | None = None  # the model whose parameters carry the hooks
    hook: cst.FunctionDef | None = None  # "hook" style: the function that steps one parameter
    frees: bool = False  # "hook" style: the hook clears the gradient after stepping


@dataclasses.dataclass(frozen=True)
class Site:
    """A node the release rules weigh against the set-ups, with the function and branches around it."""

    node: cst.CSTNode
    function: cst.FunctionDef | None
    branches: tuple[Branch, ...] = ()


@dataclasses.dataclass
class ReleaseInfo:
    """What a module does about gradient release (empty when it does not use it)."""

    setups: list[ReleaseSetup] = dataclasses.field(default_factory=list)
    # Functions registered with register_post_accumulate_grad_hook: their code runs per parameter.
    hooks: frozenset[cst.FunctionDef] = frozenset()
    # Features the module refuses with a raise when release is on: "accumulation", "clipping", "scaler".
    refused: frozenset[str] = frozenset()
    # Optimizers switched to accumulating under release (``opt.optimizer_accumulation = ...``: ``frameworks.RELEASE_ACCUMULATES_INTO``).
    accumulating_optimizers: frozenset[str] = frozenset()
    accumulation_settings: list[Site] = dataclasses.field(default_factory=list)  # ``accum_steps = 4``
    scalers: list[Site] = dataclasses.field(default_factory=list)  # ``GradScaler()`` constructors
    fp16_autocasts: list[Site] = dataclasses.field(default_factory=list)  # ``autocast(dtype=torch.float16)``
    touches_grads: bool = False  # the module reads or writes ``.grad`` itself
    # Names whose truth guards a set-up (``if args.fused_backward_pass:``): the module's own release switches.
    flags: frozenset[str] = frozenset()
    # Function -> the functions, classes and module body whose code can run it (itself included).
    _callers: dict[Any, frozenset[Any]] = dataclasses.field(default_factory=dict)

    def together(self, a: cst.FunctionDef | None, b: cst.FunctionDef | None) -> bool:
        """Whether code in functions ``a`` and ``b`` can run in one program run.

        Module-level code runs with everything; two functions run together
        when one calls the other, they are methods of one class, or one
        function (or the module body) calls both.
        """
        if a is None or b is None:
            return True
        return bool(self._callers.get(a, frozenset({a})) & self._callers.get(b, frozenset({b})))

    def with_setup(self, function: cst.FunctionDef | None) -> list[ReleaseSetup]:
        """The set-ups that run together with code in ``function``, concrete set-ups before bare flags."""
        found = [s for s in self.setups if self.together(s.function, function)]
        return sorted(found, key=lambda s: s.style == "flag")


def release_polarity(test: cst.BaseExpression, flags: frozenset[str] = frozenset()) -> bool | None:
    """True when a branch test's body runs only with release on, False when only with it off, else None.

    ``flags`` are the module's own switches learnt from where its set-ups sit
    (``if args.fused_backward_pass: ...register_post_accumulate_grad_hook...``).
    """
    return _implies(test, flags)[0]


def _implies(test: cst.BaseExpression, flags: frozenset[str]) -> tuple[bool | None, bool | None]:
    """What a test tells about release when it holds and when it fails: True on, False off, None unknown.

    ``not (a or b)`` with ``a`` a release flag holds only with release off,
    though ``a or b`` holding says nothing: both sides are kept apart.
    """
    if type(test) is cst.UnaryOperation and type(test.operator) is cst.Not:
        when_true, when_false = _implies(test.expression, flags)
        return when_false, when_true
    if type(test) is cst.BooleanOperation:
        (left_true, left_false), (right_true, right_false) = _implies(test.left, flags), _implies(test.right, flags)
        if type(test.operator) is cst.And:  # holds: both hold; fails: either fails
            return _either(left_true, right_true), (left_false if left_false == right_false else None)
        return (left_true if left_true == right_true else None), _either(left_false, right_false)
    if type(test) is cst.Comparison and len(test.comparisons) == 1:
        comparison = test.comparisons[0]
        literal = bool_literal(comparison.comparator)
        when_true, when_false = _implies(test.left, flags)
        if literal is None:
            return None, None
        negated = type(comparison.operator) in (cst.IsNot, cst.NotEqual)
        return (when_true, when_false) if literal != negated else (when_false, when_true)
    if type(test) in (cst.Name, cst.Attribute):
        name = dotted_name(test)
        is_flag = bool(name) and (bool(_FLAG.search(last_name(name))) or name in flags)
        return (True, False) if is_flag else (None, None)
    if type(test) is cst.Call and callee_name(test) == "get":
        args = positional_args(test)
        return (True, False) if args and _flag_key(args[0].value) else (None, None)
    if type(test) is cst.Subscript and len(test.slice) == 1:
        index = test.slice[0].slice
        return (True, False) if type(index) is cst.Index and _flag_key(index.value) else (None, None)
    return None, None


def _either(a: bool | None, b: bool | None) -> bool | None:
    """What two facts that both hold tell: one known fact, or the same fact twice; None when they disagree."""
    if a is None:
        return b
    if b is None or a == b:
        return a
    return None


def runs_without_release(branches: Iterable[Branch], flags: frozenset[str] = frozenset()) -> bool:
    """Whether code under these branches runs only when release is switched off."""
    for test, side in branches:
        when_true, when_false = _implies(test, flags)
        if side == "if" and when_true is False:
            return True
        if side == "else" and (when_false is False or (when_false is None and when_true is True)):
            return True
    return False


def _returned_functions(factory: cst.FunctionDef) -> list[cst.FunctionDef]:
    """The functions defined in ``factory``'s body that it returns by name (``def hook(...): ...; return hook``)."""
    if type(factory.body) is not cst.IndentedBlock:
        return []
    nested = {s.name.value: s for s in factory.body.body if type(s) is cst.FunctionDef}
    returned = []
    for statement in factory.body.body:
        if type(statement) is cst.SimpleStatementLine:
            for small in statement.body:
                if type(small) is cst.Return and type(small.value) is cst.Name and small.value.value in nested:
                    returned.append(nested[small.value.value])
    return returned


def _flag_key(node: cst.BaseExpression) -> bool:
    return type(node) is cst.SimpleString and bool(_FLAG.search(node.evaluated_value or ""))


@dataclasses.dataclass(frozen=True)
class _Context:
    function: cst.FunctionDef | None
    class_name: str | None
    branches: tuple[Branch, ...]
    loops: tuple[cst.For, ...]


def find_release(index: Any, helpers: frozenset[str] = frozenset()) -> ReleaseInfo:
    """Find the release set-ups of a module and what the release rules weigh against them.

    ``index`` is the loop model's module index: it resolves qualified names
    and calls into the module's own functions. ``helpers`` are the functions
    of other files of the run that set gradient release up (the project
    index's ``releases:``): a call of one here is a set-up of style ``"helper"``.
    """
    code = index.text if index.text is not None else index.module.code
    touches_grads = bool(_GRAD_ATTRIBUTE.search(code))
    helpers = frozenset(name for name in helpers if name in code)
    if not helpers and not any(token in code for token in RELEASE_TOKENS):
        return ReleaseInfo(touches_grads=touches_grads)
    finder = _Finder(index, helpers)
    finder.run()
    return dataclasses.replace(finder.info(), touches_grads=touches_grads)


class _Finder:
    """One pass over the module, keeping the function, branches and loops around each node."""

    def __init__(self, index: Any, helpers: frozenset[str] = frozenset()) -> None:
        self.index = index
        self.helpers = helpers  # functions of other files of the run that set release up
        self._children = index.file.children  # the children the module index read
        self.setups: list[ReleaseSetup] = []
        self.hooks: set[cst.FunctionDef] = set()
        self.refused: set[str] = set()
        self.accumulating_optimizers: set[str] = set()
        self.accumulation_settings: list[Site] = []
        self.scalers: list[Site] = []
        self.fp16_autocasts: list[Site] = []
        self.calls: dict[cst.FunctionDef | None, set[cst.FunctionDef]] = {}
        self.method_class: dict[cst.FunctionDef, str] = {}
        self._flag_seen = False
        self.flags: set[str] = set()
        self._assigned_to: dict[cst.Call, str] = {}  # constructor call -> the name it is assigned to

    def run(self) -> None:
        stack: list[tuple[cst.CSTNode, _Context]] = [(self.index.module, _Context(None, None, (), ()))]
        while stack:
            node, ctx = stack.pop()
            children = self._visit(node, ctx)
            # Names, literals, whitespace and operators hold nothing this walk notes.
            stack.extend(child for child in reversed(children) if type(child[0]) not in TRIVIA)

    def info(self) -> ReleaseInfo:
        return ReleaseInfo(
            setups=self.setups,
            hooks=frozenset(self.hooks),
            refused=frozenset(self.refused),
            accumulating_optimizers=frozenset(self.accumulating_optimizers),
            accumulation_settings=self.accumulation_settings,
            scalers=self.scalers,
            fp16_autocasts=self.fp16_autocasts,
            flags=frozenset(self.flags),
            _callers=self._callers(),
        )

    # -- walking

    def _visit(self, node: cst.CSTNode, ctx: _Context) -> list[tuple[cst.CSTNode, _Context]]:
        """Note what ``node`` tells, and return its children with their contexts."""
        kind = type(node)  # LibCST's node classes are final: an exact type test is isinstance without its cost
        if kind is cst.FunctionDef:
            if ctx.class_name is not None:
                self.method_class[node] = ctx.class_name
            inner = _Context(node, None, (), ())
            return [(child, inner) for child in self._children(node)]
        if kind is cst.ClassDef:
            inner = dataclasses.replace(ctx, class_name=node.name.value)
            return [(child, inner) for child in self._children(node)]
        if kind is cst.If or kind is cst.IfExp:
            return self._branches(node, ctx)
        if kind is cst.For:
            inner = dataclasses.replace(ctx, loops=ctx.loops + (node,))
            return [(node.target, ctx), (node.iter, ctx), (node.body, inner)] + ([(node.orelse, ctx)] if node.orelse else [])
        if kind is cst.Call:
            self._call(node, ctx)
        elif kind is cst.Assign or kind is cst.AnnAssign:
            self._assign(node, ctx)
        elif kind is cst.Raise:
            self._refusal([t for t, _ in ctx.branches])
        elif kind is cst.Assert:
            self._refusal([t for t, _ in ctx.branches] + [node.test])
        elif kind is cst.DictElement and type(node.key) is cst.SimpleString:
            if _ACCUMULATION_SETTING.search(node.key.evaluated_value or "") and _more_than_one(node.value):
                self.accumulation_settings.append(Site(node, ctx.function, ctx.branches))
        return [(child, ctx) for child in self._children(node)]

    def _branches(self, node: cst.If | cst.IfExp, ctx: _Context) -> list[tuple[cst.CSTNode, _Context]]:
        test = node.test
        if not self._flag_seen and release_polarity(test) is not None:
            self._flag_seen = True
            self.setups.append(ReleaseSetup("flag", test, ctx.function))
        body = dataclasses.replace(ctx, branches=ctx.branches + ((test, "if"),))
        orelse = dataclasses.replace(ctx, branches=ctx.branches + ((test, "else"),))
        children: list[tuple[cst.CSTNode, _Context]] = [(test, ctx), (node.body, body)]
        if type(node) is cst.IfExp:
            children.append((node.orelse, orelse))
        elif type(node.orelse) is cst.If:
            children.append((node.orelse, orelse))
        elif node.orelse is not None:
            children.append((node.orelse.body, orelse))
        return children

    # -- calls

    def _call(self, call: cst.Call, ctx: _Context) -> None:
        helper = self.index.resolve_function(call, ctx.function)
        name = callee_name(call) or ""
        if helper is None and type(call.func) is cst.Name and name in self.index.class_methods:
            helper = self.index.method_of(name, "__init__")  # ``OptimizerInBackward(...)`` runs the class's ``__init__``
        if helper is not None:
            self.calls.setdefault(ctx.function, set()).add(helper)
        args = positional_args(call)
        release = frameworks.RELEASE_CALLS.get(name)
        if release is not None:
            self._setup(release.style, call, ctx, optimizer=self._named(release.optimizer, call), model=self._named(release.model, call))
        elif name == "_apply_optimizer_in_backward":
            self._setup("apply_in_backward", call, ctx, model=_parameters_owner(call))
        elif name == "register_post_accumulate_grad_hook" and args:
            self._hook(call, args[0].value, ctx)
        elif name in self.helpers and helper is None:  # ``setup_fused_optimizers(model, lr)`` of another module
            self._setup("helper", call, ctx, optimizer=self._assigned_to.get(call))
        elif self._builds_scaler(call, name, ctx) and _enabled(call):
            self.scalers.append(Site(call, ctx.function, ctx.branches))
        elif name == "autocast" and _enabled(call) and self._is_fp16_autocast(call):
            self.fp16_autocasts.append(Site(call, ctx.function, ctx.branches))
        for keyword, style in frameworks.RELEASE_KEYWORDS.items():  # ``AdamW(..., gradient_release=True)``
            switch = keyword_arg(call, keyword)
            if switch is not None and bool_literal(switch.value) is not False:
                self._setup(style, call, ctx, optimizer=self._assigned_to.get(call), model=_parameters_owner(call))
        for arg in call.args:
            if arg.keyword is not None and _ACCUMULATION_SETTING.search(arg.keyword.value) and _more_than_one(arg.value):
                self.accumulation_settings.append(Site(arg, ctx.function, ctx.branches))

    def _named(self, where: tuple[tuple[int, str], ...] | tuple[int, str] | str | None, call: cst.Call) -> str | None:
        """What a release call names where its framework says: arguments (the first found of several places),
        ``"assigned"`` (the name the call is assigned to) or ``"parameters"`` (the owner of the parameters handed)."""
        if where is None:
            return None
        if where == "assigned":
            return self._assigned_to.get(call)
        if where == "parameters":
            return _parameters_owner(call)
        places = (where,) if type(where[0]) is int else where
        for position, keyword in places:
            found = _argument(call, position, keyword)
            if found is not None:
                return found
        return None

    def _setup(self, style: str, call: cst.Call, ctx: _Context, **fields: Any) -> None:
        fields["model"] = _unless_parameter(fields.get("model"), ctx.function)
        self._learn_flags(ctx)
        self.setups.append(ReleaseSetup(style, call, ctx.function, **fields))

    def _learn_flags(self, ctx: _Context) -> None:
        """A name tested by an ``if`` whose body sets release up is a release switch of this module."""
        for test, side in ctx.branches:
            if side == "if" and type(test) in (cst.Name, cst.Attribute):
                self.flags.add(dotted_name(test))

    def _builds_scaler(self, call: cst.Call, name: str, ctx: _Context) -> bool:
        """``GradScaler(...)`` by name, or a call the loop model classified as building a scaler."""
        if name in _SCALER_CALLEES:
            return True
        assigned = self._assigned_to.get(call)
        known = self.index.objects.get(assigned) if assigned else None
        return known is not None and known.kind is ObjKind.SCALER and "caler" in name

    def _is_fp16_autocast(self, call: cst.Call) -> bool:
        """``autocast(dtype=torch.float16)``, or an autocast whose default on CUDA is float16."""
        args = positional_args(call)
        dtype = keyword_arg(call, "dtype")
        dtype_value = dtype.value if dtype is not None else (args[1].value if len(args) > 1 else None)
        if dtype_value is not None:
            return _is_float16(dtype_value)
        if self.index.qualified_names(call.func) & _FP16_AUTOCAST:
            return True
        device = keyword_arg(call, "device_type")
        device_value = device.value if device is not None else (args[0].value if args else None)
        return type(device_value) is cst.SimpleString and device_value.evaluated_value == "cuda"

    def _hook(self, call: cst.Call, hook: cst.BaseExpression, ctx: _Context) -> None:
        """``p.register_post_accumulate_grad_hook(hook)``: a release set-up when the hook steps an optimizer."""
        if type(hook) is cst.Call and callee_name(hook) == "partial" and positional_args(hook):
            hook = positional_args(hook)[0].value
        function = None
        if type(hook) in (cst.Name, cst.Attribute):
            function = self.index.resolve_function(cst.Call(func=hook), ctx.function)
        elif type(hook) is cst.Call:  # a hook factory: ``create_grad_hook(name, group)`` returns the hook
            factory = self.index.resolve_function(hook, ctx.function)
            made = _returned_functions(factory) if factory is not None else []
            self.hooks.update(made)
            function = made[0] if made else None
        body: cst.CSTNode | None = function if function is not None else (hook if type(hook) is cst.Lambda else None)
        if body is None:
            return
        if function is not None:
            self.hooks.add(function)  # registered as a hook: its code runs per parameter, whatever it steps
        optimizer = self._stepped_optimizer(body, function if function is not None else ctx.function)
        if optimizer is None:
            return
        model = _unless_parameter(_parameters_owner_of_loop(receiver(call), ctx.loops), ctx.function)
        self._learn_flags(ctx)
        self.setups.append(ReleaseSetup("hook", call, ctx.function, optimizer, model, function, frees_gradients(walk(body, into_lambdas=True))))

    def _stepped_optimizer(self, body: cst.CSTNode, scope: cst.FunctionDef | None, depth: int = 0) -> str | None:
        """The optimizer a hook body steps (``optimizer_dict[p].step()`` → ``optimizer_dict``), if any: in its own
        body, or in a function of the module it calls (``self._apply_update(param)``), up to two calls deep.
        ``scope`` is the function the body's names are resolved in (the hook itself, or the function around a lambda)."""
        for node in walk(body, into_lambdas=True):
            if type(node) is cst.Call and depth < _HOOK_CALL_DEPTH and method_name(node) != "step":
                callee = self.index.resolve_function(node, scope)
                if callee is not None and callee is not body:
                    found = self._stepped_optimizer(callee, callee, depth + 1)
                    if found is not None:
                        return found
            if type(node) is cst.Call and method_name(node) == "step":
                recv = receiver(node)
                name = dotted_name(recv) if type(recv) is not cst.Subscript else dotted_name(recv.value)
                name = name or root_name(recv)
                if name and (kind_from_name(name) is ObjKind.OPTIMIZER or "optim" in last_name(name).lower()):
                    return name
                known = self.index.objects.get(name) if name else None
                if known is not None and known.kind is ObjKind.OPTIMIZER:
                    return name
        return None

    # -- assignments and refusals

    def _assign(self, node: cst.Assign | cst.AnnAssign, ctx: _Context) -> None:
        targets = [t.target for t in node.targets] if type(node) is cst.Assign else [node.target]
        value = node.value
        if value is None:
            return
        for target in targets:
            if type(target) is cst.Attribute and target.attr.value == frameworks.RELEASE_ACCUMULATES_INTO:
                owner = dotted_name(target.value)
                if owner:
                    self.accumulating_optimizers.add(last_name(owner))
                continue
            name = dotted_name(target)
            if name and _ACCUMULATION_SETTING.search(last_name(name)) and _more_than_one(value):
                self.accumulation_settings.append(Site(node, ctx.function, ctx.branches))
            if name and type(value) is cst.Call:
                self._assigned_to[value] = name

    def _refusal(self, tests: list[cst.BaseExpression]) -> None:
        """A ``raise`` (or ``assert``) under tests that name the release flag refuses the features they name."""
        if not tests:
            return
        text = " ".join(self.index.module.code_for_node(t) for t in tests)
        if not _FLAG.search(text):
            return
        named = {feature for feature, words in _REFUSALS.items() if words.search(_FLAG.sub(" ", text))}
        # A raise under the release flag alone refuses release altogether.
        self.refused.update(named or _REFUSALS)

    # -- who runs with whom

    def _callers(self) -> dict[Any, frozenset[Any]]:
        """For each function: itself, its class, and every function (or the module body) that reaches it."""
        callers_of: dict[Any, set[Any]] = {}
        for caller, callees in self.calls.items():
            for callee in callees:
                callers_of.setdefault(callee, set()).add(caller if caller is not None else "<module>")
        for function in self.index.functions:
            parent = self.index.parent_function.get(function)
            if parent is not None:  # a nested function runs from its parent (a hook registered there)
                callers_of.setdefault(function, set()).add(parent)
        result: dict[Any, frozenset[Any]] = {}
        for function in self.index.functions:
            seen: set[Any] = {function}
            todo = [function]
            while todo:
                current = todo.pop()
                if current in self.method_class:
                    seen.add(("class", self.method_class[current]))
                for caller in callers_of.get(current, ()):
                    if caller not in seen:
                        seen.add(caller)
                        if caller != "<module>":
                            todo.append(caller)
            result[function] = frozenset(seen)
        return result


def _argument(call: cst.Call, position: int, keyword: str) -> str | None:
    """The dotted name passed as argument ``position`` or as ``keyword=``."""
    arg = keyword_arg(call, keyword)
    if arg is None:
        args = positional_args(call)
        arg = args[position] if position < len(args) else None
    return dotted_name(arg.value) if arg is not None else None


def _unless_parameter(model: str | None, function: cst.FunctionDef | None) -> str | None:
    """A model name, or None when it is a parameter of ``function``: callers may pass any model."""
    if model is None or function is None:
        return model
    head = model.split(".", 1)[0]
    params = function.params
    names = {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)}
    return None if head in names and head not in ("self", "cls") else model


def _parameters_owner(call: cst.Call) -> str | None:
    """``model`` for a call given ``model.parameters()`` (or ``named_parameters()``)."""
    for arg in call.args:
        for node in walk(arg):
            if type(node) is cst.Call and callee_name(node) in ("parameters", "named_parameters"):
                owner = dotted_name(receiver(node))
                if owner:
                    return owner
    return None


def _parameters_owner_of_loop(param: cst.BaseExpression | None, loops: tuple[cst.For, ...]) -> str | None:
    """``model`` for ``p`` bound by ``for p in model.parameters():``."""
    name = root_name(param)
    for loop in reversed(loops):
        bound = {n.value for n in walk(loop.target) if type(n) is cst.Name}
        if name in bound:
            for node in walk(loop.iter):
                if type(node) is cst.Call and callee_name(node) in ("parameters", "named_parameters"):
                    return dotted_name(receiver(node))
            return None
    return None


def _more_than_one(value: cst.BaseExpression) -> bool:
    """An integer literal greater than 1."""
    if type(value) is cst.Integer:
        try:
            return int(value.value.replace("_", ""), 0) > 1
        except ValueError:
            return False
    return False


def _is_float16(node: cst.BaseExpression) -> bool:
    """``torch.float16``, ``torch.half``, ``"float16"``, ``"fp16"``."""
    name = dotted_name(node)
    if name is not None:
        return last_name(name) in ("float16", "half")
    return type(node) is cst.SimpleString and node.evaluated_value in ("float16", "fp16", "half")


def _enabled(call: cst.Call) -> bool:
    """False when a scaler or autocast is built with ``enabled=`` anything but a literal True."""
    enabled = keyword_arg(call, "enabled")
    return enabled is None or bool_literal(enabled.value) is True
