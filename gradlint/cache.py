"""The result cache: a file whose content, rules and gradlint are unchanged is not checked again.

An entry's key is a hash of the file's bytes, the codes of the rules that
apply to it (which is what ``select``, ``ignore`` and
``per-file-ignores`` decide) and whether the prefilter ran, and, when other
files of the run call some of its functions once per batch, the names of
those functions (:meth:`Cache.with_context`): a file's findings then depend
on the other files, and a change there that changes those names reads it
again. What each file's loops call is cached too, by its content, so an
unchanged tree is still not read. Each cache file
belongs to one gradlint: its name is a hash of the version and of the
installed source files of gradlint itself, so a changed rule never reads an
old answer. Entries live in one JSON file under ``.gradlint_cache/``, read
once per run and replaced atomically at the end; a cache that cannot be read
or written is treated as empty and the run goes on.

So that an unchanged tree is not even read again, the cache also remembers
each file's size and modification time with the key of its content; a file
whose size and time still match is taken to hold that content. A file
modified within the last two seconds is never remembered that way (as git
does with its index), so two writes within one tick of the file system's
clock cannot hide a change.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path

from gradlint import __version__
from gradlint.findings import FileResult, Finding, FixKind, Severity
from gradlint.project_index import FileCalls

CACHE_DIR_NAME = ".gradlint_cache"
_RACY_NS = 2_000_000_000  # files younger than this are always read
_CACHEDIR_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# This file marks a cache folder made by gradlint.\n"


def code_fingerprint() -> str:
    """A hash of the gradlint version and of its own installed source files (names, sizes, times)."""
    import gradlint

    rules = importlib.util.find_spec("gradlint.rules")  # found, not imported: the rules load only when a file is parsed
    digest = hashlib.blake2b(__version__.encode(), digest_size=16)
    for folder in sorted({Path(gradlint.__file__).parent, Path(rules.origin).parent}):
        for top, dirs, files in os.walk(folder):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    stat = os.stat(os.path.join(top, name))
                    digest.update(f"{top}/{name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


class Cache:
    """Findings per file content, loaded from and saved to one folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._file = self.folder / f"results-{code_fingerprint()}.json"
        loaded = self._load()
        self._old: dict[str, list] = loaded.get("results", {})
        self._old_files: dict[str, list] = loaded.get("files", {})
        self._old_calls: dict[str, list] = loaded.get("calls", {})
        self._used: dict[str, list] = {}
        self._files: dict[str, list] = {}
        self._calls: dict[str, list] = {}
        self.hits = 0

    def known_key(self, path: str, stat: os.stat_result, codes: tuple[str, ...], prefilter: bool) -> str | None:
        """The key of ``path``'s content, when its size and modification time say it has not changed."""
        known = self._old_files.get(os.path.abspath(path))
        if known is None or known[:2] != [stat.st_size, stat.st_mtime_ns] or known[3:] != [",".join(codes), prefilter]:
            return None
        return known[2]

    def remember_file(self, path: str, stat: os.stat_result, key: str, codes: tuple[str, ...], prefilter: bool) -> None:
        """Note that ``path``, at this size and time, holds the content of ``key``."""
        if time.time_ns() - stat.st_mtime_ns > _RACY_NS:
            self._files[os.path.abspath(path)] = [stat.st_size, stat.st_mtime_ns, key, ",".join(codes), prefilter]

    def key(self, data: bytes, codes: tuple[str, ...], prefilter: bool) -> str:
        """The entry key of one file's bytes checked under ``codes`` (the path only names the findings)."""
        digest = hashlib.blake2b(data, digest_size=20)
        digest.update(f"\0{','.join(codes)}\0{prefilter}".encode())
        return digest.hexdigest()

    @staticmethod
    def with_context(key: str, context: tuple[str, ...]) -> str:
        """The key of a file's result: its content key, and the names of its functions the run calls per batch."""
        if not context:
            return key
        digest = hashlib.blake2b(key.encode(), digest_size=20)
        digest.update(("\0" + "\0".join(context)).encode())
        return digest.hexdigest()

    def calls(self, key: str) -> FileCalls | None:
        """What the loops of the content of ``key`` call (:func:`gradlint.project_index.scan_calls`), if noted."""
        entry = self._calls.get(key) or self._old_calls.get(key)
        if entry is None:
            return None
        try:
            calls = FileCalls.from_json(entry)
        except (TypeError, ValueError):
            return None
        self._calls[key] = entry
        return calls

    def put_calls(self, key: str, calls: FileCalls) -> None:
        """Note what the loops of the content of ``key`` call."""
        self._calls[key] = calls.to_json()

    def get(self, key: str, path: str) -> FileResult | None:
        """The cached result for ``key``, or None."""
        entry = self._used.get(key) or self._old.get(key)
        if entry is None:
            return None
        try:
            result = _decode(entry, path)
        except (TypeError, ValueError, KeyError):
            return None
        self._used[key] = entry
        self.hits += 1
        return result

    def put(self, key: str, result: FileResult) -> None:
        """Remember ``result`` under ``key``."""
        self._used[key] = _encode(result)

    def save(self) -> None:
        """Write the entries of this run (and older ones, while the file stays small) atomically."""
        entries = dict(self._old)
        entries.update(self._used)
        files = dict(self._old_files)
        files.update(self._files)
        calls = dict(self._old_calls)
        calls.update(self._calls)
        if len(entries) > 2 * len(self._used) + 1000:  # mostly stale: keep what this run used
            entries, files, calls = dict(self._used), dict(self._files), dict(self._calls)
        if entries == self._old and files == self._old_files and calls == self._old_calls:
            return
        try:
            self._prepare_folder()
            handle, temporary = tempfile.mkstemp(dir=self.folder, prefix=".results-", suffix=".tmp")
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump({"results": entries, "files": files, "calls": calls}, out, separators=(",", ":"))
            os.replace(temporary, self._file)
            for stale in self.folder.glob("results-*.json"):  # other gradlint versions
                if stale != self._file:
                    stale.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only tree: the run still succeeds, it is only not cached

    def _load(self) -> dict[str, dict]:
        try:
            with open(self._file, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or not all(isinstance(data.get(k, {}), dict) for k in ("results", "files", "calls")):
            return {}
        return data

    def _prepare_folder(self) -> None:
        if self.folder.is_dir():
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / ".gitignore").write_text("# Made by gradlint.\n*\n", encoding="utf-8")
        (self.folder / "CACHEDIR.TAG").write_text(_CACHEDIR_TAG, encoding="utf-8")


def _encode(result: FileResult) -> list:
    findings = [
        [f.line, f.column, f.end_line, f.end_column, f.code, f.name, f.message, f.severity.value, f.fix.value if f.fix else None]
        for f in result.findings
    ]
    return [findings, result.error]


def _decode(entry: list, path: str) -> FileResult:
    findings, error = entry
    return FileResult(
        path,
        [
            Finding(path, line, column, end_line, end_column, code, name, message, Severity(severity), FixKind(fix) if fix else None)
            for line, column, end_line, end_column, code, name, message, severity, fix in findings
        ],
        error,
    )
