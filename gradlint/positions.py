"""Source positions of nodes, computed one top-level statement at a time, only for the statements that report.

LibCST's ``PositionProvider`` regenerates the whole module while recording a
position for every node, which costs far more than parsing it. A finding
needs the positions of a few nodes only, so :class:`Positions` finds the
top-level statement that holds a node, generates the code of that statement
alone while recording positions, and shifts them by the line the statement
starts on. Those start lines come from Python's own parser (several times
faster than LibCST's, and run only for a module that reports); when it cannot
read the source, the lines of the earlier statements are counted on their code.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, PositionProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState

from gradlint.parsed_file import ParsedFile
from gradlint.syntax import TRIVIA

def statement_lines(parsed: ParsedFile) -> list[tuple[int, int]] | None:
    """The first and last line of each top-level statement of a file (decorators included), from Python's tree;
    None when Python cannot read the text."""
    tree = parsed.python_tree()
    if tree is None:
        return None
    return [(first, statement.end_lineno or first) for first, statement in zip(_first_token_lines(tree), tree.body)]


def _first_token_lines(tree: ast.Module) -> list[int]:
    """The line of each top-level statement's first token: its first decorator's, if it has any."""
    return [statement.decorator_list[0].lineno if getattr(statement, "decorator_list", None) else statement.lineno for statement in tree.body]


class Positions:
    """``positions[node]`` is the node's :class:`CodeRange`, as ``PositionProvider`` would give it."""

    def __init__(self, parsed: ParsedFile) -> None:
        self.file = parsed
        self.module = module = parsed.module
        self.text = parsed.text
        self._parents = parsed.parents  # each node's parent, when the module index recorded them
        self._statement_of: dict[int, int] = {}  # id(node) -> index of its top-level statement
        self._walked = 0  # top-level statements indexed so far
        self._index_of: dict[int, int] | None = None  # id(top-level statement) -> its index
        self._line_offsets: list[int] | None = None  # lines before each top-level statement
        self._ranges: dict[int, dict[cst.CSTNode, CodeRange]] = {}
        self._line_ranges: dict[int, tuple[dict[cst.CSTNode, CodeRange], int] | None] = {}
        self._pairs: dict[int, dict[int, ast.stmt]] = {}  # id(LibCST block) -> Python's statement per statement
        self._whole: dict[cst.CSTNode, CodeRange] | None = None
        self._lines_agree: bool | None = None  # _no_lone_cr's answer, once known
        self._lines: list[str] | None = None  # the source's lines, once a column is converted
        # Lines are counted on "\n"; an old Mac "\r" file goes through LibCST whole.
        self._by_statement = module.default_newline in ("\n", "\r\n")

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        if self._by_statement and self._parents is not None and self._no_lone_cr():
            found = self._compound(node) if type(node) in _SPANNED else self._in_line(node)
            if found is not None:
                return found
        index = self._find(node) if self._by_statement else None
        if index is None:
            return self._whole_module()[node]
        ranges = self._ranges.get(index)
        if ranges is None:
            ranges = self._ranges[index] = self._resolve(index)
        code_range = ranges[node]
        offset = self._offsets()[index]
        return CodeRange(
            CodePosition(code_range.start.line + offset, code_range.start.column),
            CodePosition(code_range.end.line + offset, code_range.end.column),
        )

    def _find(self, node: cst.CSTNode) -> int | None:
        """The index of the top-level statement that holds ``node``; None for the module, its header or footer."""
        if self._parents is not None:
            return self._climb(node)
        found = self._statement_of.get(id(node))
        body = self.module.body
        statement_of = self._statement_of
        read = self.file.children
        while found is None and self._walked < len(body):
            index = self._walked
            stack: list[cst.CSTNode] = [body[index]]
            while stack:
                current = stack.pop()
                statement_of[id(current)] = index
                if type(current) not in TRIVIA:  # names and literals are indexed, their whitespace is never reported
                    stack.extend(read(current))
            self._walked += 1
            found = statement_of.get(id(node))
        return found

    def start_line(self, node: cst.CSTNode) -> int:
        """The line ``node`` starts on; for a compound statement (a loop, a guard) read from Python's tree without rendering it."""
        if isinstance(node, cst.BaseCompoundStatement) and self._by_statement and self._parents is not None and self._no_lone_cr():
            if not getattr(node, "decorators", ()) and type(self._parents.get(node)) is not cst.If:
                python = self._python_statement(node)
                if python is not None:
                    return python.lineno
        return self[node].start.line

    def _no_lone_cr(self) -> bool:
        """Whether Python and LibCST count the same lines: no carriage return stands alone (decided once per module)."""
        if self._lines_agree is None:
            text = self.text
            self._lines_agree = text is not None and text.count("\r") == text.count("\r\n")
        return self._lines_agree

    def _in_line(self, node: cst.CSTNode) -> CodeRange | None:
        """The position of a node inside a statement line or a compound statement's header, from that code alone.

        None elsewhere (a one-line suite, an ``else``/``except`` header, a decorator, ``elif``): the caller renders the top-level statement.
        """
        line = self._parents.get(node)
        while line is not None and type(line) is not cst.SimpleStatementLine:
            if type(line) in _HEADED:
                break
            if type(line) in _NOT_ALONE or isinstance(line, cst.BaseCompoundStatement):
                return None
            line = self._parents.get(line)
        if line is None:
            return None
        key = id(line)
        if key not in self._line_ranges:
            self._line_ranges[key] = self._resolve_line(line)
        resolved = self._line_ranges[key]
        if resolved is None:
            return None
        ranges, offset = resolved
        code_range = ranges.get(node)
        if code_range is None:
            return None
        start, end = code_range.start, code_range.end
        return CodeRange(CodePosition(start.line + offset, start.column), CodePosition(end.line + offset, end.column))

    def _compound(self, node: cst.BaseCompoundStatement) -> CodeRange | None:
        """The span of a loop, ``if`` or ``with`` read from Python's statement for it, without rendering the body.

        LibCST's range of a compound statement runs from its first keyword to
        the end of its last statement's code, as Python's does; Python counts
        columns in UTF-8 bytes, LibCST in characters. None for a decorated
        statement or an ``elif`` (whose Python statement starts elsewhere).
        """
        if type(self._parents.get(node)) is cst.If:
            return None
        python = self._python_statement(node)
        if python is None or python.end_lineno is None or python.end_col_offset is None:
            return None
        return CodeRange(
            CodePosition(python.lineno, self._characters(python.lineno, python.col_offset)),
            CodePosition(python.end_lineno, self._characters(python.end_lineno, python.end_col_offset)),
        )

    def _characters(self, line: int, utf8_offset: int) -> int:
        """The column in characters of a UTF-8 byte offset into a line of the source."""
        if self._lines is None:
            self._lines = (self.text or "").split("\n")
        text = self._lines[line - 1] if 0 < line <= len(self._lines) else ""
        if text.isascii():
            return utf8_offset
        return len(text.encode("utf-8")[:utf8_offset].decode("utf-8", errors="replace"))

    def _resolve_line(self, line: cst.BaseStatement) -> tuple[dict[cst.CSTNode, CodeRange], int] | None:
        """The positions inside ``line`` rendered alone at its own indentation, and the lines before its first token.

        A compound statement is rendered with its header only: a bare ``pass`` body, no ``else``.
        """
        rendered: cst.BaseStatement = line.with_changes(leading_lines=())
        if type(line) is not cst.SimpleStatementLine:
            if getattr(line, "decorators", ()) or type(self._parents.get(line)) is cst.If:  # decorators lead; ``elif`` reads ``if`` alone
                return None
            changes: dict[str, object] = {"body": _PASS}
            if getattr(line, "orelse", None) is not None:
                changes["orelse"] = None
            rendered = rendered.with_changes(**changes)
        python = self._python_statement(line)
        if python is None:
            return None
        indents: list[str] = []
        current = self._parents.get(line)
        while current is not None and current is not self.module:
            if type(current) is cst.IndentedBlock or type(current) is cst.Match:  # a match indents its cases too
                indents.append(current.indent if current.indent is not None else self.module.default_indent)
            current = self._parents.get(current)
        indents.reverse()
        provider = PositionProvider()
        state = PositionProvidingCodegenState(
            default_indent=self.module.default_indent, default_newline=self.module.default_newline, provider=provider, indent_tokens=indents
        )
        rendered._codegen(state)
        return provider._computed, python.lineno - 1

    def _python_statement(self, line: cst.BaseStatement) -> ast.stmt | None:
        """Python's statement for ``line`` (for a line of ``a; b``, for ``a``), found by descending both trees side by side."""
        tree = self.file.python_tree()
        if tree is None:
            return None
        chain: list[cst.CSTNode] = []
        current: cst.CSTNode | None = line
        while current is not None and current is not self.module:
            if isinstance(current, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                chain.append(current)
            current = self._parents.get(current)
        if current is None:
            return None
        chain.reverse()  # the top-level statement first, ``line`` last
        blocks: list[tuple[Sequence[cst.CSTNode], list[ast.stmt]]] = [(self.module.body, tree.body)]
        python: ast.stmt | None = None
        for statement in chain:
            python = None
            for cst_block, python_block in blocks:
                python = self._pairing(cst_block, python_block).get(id(statement))
                if python is not None:
                    break
            if python is None:
                return None
            blocks = _blocks(statement, python)
        return python

    def _pairing(self, cst_block: Sequence[cst.CSTNode], python_block: list[ast.stmt]) -> dict[int, ast.stmt]:
        """For each statement of a LibCST block (by id), Python's statement for it; computed once per block."""
        key = id(cst_block)
        pairs = self._pairs.get(key)
        if pairs is None:
            pairs = self._pairs[key] = _pair(cst_block, python_block)
        return pairs

    def _climb(self, node: cst.CSTNode) -> int | None:
        """The top-level statement of ``node`` found through the parent map: a few steps per node."""
        if self._index_of is None:
            self._index_of = {id(statement): i for i, statement in enumerate(self.module.body)}
        parents, module = self._parents, self.module
        parent = parents.get(node)
        while parent is not None and parent is not module:
            node, parent = parent, parents.get(parent)
        return self._index_of.get(id(node)) if parent is module else None

    def _offsets(self) -> list[int]:
        """How many lines come before each top-level statement (its leading blank lines and comments are its own)."""
        if self._line_offsets is None:
            starts = _statement_starts(self.file)
            if starts is not None:
                self._line_offsets = [line - 1 for line in starts]
            else:
                module = self.module
                offsets = [sum(module.code_for_node(line).count("\n") for line in module.header)]
                for statement in module.body[:-1]:
                    offsets.append(offsets[-1] + module.code_for_node(statement).count("\n"))
                self._line_offsets = offsets
        return self._line_offsets

    def _resolve(self, index: int) -> dict[cst.CSTNode, CodeRange]:
        """The positions of one top-level statement's nodes, as if it were a module of its own."""
        module = self.module
        alone = module.with_changes(header=(), body=(module.body[index],), footer=(), has_trailing_newline=True)
        return _positions_of(alone)

    def _whole_module(self) -> dict[cst.CSTNode, CodeRange]:
        if self._whole is None:
            self._whole = _positions_of(self.module)
        return self._whole


def _positions_of(module: cst.Module) -> dict[cst.CSTNode, CodeRange]:
    """What ``PositionProvider`` computes for ``module``, without the metadata wrapper's visit of every node."""
    provider = PositionProvider()
    state = PositionProvidingCodegenState(default_indent=module.default_indent, default_newline=module.default_newline, provider=provider)
    module._codegen(state)
    return provider._computed


def _statement_starts(parsed: ParsedFile) -> list[int] | None:
    """The 1-based line each top-level statement's code starts on (leading blank lines and comments included).

    Read from Python's parser: the line of each statement's first token, less
    the lines LibCST keeps in front of it. None without the source, when
    Python cannot read it (LibCST reads newer syntax) or when its statements
    do not pair up with LibCST's.
    """
    module, text = parsed.module, parsed.text
    if text is None or "\r" in text.replace("\r\n", ""):
        return None  # a lone carriage return is a line break to Python, not to the line count of LibCST's code
    tree = parsed.python_tree()
    if tree is None:
        return None
    token_lines = _first_token_lines(tree)
    starts: list[int] = []
    position = 0
    for statement in module.body:
        count = len(statement.body) if type(statement) is cst.SimpleStatementLine else 1
        if position + count > len(token_lines):
            return None
        token_line = token_lines[position]
        position += count
        leading = len(statement.leading_lines)
        decorators = getattr(statement, "decorators", ())
        if decorators:
            leading += len(decorators[0].leading_lines)
        starts.append(token_line - leading)
    if position != len(token_lines):
        return None
    return starts


# Compound statements whose header can be rendered alone, over a bare body; and
# the nodes between a header and the statement that make it impossible
# (an ``else:``/``except:`` header follows the body, a one-line suite is the body).
_HEADED = frozenset({cst.For, cst.While, cst.With, cst.If, cst.FunctionDef, cst.ClassDef})
_NOT_ALONE = frozenset(
    {cst.IndentedBlock, cst.SimpleStatementSuite, cst.Else, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally, cst.MatchCase, cst.Module}
)
# Compound statements whose span Python's parser gives as LibCST would (decorated defs and classes start elsewhere).
_SPANNED = frozenset({cst.For, cst.While, cst.With, cst.If})
_PASS = cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[cst.Pass()])])


def _pair(cst_block: Sequence[cst.CSTNode], python_block: list[ast.stmt]) -> dict[int, ast.stmt]:
    """Python's statement for each statement of a LibCST block (a line of ``a; b`` holds several of Python's); empty when they differ."""
    pairs: dict[int, ast.stmt] = {}
    position = 0
    for statement in cst_block:
        if position >= len(python_block):
            return {}
        pairs[id(statement)] = python_block[position]
        position += len(statement.body) if type(statement) is cst.SimpleStatementLine else 1
    return pairs if position == len(python_block) else {}


def _blocks(statement: cst.CSTNode, python: ast.stmt) -> list[tuple[Sequence[cst.CSTNode], list[ast.stmt]]]:
    """The statement blocks of a compound statement, each beside Python's block for it."""
    pairs: list[tuple[cst.BaseSuite | None, list[ast.stmt]]] = []
    if type(statement) in (cst.FunctionDef, cst.ClassDef, cst.With):
        pairs.append((statement.body, python.body))
    elif type(statement) in (cst.For, cst.While):
        pairs.append((statement.body, python.body))
        if statement.orelse is not None:
            pairs.append((statement.orelse.body, python.orelse))
    elif type(statement) is cst.If:
        pairs.append((statement.body, python.body))
        if type(statement.orelse) is cst.If:  # elif: Python's else block holds that one ``if``
            return [(_suite(statement.body), python.body), ((statement.orelse,), python.orelse)]
        if statement.orelse is not None:
            pairs.append((statement.orelse.body, python.orelse))
    elif type(statement) is cst.Try or type(statement).__name__ == "TryStar":
        pairs.append((statement.body, python.body))
        pairs.extend((handler.body, python_handler.body) for handler, python_handler in zip(statement.handlers, python.handlers))
        if statement.orelse is not None:
            pairs.append((statement.orelse.body, python.orelse))
        if statement.finalbody is not None:
            pairs.append((statement.finalbody.body, python.finalbody))
    elif type(statement) is cst.Match:
        pairs.extend((case.body, python_case.body) for case, python_case in zip(statement.cases, python.cases))
    return [(_suite(suite), block) for suite, block in pairs]


def _suite(suite: cst.BaseSuite) -> Sequence[cst.CSTNode]:
    """The statements of an indented block (a one-line suite holds none that start a line)."""
    return suite.body if type(suite) is cst.IndentedBlock else ()
