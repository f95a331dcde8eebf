"""Checking a whole tree: files read once, the cache and the prefilter first, then parsing on every core.

The main process walks the paths, reads each file, answers from the cache
or the prefilter where it can, and hands only the files that must be parsed
to a pool of worker processes, largest first. Results always come back
sorted by path, whatever the number of jobs.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from gradlint.cache import Cache
from gradlint.config import Config
from gradlint.discovery import Unreadable, discover
from gradlint.findings import FileResult
from gradlint.linter import might_fire, parse_and_check
from gradlint.named import COMPILED, named_files, syntax_error
from gradlint.rules import RULES_BY_CODE, ALL_RULES
from gradlint.source import SourceError, decode, read_bytes


# Below this much source text to parse, starting worker processes costs more than it saves.
MIN_PARALLEL_CHARS = 200_000


def default_jobs() -> int:
    """The number of cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def run(paths: Iterable[str], config: Config, *, jobs: int | None = None, cache: Cache | None = None, prefilter: bool = True) -> list[FileResult]:
    """Check every file under ``paths`` with up to ``jobs`` processes; results sorted by path."""
    paths = list(paths)
    named = named_files(paths)
    results: list[FileResult] = []
    pending: list[tuple[str, str, tuple[str, ...], str | None]] = []  # path, text, rule codes, cache key
    for item in discover(paths, config):
        if isinstance(item, Unreadable):
            results.append(FileResult(item.path, error=item.reason))
            continue
        rules = config.rules_for(item, ALL_RULES)
        codes = tuple(rule.code for rule in rules)
        cache_codes = (*codes, COMPILED) if item in named else codes
        stat = _stat(item) if cache is not None else None
        if stat is not None:  # an unchanged file is answered without reading it
            known = cache.known_key(item, stat, cache_codes, prefilter)
            cached = cache.get(known, item) if known is not None else None
            if cached is not None:
                cache.remember_file(item, stat, known, cache_codes, prefilter)
                results.append(cached)
                continue
        try:
            data = read_bytes(item)
        except SourceError as error:
            results.append(FileResult(item, error=str(error)))
            continue
        key = cache.key(data, cache_codes, prefilter) if cache is not None else None
        if stat is not None:
            cache.remember_file(item, stat, key, cache_codes, prefilter)
        cached = cache.get(key, item) if cache is not None else None
        if cached is not None:
            results.append(cached)
            continue
        try:
            text = decode(data).text
        except SourceError as error:
            result = FileResult(item, error=str(error))
        else:
            if rules and (not prefilter or might_fire(text, rules)):
                pending.append((item, text, codes, key))
                continue
            # Not parsed: a file named on the command line is still compiled.
            result = FileResult(item, error=syntax_error(text) if item in named else None)
        results.append(result)
        if cache is not None:
            cache.put(key, result)
    for (path, _, _, key), result in zip(pending, _check_all(pending, jobs or default_jobs())):
        results.append(result)
        if cache is not None:
            cache.put(key, result)
    if cache is not None:
        cache.save()
    return sorted(results, key=lambda r: r.path)


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def check_text(path: str, text: str, codes: tuple[str, ...]) -> FileResult:
    """Parse and check one file's text with the rules named by ``codes``."""
    return parse_and_check(text, path, [RULES_BY_CODE[code] for code in codes])


def _check_one(task: tuple[str, str, tuple[str, ...], str | None]) -> FileResult:
    path, text, codes, _ = task
    return check_text(path, text, codes)


def _check_all(tasks: list[tuple[str, str, tuple[str, ...], str | None]], jobs: int) -> list[FileResult]:
    """Results in the order of ``tasks``: in this process for one job or one file, else in a process pool."""
    jobs = min(jobs, len(tasks))
    if jobs <= 1 or sum(len(task[1]) for task in tasks) < MIN_PARALLEL_CHARS:
        return [_check_one(task) for task in tasks]
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
