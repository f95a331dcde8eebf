"""What one file tells the other files of its run about grad scalers and gradient release, read from Python's tree.

Five facts, each noted by :func:`scaler_release_facts` for the project index
(:mod:`gradlint.project_index`), which joins them per unit:

- ``hands_scaler``: the names this file calls with a grad scaler as an
  argument (``self.updater.step(loss, scaler=self.scaler)``). A function of
  that name that clips and then steps through the scaler it is handed gets
  its gradients scaled by its caller (GL103).
- ``releases``: the functions this file defines that set gradient release
  up (:func:`_sets_up_release`): a framework's release call, or
  ``p.register_post_accumulate_grad_hook(hook)`` with a hook that steps an
  optimizer, directly or through a function of the file; and the classes
  whose ``__init__`` does. A file that calls one of them releases gradients
  as if it made the set-up itself (GL201–GL203).
- ``scaled_dispatch``: ``callback:function`` for each callback a function
  of this file runs by name while the gradients are still scaled: after ``scaler.scale(loss).backward()`` and
  before any ``unscale_`` or ``scaler.step`` of the same function, through a
  hook dispatcher (``self.call_hook("after_backward")``) or a loop over the
  hooks (``for h in self._hooks: h.after_backward()``). A callback of that
  name that clips clips scaled gradients (GL103).
- ``clamp_hooks``: the functions this file defines that clip gradients by
  hooks: ``p.register_hook(hook)`` on each parameter of a model
  (``for p in model.parameters():``) with a hook that clamps or clips the
  gradient it is handed (``lambda grad: grad.clamp(-c, c)``). The hooks run
  inside the backward, before any ``unscale_`` can: under a grad scaler
  they clip scaled gradients (GL103).

- ``reads_grads``: the module-level functions this file defines that read
  the values of the gradients of a model they are handed
  (:func:`reads_handed_gradients`): ``def log_gradient_stats(model, ...)``
  looping over ``model.named_parameters()`` and reading ``p.grad``, or
  ``clip_grad_norm_(model.parameters(), float("inf"))`` for the norm alone.
  Called after a scaled backward and before ``unscale_``, they read scaled
  gradients (GL107).

Each fact is read only when the text can hold it (a cheap substring test),
so most files cost nothing more than the scan already did.
"""

from __future__ import annotations

import ast
import functools
import re

from gradlint.objects import ObjKind, kind_from_name
from gradlint.python_nodes import FiledTree, child_nodes, last_name, walk

# A callee whose name says it runs callbacks by name: ``call_hook("after_backward")``, ``trigger("on_backward")``.
_DISPATCHER = re.compile(r"hook|callback|event|trigger|notify|dispatch|fire", re.IGNORECASE)
# What a loop runs over when it calls each hook (``for hook in self._hooks:``).
_HOOKS = re.compile(r"hook|callback", re.IGNORECASE)
_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")
_SCALER = re.compile("caler", re.IGNORECASE)  # a scaler is known by a name containing "scaler" in any case
_DEPTH = 2  # how many calls deep a hook is followed to the step it makes
_CLAMPS = re.compile(r"clamp|clip", re.IGNORECASE)  # a call that bounds the gradient a hook is handed
_PARAMETERS = frozenset({"parameters", "named_parameters"})


@functools.cache
def _release_names() -> tuple[tuple[str, ...], frozenset[str], frozenset[str]]:
    """The substrings every release set-up spells, the frameworks' release calls and release keywords (read late:
    :mod:`gradlint.frameworks` loads LibCST)."""
    from gradlint import frameworks

    tokens = ("post_accumulate_grad_hook", "in_backward", *frameworks.RELEASE_TOKENS)
    calls = frozenset({*frameworks.RELEASE_CALLS, "_apply_optimizer_in_backward"})
    return tokens, calls, frozenset(frameworks.RELEASE_KEYWORDS)


def scaler_release_facts(text: str, tree: FiledTree) -> dict[str, frozenset[str]]:
    """The three facts of the module docstring, as :class:`gradlint.project_index.FileCalls` fields."""
    facts: dict[str, frozenset[str]] = {}
    if _SCALER.search(text):
        facts["hands_scaler"] = _hands_scaler(tree)
        if "backward" in text and ".scale(" in text:
            facts["scaled_dispatch"] = _scaled_dispatch(tree)
    tokens, _, _ = _release_names()
    if any(token in text for token in tokens):
        facts["releases"] = _release_helpers(tree)
    if "register_hook" in text and _CLAMPS.search(text):
        facts["clamp_hooks"] = _clamp_hook_functions(tree)
    if ".grad" in text or "clip_grad_norm" in text:
        facts["reads_grads"] = frozenset(
            f.name for f in tree.tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and reads_handed_gradients(f)
        )
    return facts




def _hands_scaler(tree: FiledTree) -> frozenset[str]:
    """The callees handed an argument named as a scaler (``step(loss, scaler)``, ``step(grad_scaler=self.scaler)``)."""
    found = set()
    for node in tree.by_type().get(ast.Call, ()):
        callee = last_name(node.func)
        if callee is None:
            continue
        values = [*node.args, *(k.value for k in node.keywords)]
        if any((name := last_name(v)) is not None and kind_from_name(name) is ObjKind.SCALER for v in values):
            found.add(callee)
    return frozenset(found)


# -- gradient release set up by a function


def _release_helpers(tree: FiledTree) -> frozenset[str]:
    """The functions of the file that set gradient release up (:func:`_sets_up_release`)."""
    module_functions = {s.name: s for s in tree.tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = set()
    for cls in [tree.tree, *tree.by_type().get(ast.ClassDef, ())]:
        methods = {s.name: s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))} if cls is not tree.tree else {}
        for function in [s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            if _sets_up_release(function, module_functions, methods):
                found.add(function.name)
                if function.name == "__init__":  # building the class sets release up: ``OptimizerInBackward(params, AdamW)``
                    found.add(cls.name)
    return frozenset(found)


def _sets_up_release(function: ast.AST, module_functions: dict, methods: dict) -> bool:
    """Whether ``function`` sets gradient release up on some path: a framework's release call or keyword
    (``register_optim_in_bwd_hooks``, ``AdamW(..., gradient_release=True)``), ``_apply_optimizer_in_backward``, or
    ``p.register_post_accumulate_grad_hook(hook)`` whose hook steps an optimizer."""
    _, release_calls, keywords = _release_names()
    nested = {n.name: n for n in walk(function) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is not function}
    for node in walk(function):
        if type(node) is not ast.Call:
            continue
        name = last_name(node.func)
        if name in release_calls:
            return True
        if any(k.arg in keywords and not (type(k.value) is ast.Constant and k.value.value is False) for k in node.keywords):
            return True
        if name == "register_post_accumulate_grad_hook" and node.args:
            scope = {**module_functions, **nested}
            if any(_steps(hook, scope, methods, 0) for hook in _hooks(node.args[0], scope, methods)):
                return True
    return False


def _hooks(hook: ast.AST, scope: dict, methods: dict) -> list[ast.AST]:
    """What a registered hook expression runs: a lambda, a function of the file or class (also through
    ``functools.partial``), or the functions a hook factory returns."""
    if type(hook) is ast.Call and last_name(hook.func) == "partial" and hook.args:
        hook = hook.args[0]
    if type(hook) is ast.Lambda:
        return [hook]
    target = _resolve(hook, scope, methods)
    if target is not None:
        return [target]
    if type(hook) is ast.Call:
        factory = _resolve(hook.func, scope, methods)
        if factory is not None:
            inner = {n.name: n for n in factory.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            return [inner[r.value.id] for r in walk(factory) if type(r) is ast.Return and type(r.value) is ast.Name and r.value.id in inner]
    return []


def _resolve(node: ast.AST, scope: dict, methods: dict) -> ast.AST | None:
    """The function a name (``hook``) or a method of ``self`` (``self._step_param``) refers to, if the file shows it."""
    if type(node) is ast.Name:
        return scope.get(node.id)
    if type(node) is ast.Attribute and type(node.value) is ast.Name and node.value.id in ("self", "cls"):
        return methods.get(node.attr)
    return None


def _steps(function: ast.AST, scope: dict, methods: dict, depth: int) -> bool:
    """Whether a hook steps an optimizer (``optim_dict[p].step()``), itself or through a function it calls."""
    for node in walk(function):
        if type(node) is not ast.Call:
            continue
        func = node.func
        if type(func) is ast.Attribute and func.attr == "step":
            owner = func.value.value if type(func.value) is ast.Subscript else func.value
            name = last_name(owner)
            if name is not None and (kind_from_name(name) is ObjKind.OPTIMIZER or "optim" in name.lower()):
                return True
        if depth < _DEPTH:
            callee = _resolve(func, scope, methods)
            if callee is not None and callee is not function and _steps(callee, scope, methods, depth + 1):
                return True
    return False


# -- callbacks run while the gradients are scaled


def _scaled_dispatch(tree: FiledTree) -> frozenset[str]:
    """The callbacks each function of the file runs between a scaled backward and the next ``unscale_`` or
    ``scaler.step`` (in source order), directly or through a method of its class that runs them."""
    found: set[str] = set()
    for cls in [tree.tree, *tree.by_type().get(ast.ClassDef, ())]:
        functions = [s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
        runs = {f.name: _dispatched(f, _calls_in_order(f)) for f in functions} if cls is not tree.tree else {}
        for function in functions:
            found |= {f"{name}:{function.name}" for name in _dispatched_while_scaled(function, runs)}
    return frozenset(found)


def _calls_in_order(function: ast.AST) -> list[tuple[ast.Call, frozenset[str]]]:
    """The calls of a function's own body (nested functions and classes left out) in source order, each with the
    names bound by the hook loops around it (``for hook in self._hooks:``)."""
    found: list[tuple[ast.Call, frozenset[str]]] = []
    stack: list[tuple[ast.AST, frozenset[str]]] = [(child, frozenset()) for child in child_nodes(function)]
    while stack:
        node, bound = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if type(node) is ast.Call:
            found.append((node, bound))
        if isinstance(node, (ast.For, ast.AsyncFor)) and type(node.target) is ast.Name and _names_hooks(node.iter):
            inner = bound | {node.target.id}
            stack.append((node.iter, bound))
            stack.extend((statement, inner) for statement in (*node.body, *node.orelse))
            continue
        stack.extend((child, bound) for child in child_nodes(node))
    found.sort(key=lambda item: (item[0].lineno, item[0].col_offset))
    return found


def _names_hooks(node: ast.AST) -> bool:
    return any(type(n) in (ast.Name, ast.Attribute) and _HOOKS.search(last_name(n) or "") for n in walk(node))


def _dispatch(call: ast.Call, bound: frozenset[str]) -> str | None:
    """The callback a call runs by name: ``call_hook("after_backward")``, or ``hook.after_backward(self)`` in a hook loop."""
    func = call.func
    if type(func) is ast.Attribute and type(func.value) is ast.Name and func.value.id in bound:
        return func.attr
    name = last_name(func)
    if name is not None and _DISPATCHER.search(name) and call.args:
        first = call.args[0]
        if type(first) is ast.Constant and type(first.value) is str and _IDENTIFIER.match(first.value):
            return first.value
    return None


def _dispatched(function: ast.AST, calls: list[tuple[ast.Call, frozenset[str]]]) -> frozenset[str]:
    """Every callback a function runs by name, wherever in its body."""
    return frozenset(name for call, bound in calls if (name := _dispatch(call, bound)) is not None)


def _dispatched_while_scaled(function: ast.AST, runs: dict[str, frozenset[str]]) -> set[str]:
    found: set[str] = set()
    scaled = False
    for call, bound in _calls_in_order(function):
        func = call.func
        if _is_scaled_backward(call):
            scaled = True
            continue
        if type(func) is ast.Attribute and (
            func.attr == "unscale_" or (func.attr == "step" and kind_from_name(last_name(func.value) or "") is ObjKind.SCALER)
        ):
            scaled = False
            continue
        if not scaled:
            continue
        name = _dispatch(call, bound)
        if name is not None:
            found.add(name)
        elif type(func) is ast.Attribute and type(func.value) is ast.Name and func.value.id == "self":
            found |= runs.get(func.attr, frozenset())  # ``self.after_backward()``, a method that runs the hooks
    return found


def _is_scaled_backward(call: ast.Call) -> bool:
    """``scaler.scale(loss).backward()``."""
    func = call.func
    if type(func) is not ast.Attribute or func.attr != "backward":
        return False
    inner = func.value
    return (
        type(inner) is ast.Call and type(inner.func) is ast.Attribute and inner.func.attr == "scale"
        and kind_from_name(last_name(inner.func.value) or "") is ObjKind.SCALER
    )


# -- gradients clipped by hooks during the backward


def _clamp_hook_functions(tree: FiledTree) -> frozenset[str]:
    """The functions of the file (module functions and methods) that register a clamping hook on every parameter of
    a model (:func:`registers_clamping_hooks`)."""
    functions = [*tree.by_type().get(ast.FunctionDef, ()), *tree.by_type().get(ast.AsyncFunctionDef, ())]
    return frozenset(f.name for f in functions if registers_clamping_hooks(f))


def registers_clamping_hooks(function: ast.AST) -> bool:
    """Whether ``function`` runs ``p.register_hook(hook)`` for each parameter ``p`` of a model (``for p in
    model.parameters():``, ``for name, p in model.named_parameters():``) with a hook (a lambda or a nested function)
    that bounds the gradient it is handed (a ``clamp``/``clip`` call on it) and reads no loss scale."""
    nested = {n.name: n for n in walk(function) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is not function}
    for loop in walk(function):
        if not isinstance(loop, (ast.For, ast.AsyncFor)) or not _over_parameters(loop.iter):
            continue
        bound = {n.id for n in walk(loop.target) if type(n) is ast.Name}
        for node in walk(loop):
            if (
                type(node) is ast.Call and last_name(node.func) == "register_hook" and node.args
                and type(node.func) is ast.Attribute and last_name(node.func.value) in bound
            ):
                hook = node.args[0]
                body = hook if type(hook) is ast.Lambda else nested.get(hook.id) if type(hook) is ast.Name else None
                if body is not None and _bounds_its_argument(body):
                    return True
    return False


def _over_parameters(node: ast.AST) -> bool:
    """``model.parameters()``, ``self.model.named_parameters()``."""
    return type(node) is ast.Call and last_name(node.func) in _PARAMETERS


def _bounds_its_argument(hook: ast.AST) -> bool:
    """Whether a hook calls a clamp or clip on its first argument (``grad.clamp(...)``, ``torch.clamp(grad, ...)``,
    ``clamp_tensor(grad, ...)``) and reads no loss scale (a threshold scaled by ``scaler.get_scale()`` is meant)."""
    args = hook.args.args if hasattr(hook, "args") else []
    if not args:
        return False
    grad = args[0].arg
    if any(type(n) in (ast.Name, ast.Attribute) and "scale" in (last_name(n) or "").lower() for n in walk(hook)):
        return False
    for node in walk(hook):
        if type(node) is not ast.Call or not _CLAMPS.search(last_name(node.func) or ""):
            continue
        operands = [node.func.value] if type(node.func) is ast.Attribute else []
        operands += list(node.args)
        if any(type(o) is ast.Name and o.id == grad for o in operands):
            return True
    return False


# -- gradients read by a function handed the model

# Calls after which a function is no reader: it backpropagates, steps, clears, unscales or reduces across ranks.
_GRADIENT_WORK = frozenset({"backward", "step", "zero_grad", "unscale_", "update", "all_reduce", "all_gather", "reduce"})
_NORM_CLIPS = frozenset({"clip_grad_norm_", "clip_grad_norm"})
_SCALE_FREE = frozenset({"isfinite", "isnan", "isinf", "hasattr"})  # what the loss scale does not change


def reads_handed_gradients(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether a function reads the values of the gradients of a model it is handed, and does no gradient work.

    It loops over ``m.parameters()`` / ``m.named_parameters()`` of one of its parameters ``m`` (or over a parameter
    itself, handed the parameters) and reads
    ``p.grad`` of the loop's variable other than to test it against None or for finiteness, or it takes
    ``clip_grad_norm_(m.parameters(), float("inf"))`` (a norm, nothing clipped). It writes no gradient and
    calls no backward, step, clear, ``unscale_`` or collective.
    """
    arguments = function.args
    handed = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)} - {"self", "cls"}
    nodes = walk(function)
    unvalued: set[int] = set()  # ``.grad`` nodes read only for None-ness or finiteness
    for node in nodes:
        if type(node) is ast.Call:
            name = last_name(node.func)
            if name in _GRADIENT_WORK or (name or "").endswith("_") and _touches_grad(node.func) and name not in _NORM_CLIPS:
                return False
            if name in _SCALE_FREE:
                unvalued.update(id(n) for arg in node.args for n in walk(arg) if type(n) is ast.Attribute and n.attr == "grad")
        elif type(node) in (ast.Assign, ast.AugAssign):
            targets = node.targets if type(node) is ast.Assign else [node.target]
            if any(type(n) is ast.Attribute and n.attr == "grad" for t in targets for n in walk(t)):
                return False
        elif type(node) is ast.Compare and any(type(c) is ast.Constant and c.value is None for c in node.comparators):
            unvalued.update(id(n) for n in walk(node.left) if type(n) is ast.Attribute and n.attr == "grad")
    for node in nodes:
        if type(node) is ast.Call and last_name(node.func) in _NORM_CLIPS and node.args and _parameters_of(node.args[0], handed):
            limit = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "max_norm"), None)
            if limit is not None and _infinite(limit):
                return True
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and _parameters_of(node.iter, handed):
            bound = {n.id for n in walk(node.target) if type(n) is ast.Name}
            scope = node if isinstance(node, (ast.For, ast.AsyncFor)) else function
            if any(
                type(n) is ast.Attribute and n.attr == "grad" and type(n.value) is ast.Name and n.value.id in bound
                and id(n) not in unvalued
                for n in walk(scope)
            ):
                return True
    return False


def _parameters_of(node: ast.AST, handed: set[str]) -> bool:
    """``m.parameters()`` / ``m.named_parameters()`` of a handed ``m`` (``model.module.parameters()`` too), or a
    handed iterable itself (``for p in parameters``: the caller hands ``model.parameters()``)."""
    if type(node) is ast.Name:
        return node.id in handed
    if not _over_parameters(node):
        return False
    root = node.func.value if type(node.func) is ast.Attribute else None
    while type(root) is ast.Attribute:
        root = root.value
    return type(root) is ast.Name and root.id in handed


def _touches_grad(func: ast.AST) -> bool:
    """Whether an in-place method is called on a gradient (``p.grad.mul_``, ``p.grad.data.zero_``)."""
    return type(func) is ast.Attribute and any(type(n) is ast.Attribute and n.attr == "grad" for n in walk(func.value))


def _infinite(node: ast.AST) -> bool:
    """``float("inf")``, ``math.inf``, ``torch.inf``, ``np.inf``."""
    if type(node) is ast.Call and last_name(node.func) == "float" and node.args:
        arg = node.args[0]
        return type(arg) is ast.Constant and str(arg.value).lower().lstrip("+") in ("inf", "infinity")
    return last_name(node) == "inf"
