"""Checking source code: one file's text in, its findings (or why it could not be checked) out."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import libcst as cst
from libcst._nodes.base import CSTNode

from gradlint.config import Config
from gradlint.findings import FileResult, Finding
from gradlint.gc_pause import cyclic_gc_paused
from gradlint.build import build_model
from gradlint.events import EventKind
from gradlint.model import Event, LoopModel
from gradlint.noqa import is_suppressed, noqa_lines
from gradlint.old_syntax import stand_in
from gradlint.parsed_file import ParsedFile
from gradlint.positions import statement_lines
from gradlint.project_index import python_tree
from gradlint.python_nodes import FiledTree
from gradlint.queries import function_holding
from gradlint.setting_defaults import latent_note
from gradlint.syntax import dotted_name, number, parameter_names
from gradlint.foreign_code import written_for_another_library
from gradlint.prefilter import called_names, might_fire, needed_tokens, rules_that_might_fire
from gradlint.ruled_out import ruled_out
from gradlint.rule import Report, Rule
from gradlint.rules import ALL_RULES
from gradlint.source import SourceError, read_source


# LibCST's native parser recurses on the machine stack: code nested deeply
# enough crashes the whole process. Python's own parser refuses such code with
# an error, and is several times faster, so it reads the text first. It keeps
# ``a and b and c ...`` flat where LibCST nests it: long chains are counted.
_TOO_DEEP = "cannot parse: code nested too deeply"
# Why a file read through a stand-in is not fixed.
OLD_NAMES = "it uses `async` or `await` as a name (Python 3.6 code), which gradlint reads but does not rewrite; nothing written"
_MAX_BOOLEAN_CHAIN = 2000


def _refuse_deep_nesting(text: str, tree: ast.Module | None = None) -> ast.Module | None:
    """Raise :class:`SourceError` for code nested too deeply for LibCST; else Python's tree of ``text``, if it reads it.

    ``tree``, Python's tree of ``text`` when the caller has it already, is not parsed again.
    """
    if tree is None:
        try:
            tree = ast.parse(text)
        except (RecursionError, MemoryError) as error:
            raise SourceError(_TOO_DEEP) from error
        except SyntaxError as error:
            if "too many nested" in str(error.msg):
                raise SourceError(_TOO_DEEP) from error
            return None  # LibCST decides, and says where (it also reads syntax newer than this Python's)
        except ValueError:
            return None
    if text.count(" and ") + text.count(" or ") > _MAX_BOOLEAN_CHAIN:
        if any(isinstance(node, ast.BoolOp) and len(node.values) > _MAX_BOOLEAN_CHAIN for node in ast.walk(tree)):
            raise SourceError(_TOO_DEEP)
    return tree


def parse(text: str, python_tree: ast.Module | FiledTree | None = None, *, old_names: bool = True) -> ParsedFile:
    """Parse source text into a :class:`ParsedFile`, turning LibCST's errors into one-line :class:`SourceError`s.

    ``python_tree``, Python's own tree of ``text`` when the caller has parsed it already, is used instead of parsing it again.
    With ``old_names``, Python 3.6 code that uses ``async``/``await`` as names is parsed through a same-length
    stand-in (:mod:`gradlint.old_syntax`): the module's positions are the text's, but its code is not the text
    (``ParsedFile.stand_in`` says so), so a caller that writes code back must pass ``old_names=False``.
    """
    filed = FiledTree.of(python_tree)
    tree = _refuse_deep_nesting(text, filed.tree if filed is not None else None)
    try:
        if tree is not None:  # Python read the text: LibCST's parser builds valid nodes for it
            with _node_validation_skipped():
                module = cst.parse_module(text)
        else:
            module = cst.parse_module(text)
    except cst.ParserSyntaxError as error:
        substitute = stand_in(text)
        if substitute is not None:
            if not old_names:
                raise SourceError(f"cannot fix: {OLD_NAMES}") from error
            parsed = parse(substitute.text, None)
            return ParsedFile(parsed.module, text, substitute, python=parsed.python_nodes())
        # Python's own parser says where and why more precisely than LibCST's.
        try:
            ast.parse(text)
        except SyntaxError as python_error:
            raise SourceError(
                f"cannot parse: {python_error.msg} (line {python_error.lineno}, column {python_error.offset})"
            ) from error
        except (RecursionError, MemoryError, ValueError):
            pass
        message = str(error.message).strip().splitlines()[0] if error.message else "invalid syntax"
        raise SourceError(f"cannot parse: {message} (line {error.raw_line}, column {error.raw_column + 1})") from error
    except RecursionError as error:
        raise SourceError(_TOO_DEEP) from error
    except Exception as error:  # noqa: BLE001 - LibCST refuses some code Python accepts (b"x" "y")
        raise SourceError(f"cannot parse: {str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}") from error
    return ParsedFile(module, text, python=filed if filed is not None else FiledTree.of(tree))


@contextmanager
def _node_validation_skipped() -> Iterator[None]:
    """Skip the check each LibCST node runs on its fields when built, while the parser builds a module's nodes.

    The check (``CSTNode.__post_init__`` calling ``_validate``) exists for
    nodes written by hand; LibCST's own notes call it wasted work when parsing.
    It is about an eighth of a parse. It is skipped only for text Python's own
    parser accepted: LibCST's check also refuses a few texts its parser takes
    (``b"x" "y"``), which Python refuses as well. Nodes built meanwhile by other
    code (fixes) are built after this returns, and are checked.
    """
    original = CSTNode.__dict__.get("__post_init__")
    if original is None:  # a LibCST that checks nodes some other way
        yield
        return
    CSTNode.__post_init__ = _unchecked  # type: ignore[method-assign]
    try:
        yield
    finally:
        CSTNode.__post_init__ = original  # type: ignore[method-assign]


def _unchecked(node: CSTNode) -> None:
    """What a node runs when built while :func:`_node_validation_skipped` holds: nothing."""


def parse_and_check(
    text: str,
    path: str,
    rules: Sequence[type[Rule]],
    context: Iterable[str] | None = None,
    python_tree: ast.Module | FiledTree | None = None,
) -> FileResult:
    """Parse ``text`` and run ``rules`` over it, the collector paused (:func:`cyclic_gc_paused`).

    ``context`` as for :func:`check_module`; ``python_tree`` as for :func:`parse`.
    """
    with cyclic_gc_paused():
        try:
            parsed = parse(text, python_tree)
        except SourceError as error:
            return FileResult(path, error=str(error))
        result = check_module(parsed, path, rules, context=context)
        substitute = parsed.stand_in if result.findings else None
        # Freed while the collector is paused: the file's nodes, made while it was, then never meet it.
        del parsed
    if substitute is not None:  # in the original's words, and with no fix: the fixer will not rewrite such a file
        findings = [dataclasses.replace(f, message=substitute.restore(f.message), fix=None) for f in result.findings]
        result = dataclasses.replace(result, findings=findings)
    return result


def check_module(
    parsed: ParsedFile,
    path: str,
    rules: Sequence[type[Rule]],
    *,
    noqa: bool = True,
    context: Iterable[str] | None = None,
) -> FileResult:
    """Run ``rules`` over a parsed file. An exception inside a rule becomes the file's error, naming the rule.

    ``noqa=False`` keeps findings on ``# noqa`` lines (for hosts such as flake8 that apply their own).
    ``context`` is what the other files of the run say about the module's functions
    (:mod:`gradlint.project_index`); None: the module alone is the run.
    """
    if written_for_another_library(parsed.code):
        return FileResult(path)  # Warp's or Paddle's ``backward`` and ``step`` are not torch's
    try:
        model = build_model(parsed, context)
    except RecursionError:  # LibCST writes code back out recursively
        return FileResult(path, error="cannot check: code nested too deeply")
    except Exception as error:  # noqa: BLE001 - one bad file must never stop the run
        return FileResult(path, error=f"internal error in the loop model: {type(error).__name__}: {error}")
    findings: list[Finding] = []
    for rule_class in rules:
        try:
            findings.extend(_run_rule(rule_class, model, path))
        except RecursionError:
            return FileResult(path, findings=findings, error="cannot check: code nested too deeply")
        except Exception as error:  # noqa: BLE001
            return FileResult(path, findings=findings, error=f"internal error in {rule_class.code}: {type(error).__name__}: {error}")
    if findings and noqa:
        suppressed = noqa_lines(parsed.code, {f.line for f in findings}, statement_lines(parsed))
        findings = [f for f in findings if not is_suppressed(f.code, f.line, suppressed)]
    return FileResult(path, sorted(set(findings)))


def _run_rule(rule_class: type[Rule], model: LoopModel, path: str) -> list[Finding]:
    return [finding for finding, _ in rule_reports(rule_class, model, path)]


def rule_reports(rule_class: type[Rule], model: LoopModel, path: str) -> list[tuple[Finding, Report]]:
    """One rule's findings on a model, each with the report (and so the fix) it came from.

    An event inlined into several roots is reported once: where some root
    shows the problem in the event's own function rather than at a call of it
    (:func:`report_site`), from there; else the report whose fix applies (a
    copy inlined through a call cannot be edited in place), else the first.
    One site holds one finding of a rule.
    """
    chosen: dict[int, tuple[Report, bool, CSTNode, str]] = {}
    for report in rule_class().check(model):
        if ruled_out(model, report.node):
            continue  # under ``if a: if b:`` after ``if a and b: raise``: code that never runs
        applies = report.fix is not None and report.fix.edits() is not None
        site, message = report_site(model, report)
        if report.setting is not None:
            message += _latent_note(model, report.setting)
        key = id(report.event.node) if report.event is not None else id(report.node)
        previous = chosen.get(key)
        if previous is None or _better(report, site, applies, previous):
            chosen[key] = (report, applies, site, message)
    results, sites = [], set()
    for report, applies, site, message in chosen.values():
        if id(site) in sites:
            continue
        sites.add(id(site))
        line, column, end_line, end_column = model.position(site)
        finding = Finding(
            path, line, column, end_line, end_column, rule_class.code, rule_class.name, message,
            rule_class.severity, rule_class.fix if applies else None,
        )
        results.append((finding, report))
    return results


def _setting_name(node: cst.BaseExpression | None) -> str | None:
    """The name a setting is declared under, from the expression that reads it: ``gradient_accumulation_steps`` for
    ``args.gradient_accumulation_steps``, ``self.cfg.train.accum`` or ``config["gradient_accumulation_steps"]``;
    None for a literal or any other expression."""
    if node is None:
        return None
    if type(node) is cst.Subscript and len(node.slice) == 1:
        index = node.slice[0].slice
        if type(index) is cst.Index and type(index.value) is cst.SimpleString:
            key = index.value.evaluated_value
            return key if isinstance(key, str) and key.isidentifier() else None
        return None
    spelled = dotted_name(node)
    return spelled.rsplit(".", 1)[-1] if spelled is not None else None


def _latent_note(model: LoopModel, setting: cst.BaseExpression) -> str:
    """What the message adds when the count a finding needs above 1 ships at 1 (:mod:`gradlint.setting_defaults`):
    read from the expression itself, or from the one value a name or attribute of it is bound to
    (``accum = args.grad_accum``, ``self.accum = cfg.accum``)."""
    if number(setting) is not None:
        return ""
    name = _setting_name(setting)
    if name is None:
        return ""
    if name in model.ships_at_one:
        return latent_note(model.code(setting))
    spelled = dotted_name(setting)
    if spelled is None or model.index is None:
        return ""
    if "." in spelled:
        values = model.index.assigned_anywhere(spelled)
    else:
        values = model.index.assignments.get(function_holding(model, setting), {}).get(spelled, [])
    if len(values) == 1 and isinstance(values[0], cst.BaseExpression) and _setting_name(values[0]) in model.ships_at_one:
        return latent_note(model.code(values[0]))
    return ""


def _better(report: Report, site: CSTNode, applies: bool, previous: tuple[Report, bool, CSTNode, str]) -> bool:
    """Whether a report should replace ``previous`` for the same event: shown at the event itself where the other
    stands at a call, else with a fix that applies where the other's does not."""
    previous_report, previous_applies, previous_site, _ = previous
    at_event, previous_at_event = site is _reported(report), previous_site is _reported(previous_report)
    if at_event != previous_at_event:
        return at_event
    return applies and not previous_applies


def _reported(report: Report) -> CSTNode:
    """The node a report is about: its event's, or the one it names."""
    return report.event.node if report.event is not None else report.node


def report_site(model: LoopModel, report: Report) -> tuple[CSTNode, str]:
    """Where a finding is shown, and its message: where the user changes the code.

    An event inlined from a helper (``self._clip_gradients()`` called in the
    loop) whose problem lies between the helper and its caller is reported at
    the first call of its chain that the events it is judged against
    (``report.against``) were not inlined through: the call that must move or
    change. The message then names the line inside the helper. It stays
    inside the helper when the problem is there: when the others went through
    the same calls (the clip and the step it precedes both in the helper), or
    when the helper is more than the event, a step function that also
    backpropagates or steps (moving its call would move those too), and, for a
    backward, unless the helper backpropagates a loss its caller hands it (a
    backward is changed where its loss is made).
    """
    event = report.event
    if event is None or not event.call_chain or report.node is not event.node:
        return report.node, report.message
    chain = event.call_chain
    shared = 0
    if report.against:
        shared = min(_common_calls(chain, other.call_chain) for other in report.against)
    if shared == len(chain) or not _moves_with_its_call(model, event, chain[shared]):
        return report.node, report.message
    call = chain[shared]
    return call, f"{report.message} (line {model.line(report.node)}, in `{model.code(call.func)}`, which this call runs)"


def _common_calls(chain: tuple[cst.Call, ...], other: tuple[cst.Call, ...]) -> int:
    """How many calls two call chains share from their start."""
    common = 0
    for mine, theirs in zip(chain, other):
        if mine is not theirs:
            break
        common += 1
    return common


def _moves_with_its_call(model: LoopModel, event: Event, call: cst.Call) -> bool:
    """Whether moving ``call`` moves the reported event and no other core of an iteration: the function it runs
    (read through its own root) holds no backward or step but the event, and a backward backpropagates a
    parameter (a loss the caller made)."""
    position = event.call_chain.index(call)
    inner = event.call_chain[position + 1] if position + 1 < len(event.call_chain) else event.node
    function = function_holding(model, inner)
    root = next((r for r in model.roots if r.node is function), None) if function is not None else None
    if root is None:
        return False
    for other in root.events:
        if other.kind in (EventKind.BACKWARD, EventKind.STEP) and other.node is not event.node:
            return False
    if event.kind is EventKind.BACKWARD:
        helper = function_holding(model, event.node)
        loss = event.loss.value if type(event.loss) is cst.Name else None
        return helper is not None and loss is not None and loss in parameter_names(helper)
    return True


def lint_text(
    text: str, path: str = "<string>", config: Config | None = None, *, prefilter: bool = True, context: Iterable[str] | None = None
) -> FileResult:
    """Check source text as if it were the file ``path``; ``context`` as for :func:`check_module`."""
    config = config or Config()
    rules = config.rules_for(path, ALL_RULES)
    tree = None
    if prefilter:
        rules = rules_that_might_fire(text, rules)
        if rules:
            with cyclic_gc_paused():
                tree = python_tree(text)
            if tree is not None:  # narrowed to the calls the module really makes
                rules = rules_that_might_fire(text, rules, called_names(tree))
    if not rules:
        return FileResult(path)
    return parse_and_check(text, path, rules, context, tree)


def lint_file(path: str, config: Config | None = None, *, prefilter: bool = True) -> FileResult:
    """Read and check one file; an unreadable or unparsable file gives a result with ``error`` set."""
    try:
        source = read_source(path)
    except SourceError as error:
        return FileResult(path, error=str(error))
    return lint_text(source.text, path, config, prefilter=prefilter)


def lint_paths(paths: Iterable[str], config: Config | None = None, *, prefilter: bool = True) -> list[FileResult]:
    """Check every file under ``paths``; results come sorted by path, unreadable paths as errors."""
    from gradlint.discovery import Unreadable, discover

    config = config or Config()
    results = []
    for item in discover(paths, config):
        if isinstance(item, Unreadable):
            results.append(FileResult(item.path, error=item.reason))
        else:
            results.append(lint_file(item, config, prefilter=prefilter))
    return sorted(results, key=lambda r: r.path)
