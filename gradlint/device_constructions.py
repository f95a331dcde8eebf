"""Which devices a run's constructions of a class hand it, read from Python's tree of each constructing file.

``self.similarity_weight = nn.Parameter(torch.tensor([10.])).to(loss_device)`` in a module's ``__init__`` loses the
parameter only when ``.to`` copies it, that is when ``loss_device`` is not where the tensor already lies (the CPU).
Whether it is, the files that build the class tell: ``SpeakerEncoder(device, torch.device("cpu"))``, or
``loss_device = torch.device("cpu")``; ``SpeakerEncoder(device, loss_device)``.

:func:`device_arguments` notes ``Class:slot=cpu`` or ``Class:slot=other`` for every argument of each construction of a
class (a call whose callee's last name is capitalised) that hands at least one argument spelled as a device (a name or
attribute naming ``device`` or ``cuda``, ``torch.device(...)``, ``"cpu"``, ``"cuda"``); ``slot`` is the argument's
position or its keyword. An argument is ``cpu`` when it is ``"cpu"`` or ``torch.device("cpu")``, or a name the
function binds only to those (or, bound nowhere in the function, one the module binds only to those) and does not take
as a parameter.
"""

from __future__ import annotations

import ast
import re

from gradlint.python_nodes import FiledTree, last_name, own_nodes

_DEVICE_WORD = re.compile(r"device|cuda|\bcpu\b", re.IGNORECASE)
_CPU = "cpu"
_OTHER = "other"


def may_hand_devices(text: str) -> bool:
    """Whether ``text`` can hand a device to a construction (a cheap test before reading the tree)."""
    return "cpu" in text and ("device" in text or "cpu'" in text or 'cpu"' in text)


def device_arguments(tree: FiledTree) -> frozenset[str]:
    """``Class:slot=cpu`` / ``Class:slot=other`` for the arguments of the file's constructions that hand a device."""
    module = tree.tree
    module_bindings = _bindings(own_nodes(module))
    found: set[str] = set()
    for scope in [module, *tree.by_type().get(ast.FunctionDef, ()), *tree.by_type().get(ast.AsyncFunctionDef, ())]:
        own = list(own_nodes(scope))
        parameters = _parameters(scope)
        bindings = _bindings(own) if scope is not module else module_bindings
        for node in own:
            if type(node) is not ast.Call:
                continue
            name = last_name(node.func)
            if not name or not name[0].isupper() or not _hands_a_device(node):
                continue
            slots = [(str(at), arg) for at, arg in enumerate(node.args) if type(arg) is not ast.Starred]
            slots += [(keyword.arg, keyword.value) for keyword in node.keywords if keyword.arg]
            for slot, value in slots:
                kind = _CPU if _is_cpu(value, bindings, module_bindings, parameters) else _OTHER
                found.add(f"{name}:{slot}={kind}")
    return frozenset(found)


def cpu_only(facts: frozenset[str], class_name: str, slots: tuple[str, ...]) -> bool:
    """Whether the run's constructions of ``class_name`` hand the CPU at one of ``slots`` (a parameter's position and
    name) and never anything else there."""
    kinds = {fact.rsplit("=", 1)[1] for fact in facts for slot in slots if fact.rsplit("=", 1)[0] == f"{class_name}:{slot}"}
    return kinds == {_CPU}


def _hands_a_device(call: ast.Call) -> bool:
    values = [*call.args, *(keyword.value for keyword in call.keywords)]
    return any(_spelled_as_device(value) for value in values)


def _spelled_as_device(value: ast.AST) -> bool:
    if type(value) is ast.Constant and type(value.value) is str:
        return value.value.split(":")[0] in ("cpu", "cuda")
    if type(value) is ast.Call:
        return last_name(value.func) == "device"
    dotted = last_name(value)
    return bool(dotted) and bool(_DEVICE_WORD.search(dotted))


def _is_cpu(value: ast.AST, bindings: dict[str, list[ast.AST]], module_bindings: dict[str, list[ast.AST]], parameters: set[str]) -> bool:
    if _cpu_literal(value):
        return True
    if type(value) is not ast.Name or value.id in parameters:
        return False
    values = bindings.get(value.id) or module_bindings.get(value.id)
    return bool(values) and all(_cpu_literal(v) for v in values)


def _cpu_literal(value: ast.AST) -> bool:
    """``"cpu"`` or ``torch.device("cpu")``."""
    if type(value) is ast.Constant:
        return value.value == "cpu"
    if type(value) is ast.Call and last_name(value.func) == "device" and len(value.args) == 1 and not value.keywords:
        return _cpu_literal(value.args[0])
    return False


def _bindings(nodes: list[ast.AST]) -> dict[str, list[ast.AST]]:
    """Each plain name a scope assigns, with every value it assigns (a name bound otherwise gets an unknown value)."""
    found: dict[str, list[ast.AST]] = {}
    for node in nodes:
        if type(node) is ast.Assign:
            for target in node.targets:
                for sub in ast.walk(target):
                    if type(sub) is ast.Name:
                        found.setdefault(sub.id, []).append(node.value if type(target) is ast.Name else target)
        elif type(node) in (ast.AnnAssign, ast.AugAssign, ast.NamedExpr) and type(node.target) is ast.Name:
            found.setdefault(node.target.id, []).append(node.value if node.value is not None else node.target)
        elif type(node) in (ast.For, ast.AsyncFor, ast.comprehension, ast.withitem):
            target = node.optional_vars if type(node) is ast.withitem else node.target
            for sub in ast.walk(target) if target is not None else ():
                if type(sub) is ast.Name:
                    found.setdefault(sub.id, []).append(sub)
    return found


def _parameters(scope: ast.AST) -> set[str]:
    if type(scope) not in (ast.FunctionDef, ast.AsyncFunctionDef):
        return set()
    arguments = scope.args
    names = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
    return {a.arg for a in names if a is not None}
