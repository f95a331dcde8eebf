"""Small questions about LibCST expressions that the loop model asks again and again."""

from __future__ import annotations

import ast
import inspect
import operator
import re
import textwrap
from collections.abc import Callable, Iterable, Iterator

import libcst as cst

# LibCST's concrete node classes are final: ``type(x) is cst.Name`` answers what
# ``isinstance`` does, without the cost of an abstract-base-class check.


def dotted_name(node: cst.CSTNode | None) -> str | None:
    """``self.opt_d`` for an ``Attribute`` chain of names, ``loss`` for a ``Name``, else None."""
    parts: list[str] = []
    while type(node) is cst.Attribute:
        parts.append(node.attr.value)
        node = node.value
    if type(node) is cst.Name:
        parts.append(node.value)
        return ".".join(reversed(parts))
    return None


def tracked_name(node: cst.CSTNode | None) -> str | None:
    """``dotted_name``, or ``out["loss"]`` for an entry of a dotted name under one string key.

    Trainers often carry the loss in a dict (``batch_output["loss"] /= n``,
    then ``backward(batch_output["loss"])``): such an entry is followed like a name.
    """
    if type(node) is cst.Subscript and len(node.slice) == 1:
        index = node.slice[0].slice
        base = dotted_name(node.value)
        if base is not None and type(index) is cst.Index and type(index.value) is cst.SimpleString:
            return f"{base}[{index.value.evaluated_value!r}]"
        return None
    return dotted_name(node)


def element_name(node: cst.Subscript) -> str | None:
    """``opts[1]``, ``optimizers['g']``, ``opts[i]``, ``opts[cfg.name]``: an element of a named collection, by a number,
    a string or a (dotted) name; None for anything else (a slice, ``self.optimizers()[0]``)."""
    base = dotted_name(node.value)
    if base is None or len(node.slice) != 1 or type(node.slice[0].slice) is not cst.Index:
        return None
    key = node.slice[0].slice.value
    if type(key) is cst.Integer:
        return f"{base}[{key.value}]"
    if type(key) is cst.SimpleString and "." not in key.evaluated_value:
        return f"{base}[{key.evaluated_value!r}]"
    if type(key) in (cst.Name, cst.Attribute):  # ``opts[name]``, ``opts[cfg.adapter_name]``
        name = dotted_name(key)
        return f"{base}[{name}]" if name is not None else None
    return None


def terminal(node: cst.BaseExpression) -> str | None:
    """The last name of ``x`` or ``a.b.x``."""
    if type(node) is cst.Name:
        return node.value
    if type(node) is cst.Attribute:
        return node.attr.value
    return None


def root_name(node: cst.CSTNode | None) -> str | None:
    """The leftmost name of an attribute/subscript/call chain: ``p`` for ``p.grad.data``."""
    while True:
        if type(node) is cst.Name:
            return node.value
        if type(node) is cst.Attribute:
            node = node.value
        elif type(node) is cst.Subscript:
            node = node.value
        elif type(node) is cst.Call:
            node = node.func
        else:
            return None


def method_name(call: cst.Call) -> str | None:
    """``step`` for ``opt.step()``; None when the callee is not an attribute."""
    if type(call.func) is cst.Attribute:
        return call.func.attr.value
    return None


def receiver(call: cst.Call) -> cst.BaseExpression | None:
    """``opt`` for ``opt.step()``; None when the callee is not an attribute."""
    if type(call.func) is cst.Attribute:
        return call.func.value
    return None


def callee_name(call: cst.Call) -> str | None:
    """The last name of the callee: ``clip_grad_norm_`` for ``torch.nn.utils.clip_grad_norm_(...)``."""
    func = call.func
    if type(func) is cst.Attribute:
        return func.attr.value
    if type(func) is cst.Name:
        return func.value
    return None


def keyword_arg(call: cst.Call, name: str) -> cst.Arg | None:
    """The argument passed as ``name=...``, if any."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def positional_args(call: cst.Call) -> list[cst.Arg]:
    """The plain positional arguments (no keywords, no ``*``/``**`` unpacking)."""
    return [a for a in call.args if a.keyword is None and not a.star]


def is_grad(node: cst.CSTNode | None) -> bool:
    """``p.grad`` or ``p.grad.data``."""
    if type(node) is cst.Attribute and node.attr.value == "data":
        node = node.value
    return type(node) is cst.Attribute and node.attr.value == "grad"


_GRAD_WRITES = frozenset({"add_", "sub_", "copy_", "set_"})


def writes_grad_in_place(call: cst.Call) -> bool:
    """``p.grad.add_(g)``, ``p.grad.data.copy_(g)``, ``ref.grad.data.sub_(proto.data).add_(ref.data)``: a gradient
    written into its buffer."""
    func = call.func
    if type(func) is not cst.Attribute or func.attr.value not in _GRAD_WRITES:
        return False
    written = func.value
    while type(written) is cst.Call and type(written.func) is cst.Attribute and written.func.attr.value in _GRAD_WRITES:
        written = written.func.value
    return is_grad(written)


def frees_gradients(nodes: Iterable[cst.CSTNode]) -> bool:
    """Whether code among ``nodes`` clears the gradients it holds: an ``x.zero_grad()`` call or a ``p.grad = None``
    store (a gradient-release hook, or an optimizer class's own ``step()``, that frees what it applied)."""
    for node in nodes:
        if type(node) is cst.Call and method_name(node) == "zero_grad":
            return True
        if type(node) is cst.Assign and type(node.value) is cst.Name and node.value.value == "None":
            if any(type(t.target) is cst.Attribute and t.target.attr.value == "grad" for t in node.targets):
                return True
    return False


def bool_literal(node: cst.BaseExpression) -> bool | None:
    """True/False for the literal names, None for anything else."""
    if type(node) is cst.Name and node.value in ("True", "False"):
        return node.value == "True"
    return None


def bind_arguments(helper: cst.FunctionDef, call: cst.Call) -> dict[str, cst.BaseExpression]:
    """Which caller expression each helper parameter receives (positional and keyword, no ``*args``)."""
    params = [p.name.value for p in helper.params.posonly_params] + [p.name.value for p in helper.params.params]
    if params and params[0] in ("self", "cls") and type(call.func) is cst.Attribute:
        params = params[1:]
    bindings: dict[str, cst.BaseExpression] = {}
    for name, arg in zip(params, positional_args(call)):
        bindings[name] = arg.value
    for arg in call.args:
        if arg.keyword is not None:
            bindings[arg.keyword.value] = arg.value
    return bindings


def with_arguments(test: cst.BaseExpression, bindings: dict[str, cst.BaseExpression]) -> cst.BaseExpression:
    """A helper's branch test read at one call site: each parameter replaced by the caller's expression, and ``not``,
    ``and``, ``or`` of literal booleans folded (``not accumulate or is_last`` with ``accumulate=True`` and
    ``is_last=((i + 1) % k == 0)`` reads ``((i + 1) % k == 0)``). The test itself when it reads no bound name."""
    kind = type(test)
    if kind is cst.Name:
        return bindings.get(test.value, test)
    if kind is cst.UnaryOperation and type(test.operator) is cst.Not:
        inner = with_arguments(test.expression, bindings)
        literal = bool_literal(inner)
        if literal is not None:
            return cst.Name("False" if literal else "True")
        return test if inner is test.expression else test.with_changes(expression=inner)
    if kind is cst.BooleanOperation:
        left, right = with_arguments(test.left, bindings), with_arguments(test.right, bindings)
        left_value, right_value = bool_literal(left), bool_literal(right)
        absorbing = type(test.operator) is cst.Or  # ``True or x`` is True, ``False and x`` is False
        for value, other in ((left_value, right), (right_value, left)):
            if value is absorbing:
                return cst.Name("True" if absorbing else "False")
            if value is not None:
                return other
        return test if (left is test.left and right is test.right) else test.with_changes(left=left, right=right)
    return test


# isinstance() against LibCST's abstract node classes is slow; the answer per type is cached.
_NODE_TYPES: dict[type, bool] = {}


def _is_node(value: object) -> bool:
    kind = type(value)
    known = _NODE_TYPES.get(kind)
    if known is None:
        known = _NODE_TYPES[kind] = issubclass(kind, cst.CSTNode)
    return known


# The walks below read each node's children through ``children_of``: :func:`children` by default, or a
# parsed file's own lookup (:meth:`gradlint.parsed_file.ParsedFile.children`), which answers from the
# children the module index already read.
ChildrenOf = Callable[[cst.CSTNode], list[cst.CSTNode]]


def leaves_block(block: cst.BaseSuite) -> bool:
    """Whether a block's last statement leaves it: ``continue``, ``break``, ``return`` or ``raise``, also on one line
    (``if bad: scaler = GradScaler(); continue``)."""
    if not block.body:
        return False
    last = block.body[-1]
    if type(block) is cst.SimpleStatementSuite:
        return type(last) in _LEAVING
    return type(last) is cst.SimpleStatementLine and type(last.body[-1]) in _LEAVING


_LEAVING = (cst.Continue, cst.Break, cst.Return, cst.Raise)


def lies_under(parents: dict, node: cst.CSTNode | None, ancestor: cst.CSTNode) -> bool:
    """Whether ``node`` is ``ancestor`` or written inside it, read up a table of parents."""
    while node is not None and node is not ancestor:
        node = parents.get(node)
    return node is not None


def walk(node: cst.CSTNode, *, into_lambdas: bool = False, children_of: ChildrenOf | None = None) -> Iterator[cst.CSTNode]:
    """Every node under ``node`` (itself included), parents before children, never entering nested defs or classes."""
    read = children_of or children
    stop = _DEFS if into_lambdas else _DEFS_AND_LAMBDAS
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        kind = type(current)
        if kind in TRIVIA or (current is not node and kind in stop):
            continue
        stack.extend(reversed(read(current)))


def every_node(node: cst.CSTNode, children_of: ChildrenOf | None = None) -> Iterator[cst.CSTNode]:
    """Every node under ``node`` (itself included), nested defs, classes and lambdas too, in no particular order.

    Whitespace and punctuation are not entered: names and literals are the leaves.
    """
    read = children_of or children
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if type(current) not in TRIVIA:
            stack.extend(read(current))


# LibCST's concrete node classes are never subclassed: exact type tests are safe and fast.
_DEFS = frozenset({cst.FunctionDef, cst.ClassDef})
_DEFS_AND_LAMBDAS = _DEFS | {cst.Lambda}


def _trivia() -> frozenset[type]:
    """Node classes below which there is only whitespace and punctuation: walks yield them but do not enter them."""
    operators = (cst.BaseBinaryOp, cst.BaseUnaryOp, cst.BaseBooleanOp, cst.BaseCompOp, cst.BaseAugOp)
    names = (
        "SimpleWhitespace ParenthesizedWhitespace TrailingWhitespace Newline EmptyLine Comment Comma Dot Colon "
        "Semicolon AssignEqual LeftParen RightParen LeftSquareBracket RightSquareBracket LeftCurlyBrace "
        "RightCurlyBrace ImportStar Name Integer Float Imaginary SimpleString Ellipsis"
    ).split()
    found = {getattr(cst, name) for name in names}
    found.update(c for c in vars(cst).values() if isinstance(c, type) and issubclass(c, operators) and c not in operators)
    return frozenset(found)


TRIVIA = _trivia()


_DEFERRED = frozenset({cst.Lambda, cst.FunctionDef, cst.ClassDef, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp})
_TRIVIA_OR_DEFERRED = TRIVIA | _DEFERRED


def calls_in_evaluation_order(node: cst.CSTNode, children_of: ChildrenOf | None = None) -> list[cst.Call]:
    """The calls in an expression or simple statement, innermost first, as Python evaluates them.

    Lambda bodies and comprehensions are skipped: their code does not run where it is written.
    """
    read = children_of or children
    result: list[cst.Call] = []
    if type(node) in TRIVIA:
        return result
    skipped = _TRIVIA_OR_DEFERRED
    # Iterative post-order walk: deeply nested expressions must not exhaust the recursion limit.
    # A call is pushed again, marked, below its children: it is taken once they all are.
    stack: list[tuple[cst.CSTNode, bool]] = [(node, False)]
    while stack:
        current, children_done = stack.pop()
        if children_done:
            result.append(current)
            continue
        if type(current) is cst.Call:
            stack.append((current, True))
        for child in reversed(read(current)):
            if type(child) not in skipped:
                stack.append((child, False))
    return result


# Calls that divide their receiver or first argument, and those that divide or multiply it.
_DIVIDING_CALLS = frozenset({"div", "div_", "true_divide", "divide"})
SCALING_CALLS = _DIVIDING_CALLS | {"mul", "mul_"}


def contains_division(node: cst.CSTNode) -> bool:
    """Whether an expression divides: ``a / n``, ``a * (1 / n)``, ``a.div(n)``, ``torch.div(a, n)``."""
    for sub in walk(node):
        kind = type(sub)  # exact type tests: isinstance against LibCST's classes goes through ABCMeta
        if kind is cst.BinaryOperation and type(sub.operator) is cst.Divide:
            return True
        if kind is cst.Call and callee_name(sub) in _DIVIDING_CALLS:
            return True
    return False


def scales_down(node: cst.CSTNode, children_of: ChildrenOf | None = None) -> bool:
    """Whether an expression plausibly normalises a loss: a division, or a product with a non-literal factor.

    A product such as ``loss * grad_accum_scale`` may well be ``1 / n``: the
    model cannot tell, so it gives the code the benefit of the doubt. A sum
    or difference scales down only when each of its terms does: in
    ``l1(x) + 0.5 * l2(x)`` the factor weighs one loss term against another,
    and the sum is as large as ``l1(x)``.
    """
    read = children_of or children
    stack: list[cst.CSTNode] = [node]
    while stack:
        sub = stack.pop()
        kind = type(sub)
        if kind is cst.BinaryOperation:
            operator = type(sub.operator)
            if operator is cst.Add or operator is cst.Subtract:
                if all(scales_down(term, children_of) for term in _terms(sub)):
                    return True
                continue  # a weighted sum of terms, not a normalised one: nothing below it counts
            if operator is cst.Divide:
                return True
            if operator is cst.Multiply:
                for side in (sub.left, sub.right):
                    side_kind = type(side)
                    if side_kind is cst.Integer or side_kind is cst.Float:
                        value = number(side)
                        if value is not None and value < 1:
                            return True
                    elif side_kind is not cst.Imaginary and _is_factor(side):
                        return True
        elif kind is cst.Call:
            if callee_name(sub) in SCALING_CALLS:
                return True
        if kind in TRIVIA or (sub is not node and kind in _DEFS_AND_LAMBDAS):
            continue
        stack.extend(reversed(read(sub)))
    return False


def _terms(node: cst.BinaryOperation) -> list[cst.BaseExpression]:
    """The terms of a sum or difference written without parentheses around its inner sums: ``a + b - c`` -> a, b, c."""
    terms: list[cst.BaseExpression] = []
    pending: list[cst.BaseExpression] = [node]
    while pending:
        current = pending.pop()
        if type(current) is cst.BinaryOperation and type(current.operator) in (cst.Add, cst.Subtract):
            pending.extend((current.right, current.left))
        else:
            terms.append(current)
    return terms


def _is_factor(node: cst.BaseExpression) -> bool:
    """A multiplicand that is a plain name or attribute (``scale``, ``grad_accum_scale``), not another loss.

    Per-sample weights or a mask (``(losses * weights).mean()``) weight the
    micro-batch's own samples: they are no division by the number of micro-batches.
    """
    name = dotted_name(node)
    if name is None:
        return False
    last = name.rsplit(".", 1)[-1].lower()
    return "loss" not in last and not _WEIGHTING.search(last)


_WEIGHTING = re.compile(r"(^|_)(weights?|masks?)$")


# LibCST's ``node.children`` rebuilds the node through a visitor to list its
# children, which made it the single largest cost of reading a big module.
# ``children`` reads the same fields directly, in the order LibCST visits them
# (its ``_visit_and_replace_children`` names each field as it visits it).


def _field_order(node_type: type) -> tuple[str, ...] | None:
    """The fields of a node type in the order LibCST visits them; None when its code cannot be read."""
    try:
        source = textwrap.dedent(inspect.getsource(node_type._visit_and_replace_children))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    names: list[str] = []
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id.startswith("visit_")]
    for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset)):
        if len(call.args) >= 2 and isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str):
            if call.args[1].value not in names:
                names.append(call.args[1].value)
    return tuple(names) if names else None


# Per node type, one C call that reads all its fields in visiting order (None: ask LibCST).
_FIELD_READERS: dict[type, Callable[[cst.CSTNode], tuple[object, ...]] | None] = {}


def _field_reader(node_type: type) -> Callable[[cst.CSTNode], tuple[object, ...]] | None:
    order = _field_order(node_type)
    if order is None:
        return None
    if len(order) == 1:  # attrgetter of one name gives the value itself, not a tuple
        name = order[0]
        return lambda node: (getattr(node, name),)
    return operator.attrgetter(*order)


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The direct children of a node in source order: LibCST's ``node.children``, read without rebuilding the node.

    The list may be shared: callers read it and never change it.
    """
    node_type = type(node)
    try:
        read = _FIELD_READERS[node_type]
    except KeyError:
        read = _FIELD_READERS[node_type] = _field_reader(node_type)
    if read is None:
        return list(node.children)
    node_types = _NODE_TYPES
    result: list[cst.CSTNode] = []
    for value in read(node):
        kind = type(value)
        if kind is tuple or kind is list:
            for item in value:
                known = node_types.get(type(item))
                if known or (known is None and _is_node(item)):
                    result.append(item)
        else:
            known = node_types.get(kind)
            if known or (known is None and _is_node(value)):
                result.append(value)
    return result


def number(node: cst.CSTNode) -> float | None:
    """The value of an int or float literal in any spelling (``0x0``, ``1_000``, ``1e-3``), else None."""
    if type(node) not in (cst.Integer, cst.Float):
        return None
    try:
        return float(ast.literal_eval(node.value))
    except (ValueError, SyntaxError):
        return None


def boolean_terms(test: cst.BaseExpression, operator: type[cst.BaseBooleanOp]) -> list[cst.BaseExpression]:
    """The operands of a chain of one boolean operator (``a or b or c`` for :class:`libcst.Or`), or the test itself."""
    if type(test) is cst.BooleanOperation and type(test.operator) is operator:
        return boolean_terms(test.left, operator) + boolean_terms(test.right, operator)
    return [test]


def class_methods(cls: cst.ClassDef) -> list[cst.FunctionDef]:
    """The functions defined directly in a class's body, in order."""
    body = cls.body.body if type(cls.body) is cst.IndentedBlock else []
    return [s for s in body if type(s) is cst.FunctionDef]


def comprehension_clauses(clause: cst.CompFor | None) -> list[cst.CompFor]:
    """The ``for`` clauses of a comprehension (``node.for_in``), outermost first."""
    clauses = []
    while clause is not None:
        clauses.append(clause)
        clause = clause.inner_for_in
    return clauses


def parameter_names(function: cst.FunctionDef) -> list[str]:
    """The names of a function's positional and keyword parameters, in order (``*args`` and ``**kwargs`` left out)."""
    params = function.params
    return [p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)]


def only_raises_not_implemented(function: cst.FunctionDef) -> bool:
    """Whether a function's body, its docstring aside, only raises ``NotImplementedError``: an abstract method whose
    subclasses' overrides do the work."""
    body = [s for s in function.body.body if not (type(s) is cst.SimpleStatementLine and type(s.body[0]) is cst.Expr
                                                   and type(s.body[0].value) in (cst.SimpleString, cst.ConcatenatedString))]
    if len(body) != 1 or type(body[0]) is not cst.SimpleStatementLine or type(body[0].body[0]) is not cst.Raise:
        return False
    raised = body[0].body[0].exc
    return raised is not None and "NotImplementedError" in (dotted_name(raised) or dotted_name(getattr(raised, "func", None)) or "")


def mentions(node: cst.CSTNode, names: set[str]) -> bool:
    """Whether an expression reads one of ``names`` (a name or a dotted attribute path, as written)."""
    return any(type(n) in (cst.Name, cst.Attribute) and dotted_name(n) in names for n in walk(node))
