"""What a micro-batch counter holds when an accumulation guard reads it, on the loop's first iteration.

Three kinds of counter are read: the loop's own index (``for i, b in
enumerate(loader, start)``, ``for i in range(start, n)``), a counter kept
by hand (``step = 0`` before the loop, ``step += 1`` once in every
iteration), and, in a method run once per batch (a callback's
``on_batch_end``), a counter on ``self`` that ``__init__`` sets and the
method increments (set back at most inside the guard, to where it started). A counter whose value at the guard cannot be told from the code
(a start that is no literal, a second increment, a ``continue`` between the
guard and the increment, an assignment after the loop) is no counter here:
the caller stays quiet.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from gradlint.model import Frame, LoopModel
from gradlint.queries import counter_and_offset, function_holding
from gradlint.syntax import boolean_terms, callee_name, class_methods, dotted_name, keyword_arg, number, positional_args, walk


@dataclasses.dataclass(frozen=True)
class CounterStart:
    """The counter's value at the guard on the first iteration, and where it was set and incremented by hand."""

    start: int
    set_at: cst.CSTNode | None = None  # the literal assignment of a counter kept by hand
    incremented_at: cst.CSTNode | None = None  # its increment in the loop body
    after_guard: bool = False  # the increment follows the guard
    # ``enumerate(loader, start=start_step + 1)`` in ``def train_epoch(..., start_step=0)``: the parameter whose
    # literal default (a fresh run's value) the start was read with
    from_default: str | None = None
    # a counter on ``self`` set back to its start inside the guard: every window counts as the first does
    reset_at: cst.CSTNode | None = None


def counter_start(
    model: LoopModel, loop: Frame, guard: cst.CSTNode, name: str, via: tuple[cst.Call, ...] = ()
) -> CounterStart | None:
    """The value ``name`` holds where ``guard`` (in ``loop``'s body, or in a helper the body calls: ``via``, the calls
    the guard was inlined through) reads it on the first iteration, or None."""
    defaults = _literal_defaults(function_holding(model, loop.node))
    index = loop_index(loop.node, defaults)
    if index is not None and index[0] == name:
        if assigned_in(loop.node.body, name):
            return None
        given = _start_given(loop.node)
        default = counter_and_offset(given.value)[0] if given is not None and number(given.value) is None else None
        return CounterStart(index[1], from_default=default)
    return _hand_counter(model, loop.node, guard, name, via)


def _literal_defaults(function: cst.FunctionDef | None) -> dict[str, int]:
    """The parameters of ``function`` whose default is an integer literal (``start_step=0``): what a fresh run passes."""
    if function is None:
        return {}
    found = {}
    for param in (*function.params.params, *function.params.kwonly_params):
        value = number(param.default) if param.default is not None else None
        if value is not None and value == int(value):
            found[param.name.value] = int(value)
    return found


def _start_given(node: cst.CSTNode) -> cst.Arg | None:
    """The start argument of ``enumerate(xs, start)`` / ``range(start, n)`` in a loop's header, if given."""
    if type(node) is not cst.For or type(node.iter) is not cst.Call:
        return None
    args = positional_args(node.iter)
    if callee_name(node.iter) == "enumerate":
        return keyword_arg(node.iter, "start") or (args[1] if len(args) > 1 else None)
    return args[0] if callee_name(node.iter) == "range" and len(args) == 2 else None


@dataclasses.dataclass(frozen=True)
class RemainderTest:
    """A guard ``(counter + offset) % count == 0``."""

    counter: str
    offset: int
    count: cst.BaseExpression


def remainder_test(test: cst.BaseExpression) -> RemainderTest | None:
    """``(i + c) % k == 0`` or ``not (i + c) % k`` on a plain counter (the whole test, or ``and``-ed only with tests
    that an object is there, ``self.optimizer is not None and ...``: the same on every micro-batch), else None."""
    if type(test) is cst.BooleanOperation and type(test.operator) is cst.And:
        terms = boolean_terms(test, cst.And)
        found = [t for t in terms if not _presence_test(t)]
        return remainder_test(found[0]) if len(found) == 1 and len(terms) > 1 else None
    if type(test) is cst.UnaryOperation and type(test.operator) is cst.Not:
        remainder = test.expression
    elif type(test) is not cst.Comparison or len(test.comparisons) != 1:
        return None
    elif type(test.comparisons[0].operator) is not cst.Equal or number(test.comparisons[0].comparator) != 0:
        return None
    else:
        remainder = test.left
    if type(remainder) is not cst.BinaryOperation or type(remainder.operator) is not cst.Modulo:
        return None
    counter, offset = counter_and_offset(remainder.left)
    return RemainderTest(counter, offset, remainder.right) if counter is not None else None


def remainder_or_pass_end_test(test: cst.BaseExpression) -> RemainderTest | None:
    """The remainder test of a guard that also steps at the pass's end: ``i % k == 0 or i >= n_batches - 1`` (every
    other term of the ``or`` compares the same counter, ``==``, ``>=`` or ``>``, with a bound that is not a number, or is
    a framework's end-of-epoch flag). Such a term only adds steps late in a pass: the windows are the remainder's."""
    if type(test) is not cst.BooleanOperation or type(test.operator) is not cst.Or:
        return None
    terms = boolean_terms(test, cst.Or)
    tests = [found for t in terms if (found := remainder_test(t)) is not None]
    if len(tests) != 1:
        return None
    others = [t for t in terms if remainder_test(t) is None]
    return tests[0] if others and all(_pass_end_term(t, tests[0].counter) for t in others) else None


def _pass_end_term(term: cst.BaseExpression, counter: str) -> bool:
    """``i >= n - 1``, ``i == len(loader) - 1``, ``i + 1 == total`` on ``counter``, or an end-of-epoch flag."""
    from gradlint import frameworks  # the registry imports the model, which this module's importers need first

    if type(term) is cst.Attribute and term.attr.value in frameworks.EPOCH_END_FLAGS:
        return True
    if type(term) is not cst.Comparison or len(term.comparisons) != 1:
        return False
    operator, bound = type(term.comparisons[0].operator), term.comparisons[0].comparator
    if operator not in (cst.Equal, cst.GreaterThanEqual, cst.GreaterThan):
        return False
    name, _ = counter_and_offset(term.left)
    return name == counter and number(bound) is None and not any(
        type(n) is cst.Name and n.value == counter for n in walk(bound)
    )


def _presence_test(term: cst.BaseExpression) -> bool:
    """``x is not None`` / ``x is None`` on a name or attribute."""
    return (
        type(term) is cst.Comparison and len(term.comparisons) == 1
        and type(term.comparisons[0].operator) in (cst.Is, cst.IsNot)
        and type(term.comparisons[0].comparator) is cst.Name and term.comparisons[0].comparator.value == "None"
        and type(term.left) in (cst.Name, cst.Attribute)
    )


def flag_remainder_test(model: LoopModel, test: cst.BaseExpression, function: cst.FunctionDef | None) -> RemainderTest | None:
    """The remainder test a flag stands for: ``should_step = i % accumulation_steps == 0`` bound once in the function,
    then ``if should_step:``."""
    if type(test) is not cst.Name or model.index is None or function is None:
        return None
    values = model.index.assignments.get(function, {}).get(test.value, [])
    return remainder_test(values[0]) if len(values) == 1 and isinstance(values[0], cst.BaseExpression) else None


def window_offset(start: int, test: RemainderTest) -> int:
    """How many micro-batches each window of ``test`` ends early (> 0) or late (< 0) when its counter reads ``start``
    on the first iteration; 0 when aligned (for a count that is no literal, only ``start + offset == 1`` is aligned
    whatever the count)."""
    off = start + test.offset - 1
    literal = number(test.count)
    if literal is not None and literal == int(literal) and literal > 0 and off % int(literal) == 0:
        return 0
    return off


def loop_index(node: cst.CSTNode, defaults: dict[str, int] | None = None) -> tuple[str, int] | None:
    """``for i, b in enumerate(xs[, start])`` or ``for i in range([start, ]n)`` with a literal start: (``i``, start).
    A start ``p + c`` of a parameter in ``defaults`` (its literal default) reads as the default plus ``c``."""
    if type(node) is not cst.For or type(node.iter) is not cst.Call:
        return None
    name, args = callee_name(node.iter), positional_args(node.iter)
    if name == "enumerate" and type(node.target) is cst.Tuple and node.target.elements and args:
        index = dotted_name(node.target.elements[0].value)
    elif name == "range" and type(node.target) is cst.Name and 1 <= len(args) == len(node.iter.args) <= 2:
        index = node.target.value
    else:
        return None
    given = _start_given(node)
    if index is None or "." in index:
        return None
    if given is None:
        return index, 0
    start = number(given.value)
    if start is None and defaults:
        name, offset = counter_and_offset(given.value)
        if name in defaults:
            return index, defaults[name] + offset
    return (index, int(start)) if start is not None and start == int(start) else None


def assigned_in(node: cst.CSTNode, name: str) -> bool:
    """Whether ``node`` binds ``name`` (``i += 1``, ``i = ...``)."""
    return any(_binds(n, name) for n in walk(node))


def _binds(node: cst.CSTNode, name: str) -> bool:
    targets: list[cst.BaseExpression] = []
    if type(node) is cst.Assign:
        targets = [t.target for t in node.targets]
    elif type(node) in (cst.AugAssign, cst.AnnAssign):
        targets = [node.target]
    elif type(node) in (cst.For, cst.CompFor):
        targets = [node.target]
    elif type(node) is cst.NamedExpr:
        targets = [node.target]
    elif type(node) in (cst.Global, cst.Nonlocal):
        return any(n.name.value == name for n in node.names)
    if "." in name:  # an attribute kept as a counter (``self.step``)
        return any(type(t) is cst.Attribute and dotted_name(t) == name for target in targets for t in walk(target))
    found = [t for target in targets for t in walk(target) if type(t) is cst.Name and t.value == name]
    return bool(found)


def _increments(statement: cst.CSTNode, name: str) -> bool:
    """``name += 1`` as a statement of its own."""
    if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1:
        return False
    small = statement.body[0]
    return (type(small) is cst.AugAssign and type(small.operator) is cst.AddAssign
            and type(small.target) in (cst.Name, cst.Attribute) and dotted_name(small.target) == name
            and number(small.value) == 1)


def _holds(statement: cst.CSTNode, node: cst.CSTNode) -> bool:
    return any(n is node for n in walk(statement))


def _continues(statements: list[cst.CSTNode]) -> bool:
    """A ``continue`` of this loop among the statements (not one of a loop nested in them)."""
    pending = list(statements)
    while pending:
        node = pending.pop()
        if type(node) is cst.Continue:
            return True
        if type(node) in (cst.For, cst.While):
            pending.extend(node.orelse.body.body if node.orelse is not None else [])
            continue
        pending.extend(node.children)
    return False


def _hand_counter(
    model: LoopModel, loop: cst.CSTNode, guard: cst.CSTNode, name: str, via: tuple[cst.Call, ...] = ()
) -> CounterStart | None:
    """A counter set to a literal before the loop and incremented once, unconditionally, in every iteration. A
    counter kept on ``self`` (``self.step``) counts only when no method but ``__init__`` sets it otherwise: a helper
    the loop calls could."""
    parents = model.parents
    if type(loop) is cst.FunctionDef:
        return _per_batch_self_counter(model, loop, guard, name, via)
    if parents is None or type(loop) not in (cst.For, cst.While) or type(loop.body) is not cst.IndentedBlock:
        return None
    if "." in name and not (name.startswith("self.") and name.count(".") == 1 and _kept_on_self(model, loop, name)):
        return None
    body = list(loop.body.body)
    increments = [i for i, s in enumerate(body) if _increments(s, name)]
    at_guard = [i for i, s in enumerate(body) if _holds(s, guard)]
    if not at_guard and via:  # the guard is in a helper: where the loop calls it
        at_guard = [i for i, s in enumerate(body) if _holds(s, via[0])]
    if len(increments) != 1 or len(at_guard) != 1 or increments[0] == at_guard[0]:
        return None
    increment, at = increments[0], at_guard[0]
    if sum(_binds(n, name) for n in walk(loop)) != 1:  # the increment alone
        return None
    if _continues(body[min(increment, at) + 1:max(increment, at)]):
        return None  # on some iterations the guard reads the counter without its increment, or the other way round
    scope = function_holding(model, loop) or model.module
    set_at = _literal_set_before(model, loop, scope, name)
    if set_at is None:
        return None
    start = int(number(set_at.value))
    return CounterStart(start if increment > at else start + 1, set_at, body[increment], increment > at)


def _per_batch_self_counter(
    model: LoopModel, function: cst.FunctionDef, guard: cst.CSTNode, name: str, via: tuple[cst.Call, ...] = ()
) -> CounterStart | None:
    """A counter on ``self`` of a method read as one iteration (a callback's ``on_batch_end``, run once per batch):
    set to a literal by ``__init__`` alone, incremented once in the method's own body before the guard, and
    otherwise only set back to that literal inside the guard, where the window ends. Each window then counts as the
    first: the counter reads the literal plus one at the guard of a window's first micro-batch."""
    if not (name.startswith("self.") and name.count(".") == 1) or type(function.body) is not cst.IndentedBlock:
        return None
    body = list(function.body.body)
    increments = [i for i, s in enumerate(body) if _increments(s, name)]
    at_guard = [i for i, s in enumerate(body) if _holds(s, via[0] if via else guard)]
    if len(increments) != 1 or len(at_guard) != 1 or increments[0] >= at_guard[0]:
        return None
    if _exits(body[increments[0] + 1:at_guard[0]]):
        return None
    init = _sibling_init(model, function)
    set_at: cst.Assign | None = None
    reset_at: cst.Assign | None = None
    for node in _attribute_bindings(model).get(name, ()):
        if _holds(body[increments[0]], node):
            continue
        value = number(node.value) if type(node) is cst.Assign and len(node.targets) == 1 else None
        if value is None or value != int(value) or value < 0:
            return None  # set from something the code does not spell
        if init is not None and function_holding(model, node) is init and set_at is None:
            set_at = node
        elif function_holding(model, node) is function and _holds(guard, node) and reset_at is None:
            reset_at = node
        else:
            return None
    if set_at is None or (reset_at is not None and number(reset_at.value) != number(set_at.value)):
        return None
    return CounterStart(int(number(set_at.value)) + 1, set_at, body[increments[0]], False, reset_at=reset_at)


def _sibling_init(model: LoopModel, function: cst.FunctionDef) -> cst.FunctionDef | None:
    """The ``__init__`` of the class that defines ``function``."""
    owner = (model.parents or {}).get((model.parents or {}).get(function))
    if type(owner) is not cst.ClassDef:
        return None
    return next((method for method in class_methods(owner) if method.name.value == "__init__"), None)


def _exits(statements: list[cst.CSTNode]) -> bool:
    """A ``return`` or ``raise`` of the function among the statements (not one of a definition nested in them)."""
    pending = list(statements)
    while pending:
        node = pending.pop()
        if type(node) in (cst.Return, cst.Raise):
            return True
        if type(node) in (cst.FunctionDef, cst.ClassDef, cst.Lambda):
            continue
        pending.extend(node.children)
    return False


def _kept_on_self(model: LoopModel, loop: cst.CSTNode, name: str) -> bool:
    """Whether every binding of ``self.x`` in the module lies in the function holding ``loop`` or in ``__init__``."""
    scope = function_holding(model, loop)
    if scope is None:
        return False
    for node in _attribute_bindings(model).get(name, ()):
        function = function_holding(model, node)
        if function is not scope and (function is None or function.name.value != "__init__"):
            return False
    return True


def _attribute_bindings(model: LoopModel) -> dict[str, list[cst.CSTNode]]:
    """Every assignment of the module that binds an attribute (``self.step = 0``, ``self.step += 1``), by the
    attribute's dotted name: read once per file, for the questions asked of each counter kept on ``self``."""

    def read() -> dict[str, list[cst.CSTNode]]:
        table: dict[str, list[cst.CSTNode]] = {}
        for node in model.file.every_node(model.module):
            kind = type(node)
            if kind is cst.Assign:
                targets = [t.target for t in node.targets]
            elif kind is cst.AugAssign or kind is cst.AnnAssign:
                targets = [node.target]
            else:
                continue
            names = {dotted_name(t) for target in targets for t in walk(target) if type(t) is cst.Attribute} - {None}
            for name in names:
                table.setdefault(name, []).append(node)
        return table

    return model.file.once(_attribute_bindings, read)


def _literal_set_before(model: LoopModel, loop: cst.CSTNode, scope: cst.CSTNode, name: str) -> cst.Assign | None:
    """``name = <int literal>`` in a block that holds the loop, before it, when every other binding of ``name`` in
    the scope is inside the loop or restores it under an ``if`` before the loop (a resumed run's count)."""
    parents = model.parents or {}
    loop_line = model.line(loop)
    literal: cst.Assign | None = None
    child, block = loop, parents.get(loop)
    while block is not None and literal is None:
        if type(block) in (cst.IndentedBlock, cst.Module):
            siblings = list(block.body)
            position = next((i for i, s in enumerate(siblings) if s is child), 0)
            for statement in reversed(siblings[:position]):
                if type(statement) is cst.SimpleStatementLine and len(statement.body) == 1:
                    small = statement.body[0]
                    if (type(small) is cst.Assign and len(small.targets) == 1
                            and type(small.targets[0].target) in (cst.Name, cst.Attribute)
                            and dotted_name(small.targets[0].target) == name):
                        value = number(small.value)
                        literal = small if value is not None and value == int(value) and value >= 0 else None
                        break
                if assigned_in(statement, name) and not _restores(statement):
                    return None  # set another way on the way to the loop
        if block is scope:
            break
        child, block = block, parents.get(block)
    if literal is None:
        return None
    for node in walk(scope):
        if node is literal or not _binds(node, name) or _holds(loop, node):
            continue
        if model.line(node) > loop_line or not _under_if(parents, node, scope):
            return None
    return literal


def _restores(statement: cst.CSTNode) -> bool:
    """An ``if`` (a resumed run reading the count from a checkpoint): its binding does not change a fresh run's start."""
    return type(statement) is cst.If


def _under_if(parents: dict, node: cst.CSTNode, scope: cst.CSTNode) -> bool:
    current = parents.get(node)
    while current is not None and current is not scope:
        if type(current) is cst.If:
            return True
        if type(current) in (cst.For, cst.While):
            return False
        current = parents.get(current)
    return False
