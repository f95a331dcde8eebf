"""Checking a whole tree: files read once, the cache and the prefilter first, then parsing on every core.

The main process walks the paths, reads each file, answers from the cache
or the prefilter where it can, and hands only the files that must be parsed
to a pool of worker processes, largest first. Results always come back
sorted by path, whatever the number of jobs.
"""

from __future__ import annotations

import ast
import dataclasses
import multiprocessing
import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from gradlint import catalogue
from gradlint.cache import Cache
from gradlint.config import Config
from gradlint.discovery import Unreadable, discover
from gradlint.findings import FileResult
from gradlint.gc_pause import cyclic_gc_paused
from gradlint.prefilter import called_names, rules_that_might_fire, text_in_context
from gradlint.tokens import HANDS_AN_OPTIMIZER, RELEASE_SPELLINGS
from gradlint.named import COMPILED, named_files, syntax_error
from gradlint.project_index import FileCalls, ProjectIndex, join_scope, python_tree, scan_calls
from gradlint.source import SourceError, decode, read_bytes


# Below this much source text to parse, starting worker processes costs more than it saves.
MIN_PARALLEL_CHARS = 200_000
# Python's trees of the files to check, kept from the first pass for the second, up to this much
# source text in all (a tree takes about 50 bytes per character of source).
KEPT_TREE_CHARS = 4_000_000


def default_jobs() -> int:
    """The number of cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclasses.dataclass
class _File:
    """One file of the run between the two passes: what is known of it so far."""

    path: str
    rules: list
    key: str | None  # the cache key of its content
    text: str | None = None
    calls: FileCalls = FileCalls()
    tree: ast.Module | None = None  # Python's tree of the text, kept when the file will be checked
    firing: list | None = None  # the rules the prefilter lets check the text, once read
    scanned: bool = True  # whether ``calls`` holds what its loops call (else it is not known yet)


def run(
    paths: Iterable[str],
    config: Config,
    *,
    jobs: int | None = None,
    cache: Cache | None = None,
    prefilter: bool = True,
    contexts: dict[str, tuple[str, ...]] | None = None,
) -> list[FileResult]:
    """Check every file under ``paths`` with up to ``jobs`` processes; results sorted by path.

    Two passes: the first notes what each file's loops call (from the cache
    when its content is unchanged), the second checks each file knowing which
    of its functions the run calls once per batch (:mod:`gradlint.project_index`).
    A file's cached result is keyed by its content and by that knowledge;
    ``contexts``, when given, receives it per path (the fixer reads it).
    """
    paths = list(paths)
    named = named_files(paths)
    results: list[FileResult] = []
    files: list[_File] = []
    kept_chars = 0
    for item in discover(paths, config):
        if isinstance(item, Unreadable):
            results.append(FileResult(item.path, error=item.reason))
            continue
        rules = config.rules_for(item, catalogue.ALL_RULES)  # their traits and tokens: no rule is imported yet
        codes = tuple(rule.code for rule in rules)
        cache_codes = (*codes, COMPILED) if item in named else codes  # a named file's answer includes its compile
        stat = _stat(item) if cache is not None else None
        known = cache.known_key(item, stat, cache_codes, prefilter) if stat is not None else None
        calls = cache.calls(known) if known is not None else None
        if calls is not None:  # an unchanged file is answered without reading it
            cache.remember_file(item, stat, known, cache_codes, prefilter)
            files.append(_File(item, rules, known, calls=calls))
            continue
        try:
            data = read_bytes(item)
        except SourceError as error:
            results.append(FileResult(item, error=str(error)))
            continue
        key = cache.key(data, cache_codes, prefilter) if cache is not None else None
        if stat is not None:
            cache.remember_file(item, stat, key, cache_codes, prefilter)
        try:
            text = decode(data).text
        except SourceError as error:
            result = FileResult(item, error=str(error))
            results.append(result)
            if cache is not None:
                cache.put(key, result)
            continue
        firing = rules_that_might_fire(text, rules) if prefilter else rules
        if not firing and not _may_decide_for_others(text):
            # never checked: its calls matter only if a file of its unit is checked (scanned below)
            files.append(_File(item, rules, key, text, firing=firing, scanned=False))
            continue
        with cyclic_gc_paused():  # Python's tree holds no cycles either
            tree = python_tree(text)
            if tree is not None:
                if prefilter:  # narrowed to the calls the module really makes
                    firing = rules_that_might_fire(text, firing, called_names(tree))
                calls = scan_calls(text, tree)
            else:
                calls = FileCalls()
        if cache is not None:
            cache.put_calls(key, calls)
        if tree is None or not firing or kept_chars + len(text) > KEPT_TREE_CHARS:
            tree = None  # the check parses it again if it needs it
        else:
            kept_chars += len(text)
        files.append(_File(item, rules, key, text, calls, tree.tree if tree is not None else None, firing))
    _scan_where_checked(files, cache)
    project = ProjectIndex((f.path, f.calls) for f in files)
    pending: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = []  # path, text, rule codes, context
    pending_keys: list[str | None] = []
    pending_trees: list[ast.Module | None] = []
    for file in files:
        context = project.context_of(file.path, file.calls)
        if contexts is not None:
            contexts[file.path] = context
        key = cache.with_context(file.key, context) if cache is not None else None
        cached = cache.get(key, file.path) if cache is not None else None
        if cached is not None:
            results.append(cached)
            file.tree = None
            continue
        text, firing = file.text, file.firing
        if text is None:  # known unchanged, but its result under this context is not cached
            try:
                text = decode(read_bytes(file.path)).text
            except SourceError as error:
                results.append(FileResult(file.path, error=str(error)))
                continue
        if firing is None:
            firing = rules_that_might_fire(text, file.rules) if prefilter else file.rules
        if prefilter and (read_as := text_in_context(text, context)) is not text:
            firing = rules_that_might_fire(read_as, file.rules)  # what another file of the run stands in for
        if firing:  # checked with the rules whose tokens it holds: the others cannot fire
            pending.append((file.path, text, tuple(rule.code for rule in firing), context))
            pending_keys.append(key)
            pending_trees.append(file.tree)
            file.tree = None
            continue
        # Not parsed: a file named on the command line is still compiled.
        result = FileResult(file.path, error=syntax_error(text) if file.path in named else None)
        results.append(result)
        if cache is not None:
            cache.put(key, result)
    for key, result in zip(pending_keys, _check_all(pending, jobs or default_jobs(), pending_trees)):
        results.append(result)
        if cache is not None:
            cache.put(key, result)
    if cache is not None:
        cache.save()
    return sorted(results, key=lambda r: r.path)


def _scan_where_checked(files: list[_File], cache: Cache | None) -> None:
    """Note what the loops of the unscanned files call, in every unit that holds a file which may be checked.

    A file the prefilter rejects is never checked, but a loop of it may call a
    function of a checked file of its unit (:mod:`gradlint.project_index`).
    Where no file of a package (or, outside packages, of a folder of scripts)
    can be checked, nothing its files call can change a finding, and Python
    never parses them. A file known only from the cache counts as one that may be checked.
    """
    scopes: dict[str, str | None] = {}
    # A file that sets gradient release up for others, runs their callbacks on scaled gradients, hands an optimizer
    # to a call (a backward helper of another file) or defines a backward helper may make a file of its unit that
    # fires nothing by its own text a checked one.
    checked = {
        join_scope(f.path, scopes) for f in files
        if f.scanned and (
            f.text is None or f.firing or f.calls.releases or f.calls.scaled_dispatch or f.calls.hands or f.calls.backward_helpers
        )
    }
    _scan_scopes(files, checked, scopes, cache)
    # Then the folders beside them that their files import: what a function there returns or backpropagates counts.
    beside = _imported_beside([f for f in files if f.scanned and join_scope(f.path, scopes) in checked], scopes) - checked
    _scan_scopes(files, beside, scopes, cache)


def _scan_scopes(files: list[_File], wanted: set[str], scopes: dict[str, str | None], cache: Cache | None) -> None:
    """Note what the loops call for each file not yet scanned whose unit is one of ``wanted``."""
    for file in files:
        if file.scanned or join_scope(file.path, scopes) not in wanted:
            continue
        with cyclic_gc_paused():
            file.calls = scan_calls(file.text)
        file.scanned = True
        if cache is not None:
            cache.put_calls(file.key, file.calls)


def _may_decide_for_others(text: str) -> bool:
    """Whether a file no rule fires on may still decide what another file of its run does: it spells a gradient-release
    set-up (a function of it may set release up for its callers), a scaled backward (it may run another file's
    callbacks on scaled gradients), a call handed an optimizer (a backward helper of another file may
    backpropagate for it: GL302 then reads it in context, :func:`gradlint.prefilter.text_in_context`), or a backward
    (a function of it may backpropagate for a loop of another file). The project index reads such a file
    (:mod:`gradlint.scaler_release_facts`)."""
    return (
        RELEASE_SPELLINGS.search(text) is not None
        or ".backward(" in text
        or (".scale(" in text and "backward" in text)
        or HANDS_AN_OPTIMIZER.pattern.search(text) is not None
    )


def _imported_beside(files: list[_File], scopes: dict[str, str | None]) -> set[str]:
    """The scopes of the folders beside these files that they import (``from utils.torch_utils import smart_DDP`` in a
    script beside the ``utils`` package): a function there may return the wrapped model they train, or backpropagate
    for them (:meth:`gradlint.project_index.ProjectIndex.context_of`)."""
    found = set()
    for file in files:
        folder = os.path.dirname(file.path)
        for name in file.calls.imports:
            beside = os.path.join(folder, name)
            if os.path.isdir(beside):
                found.add(join_scope(os.path.join(beside, "__init__.py"), scopes))
    return found


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def check_text(
    path: str, text: str, codes: tuple[str, ...], context: tuple[str, ...] = (), python_tree: ast.Module | None = None
) -> FileResult:
    """Parse and check one file's text with the rules named by ``codes``.

    ``context`` as for :func:`build_model`; ``python_tree``, Python's tree of ``text`` if parsed already.
    LibCST and the rules are imported here, by the first file that needs them.
    """
    from gradlint.linter import parse_and_check
    from gradlint.rules import RULES_BY_CODE

    return parse_and_check(text, path, [RULES_BY_CODE[code] for code in codes], context, python_tree)


def _check_one(task: tuple[str, str, tuple[str, ...], tuple[str, ...]]) -> FileResult:
    path, text, codes, context = task
    return check_text(path, text, codes, context)


def _check_all(
    tasks: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]], jobs: int, trees: list[ast.Module | None]
) -> list[FileResult]:
    """Results in the order of ``tasks``: in this process for one job or one file, else in a process pool.

    ``trees`` holds Python's tree of each task's text where the first pass kept it; only this process uses them.
    """
    jobs = min(jobs, len(tasks))
    if jobs <= 1 or sum(len(task[1]) for task in tasks) < MIN_PARALLEL_CHARS:
        results = []
        for index, task in enumerate(tasks):
            results.append(check_text(*task, python_tree=trees[index]))
            trees[index] = None  # freed as soon as used
        return results
    trees.clear()
    # Loaded here, once: forked workers then start with LibCST and the rules instead of each importing them.
    import gradlint.linter  # noqa: F401
    import gradlint.rules  # noqa: F401
    # Largest first, so that no worker is left with a big file at the end.
    order = sorted(range(len(tasks)), key=lambda i: -len(tasks[i][1]))
    results: list[FileResult | None] = [None] * len(tasks)
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    try:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            for index, result in zip(order, pool.map(_check_one, [tasks[i] for i in order], chunksize=1)):
                results[index] = result
    except BrokenProcessPool:  # a worker died (out of memory, a crash in the parser): finish here
        pass
    return [result if result is not None else _check_one(task) for task, result in zip(tasks, results)]
