"""The value a run's settings ship with, read from where they are declared.

Many training scripts accumulate gradients only when a setting is raised:
``parser.add_argument("--gradient_accumulation_steps", type=int, default=1)``,
a dataclass field ``accum_steps: int = 1``, a configuration dict
``{"grad_accum": 1}``. A finding that needs more than one micro-batch per step
is real for whoever raises the setting, and nobody who runs the script with
its declared defaults sees it. The message says so (:func:`latent_note`), so
that a reader does not take a true finding for a false alarm.

:func:`declared_defaults` reads one file's declarations from Python's tree (the
project index keeps them, so that a script reading ``args.accum_steps`` learns
the default declared in ``options.py``); the linter matches them with the
expression of the loop (``gradlint.linter._latent_note``). Read by the project
index at start-up, so this module imports no LibCST.
"""

from __future__ import annotations

import ast

from gradlint.python_nodes import FiledTree

# The value a count ships with when accumulation is off. Only that one is kept: it is all a message needs, and it
# keeps what the project index hands each file small.
OFF = 1
# A name declared with another default somewhere: a run may ship either, so nothing is said.
CONFLICT = "*"


def may_declare(text: str) -> bool:
    """Whether ``text`` can declare a setting's default (a cheap test before reading the tree)."""
    return "add_argument" in text or ": int" in text or "field(" in text or "= 1" in text or ": 1" in text


def declared_defaults(tree: FiledTree) -> frozenset[str]:
    """``name=1`` for each setting the file declares with the default 1, ``name=*`` for each it declares with another
    literal default (another definition of the name then makes the run's default unknown)."""
    found: dict[str, str] = {}

    def note(name: str | None, value: ast.AST | None) -> None:
        if name is None or value is None or type(value) is not ast.Constant or type(value.value) is not int:
            return
        seen = "1" if value.value == OFF else CONFLICT
        found[name] = seen if found.get(name, seen) == seen else CONFLICT

    by_type = tree.by_type()
    for call in by_type.get(ast.Call, ()):
        if type(call.func) is ast.Attribute and call.func.attr == "add_argument":
            note(_argument_dest(call), _keyword(call, "default"))
    for cls in by_type.get(ast.ClassDef, ()):
        for statement in cls.body:
            if type(statement) is ast.AnnAssign and type(statement.target) is ast.Name:
                note(statement.target.id, _field_default(statement.value))
            elif type(statement) is ast.Assign and len(statement.targets) == 1 and type(statement.targets[0]) is ast.Name:
                note(statement.targets[0].id, statement.value)
    for mapping in by_type.get(ast.Dict, ()):
        for key, value in zip(mapping.keys, mapping.values):
            if type(key) is ast.Constant and type(key.value) is str and key.value.isidentifier():
                note(key.value, value)
    return frozenset(f"{name}={value}" for name, value in found.items())


def count_names(tree: FiledTree) -> frozenset[str]:
    """The last names of what the file reads as a count: the right side of ``%`` and ``/``, what ``range`` is handed,
    what a comparison holds (``step % args.accum == 0``, ``loss / cfg["accum"]``, ``range(accum_steps)``)."""
    found = set()
    by_type = tree.by_type()
    read: list[ast.AST] = [n.right for n in by_type.get(ast.BinOp, ()) if type(n.op) in (ast.Mod, ast.Div)]
    read += [a for n in by_type.get(ast.Call, ()) if type(n.func) is ast.Name and n.func.id == "range" for a in n.args]
    read += [c for n in by_type.get(ast.Compare, ()) for c in (n.left, *n.comparators)]
    read += [n.value for n in by_type.get(ast.AugAssign, ()) if type(n.op) is ast.Div]
    for node in read:
        found.add(_last_name(node))
    # ``accum = args.accum_steps`` / ``self.accum = cfg.accum_steps``: the setting a count is bound to is read too
    for assign in by_type.get(ast.Assign, ()):
        if len(assign.targets) == 1 and _last_name(assign.targets[0]) in found:
            found.add(_last_name(assign.value))
    found.discard(None)
    return frozenset(found)


def _last_name(node: ast.AST) -> str | None:
    """``accum`` for ``accum``, ``args.accum`` and ``cfg["accum"]``; None for any other expression."""
    if type(node) is ast.Name:
        return node.id
    if type(node) is ast.Attribute:
        return node.attr
    if type(node) is ast.Subscript and type(node.slice) is ast.Constant and type(node.slice.value) is str:
        return node.slice.value
    return None


def _argument_dest(call: ast.Call) -> str | None:
    """The attribute an ``add_argument`` call fills: its ``dest``, else its first long option, else its short one."""
    dest = _keyword(call, "dest")
    if dest is not None:
        return dest.value if type(dest) is ast.Constant and type(dest.value) is str else None
    options = [a.value for a in call.args if type(a) is ast.Constant and type(a.value) is str]
    chosen = next((o for o in options if o.startswith("--")), options[0] if options else None)
    if chosen is None:
        return None
    name = chosen.lstrip("-").replace("-", "_")
    return name if name.isidentifier() else None


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _field_default(value: ast.AST | None) -> ast.AST | None:
    """``1`` for ``= 1`` and for ``= field(default=1)``."""
    if type(value) is ast.Call and _keyword(value, "default") is not None:
        return _keyword(value, "default")
    return value


def merged(own: frozenset[str], others: frozenset[str]) -> frozenset[str]:
    """The names shipping at 1: declared so in the file itself, or, where the file declares nothing of the name, by
    every declaration of the run's other files."""
    table: dict[str, str] = {}
    for fact in others:
        name, value = fact.split("=", 1)
        table[name] = value if table.get(name, value) == value else CONFLICT
    for fact in own:
        name, value = fact.split("=", 1)
        table[name] = value
    return frozenset(name for name, value in table.items() if value == "1")


def latent_note(spelled: str) -> str:
    """What a message adds when its finding needs a count above 1 that is declared with the default 1. It says what the
    code declares, not what a run uses: a configuration file or a launch script may set the count (a YAML file
    setting ``grad_accum_steps: 4`` for a field declared ``= 1`` makes the finding real on the shipped run)."""
    return f" (this needs `{spelled}` above 1: it is declared with the default 1)"
