"""Configuration: ``[tool.gradlint]`` in the nearest ``pyproject.toml``, overridden by the command line.

Recognised keys::

    [tool.gradlint]
    select = ["GL0", "GL101"]        # rule codes or prefixes; default: every rule on by default
    ignore = ["GL005"]               # codes or prefixes to turn off
    exclude = ["legacy/**", "*_pb2.py"]   # globs, relative to this file, skipped when walking folders
    extend-exclude = ["generated/**"]     # globs added to the defaults (``exclude`` replaces them)
    force-exclude = true             # excludes apply to paths named on the command line too
    per-file-ignores = { "tests/**" = ["GL001"] }
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import re
import sys
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gradlint.rule import Rule

DEFAULT_EXCLUDE = (
    ".git",
    ".hg",
    ".svn",
    ".venv",
    "venv",
    ".tox",
    ".nox",
    ".eggs",
    "__pycache__",
    "node_modules",
    "build",
    "dist",
    "site-packages",
    ".gradlint_cache",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
)

_KNOWN_KEYS = {"select", "ignore", "exclude", "extend-exclude", "force-exclude", "per-file-ignores"}


class ConfigError(Exception):
    """The configuration or the command line names something that does not exist."""


@dataclasses.dataclass(frozen=True)
class Config:
    """The effective settings for one run."""

    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    root: Path = dataclasses.field(default_factory=Path.cwd)
    source: Path | None = None  # the pyproject.toml the settings came from
    # Whether ``exclude`` applies to paths named on the command line too (as
    # pre-commit names every staged file), not only to paths met in a walk.
    force_exclude: bool = False

    def rules_for(self, path: str, all_rules: Iterable[type[Rule]]) -> list[type[Rule]]:
        """The rules that apply to ``path``: selected, not ignored, not ignored for this file."""
        ignored = list(self.ignore)
        if self.per_file_ignores:
            relative = self.relative(path)
            for pattern, codes in self.per_file_ignores:
                if _glob_match(relative, pattern):
                    ignored.extend(codes)
        return list(_choose(self.select, tuple(ignored), tuple(all_rules)))

    def is_excluded(self, path: Path) -> bool:
        """Whether a path met while walking a folder (or named, with ``force_exclude``) is skipped.

        A path is excluded when one of its parts, or its path relative to the
        configuration's folder, matches a pattern.
        """
        relative = self.relative(str(path))
        parts, globs, bases = _exclusion(self.exclude)
        if "/" in relative.lstrip("/") or relative.startswith("/"):
            names = PurePosixPath(relative).parts
        else:
            names = (relative,)
        return any(parts(name) for name in names) or globs(relative) is not None or relative.startswith(bases)

    def relative(self, path: str) -> str:
        """``path`` relative to the configuration's folder, in forward slashes, when it lies below it."""
        absolute = Path(path).absolute()
        try:
            return absolute.relative_to(self.root.absolute()).as_posix()
        except ValueError:
            return absolute.as_posix()

    def fingerprint(self) -> str:
        """A stable text of everything that changes what a file's findings are (for caches)."""
        return repr((self.select, self.ignore, self.per_file_ignores))


@functools.lru_cache(maxsize=64)
def _choose(select: tuple[str, ...] | None, ignored: tuple[str, ...], all_rules: tuple[type[Rule], ...]) -> tuple[type[Rule], ...]:
    chosen = []
    for rule in all_rules:
        if select is None:
            if not rule.enabled_by_default:
                continue
        elif not _matches(rule.code, select if rule.enabled_by_default else narrow_selectors(select)):
            continue
        if _matches(rule.code, ignored):
            continue
        chosen.append(rule)
    return tuple(chosen)


@functools.lru_cache(maxsize=16)
def _exclusion(patterns: tuple[str, ...]):
    """Exclude patterns compiled once: a cached test of one path part, a glob test of a relative path, folder prefixes.

    The same answers as ``fnmatchcase`` on each part and ``_glob_match`` on the relative path, pattern by pattern.
    """
    part_regex = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)) if patterns else None
    stripped = [p.rstrip("/") for p in patterns]
    globs = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in stripped)).match if patterns else (lambda _: None)
    bases = tuple((p[:-3] if p.endswith("/**") else p) + "/" for p in stripped)

    @functools.lru_cache(maxsize=4096)
    def part(name: str) -> bool:
        return part_regex is not None and part_regex.match(name) is not None

    return part, globs, bases


# The family prefix every code shares. Selecting it means "gradlint's default
# rules", as in flake8, where a project that sets ``select`` must list ``GL``
# to see gradlint at all.
FAMILY_PREFIX = "GL"


def narrow_selectors(select: Iterable[str]) -> tuple[str, ...]:
    """The selectors that may turn on a rule that is off by default: ``ALL`` or a code longer than ``GL``.

    ``GL`` alone selects the default rules, on the command line, in
    ``[tool.gradlint]`` and in flake8 alike; ``GL2`` or ``GL204`` name the
    opportunity rules more precisely and turn them on.
    """
    return tuple(s for s in select if s == "ALL" or len(s) > len(FAMILY_PREFIX))


def _matches(code: str, patterns: Iterable[str]) -> bool:
    return any(p == "ALL" or code.startswith(p) for p in patterns)


def _glob_match(relative: str, pattern: str) -> bool:
    pattern = pattern.rstrip("/")
    if fnmatch.fnmatchcase(relative, pattern):
        return True
    # "dir/**" and "dir" both cover everything below dir.
    base = pattern[:-3] if pattern.endswith("/**") else pattern
    return relative.startswith(base + "/")


def find_pyproject(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` with a ``[tool.gradlint]`` table, from ``start`` upwards."""
    start = start.absolute()
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                data = tomllib.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                continue
            if "gradlint" in data.get("tool", {}):
                return candidate
    return None


def load_config(pyproject: Path | None, known_codes: Iterable[str]) -> Config:
    """Read ``[tool.gradlint]`` from ``pyproject`` (or return the defaults when there is none)."""
    if pyproject is None:
        return Config()
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{pyproject}: cannot read: {error}") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{pyproject}: invalid TOML: {error}") from error
    table = data.get("tool", {}).get("gradlint", {})
    unknown = sorted(set(table) - _KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"{pyproject}: unknown key(s) in [tool.gradlint]: {', '.join(unknown)}")
    known = list(known_codes)
    select = _codes(table, "select", pyproject, known) if "select" in table else None
    ignore = _codes(table, "ignore", pyproject, known)
    exclude = tuple(_strings(table, "exclude", pyproject)) or DEFAULT_EXCLUDE
    exclude += tuple(_strings(table, "extend-exclude", pyproject))
    per_file = table.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise ConfigError(f"{pyproject}: per-file-ignores must be a table of glob = [codes]")
    per_file_ignores = tuple(
        (pattern, tuple(validate_codes(_as_list(codes, pyproject, "per-file-ignores"), known, f"{pyproject}: per-file-ignores")))
        for pattern, codes in per_file.items()
    )
    force_exclude = table.get("force-exclude", False)
    if not isinstance(force_exclude, bool):
        raise ConfigError(f"{pyproject}: force-exclude must be true or false")
    return Config(select, tuple(ignore), exclude, per_file_ignores, pyproject.parent, pyproject, force_exclude)


def validate_codes(codes: Iterable[str], known: Iterable[str], where: str) -> list[str]:
    """Codes or prefixes, upper-cased; each must name at least one known rule."""
    known = list(known)
    result = []
    for code in codes:
        code = code.strip().upper()
        if not code:
            continue
        if code != "ALL" and not any(k.startswith(code) for k in known):
            raise ConfigError(f"{where}: unknown rule code or prefix {code!r}")
        result.append(code)
    return result


def _codes(table: dict, key: str, pyproject: Path, known: list[str]) -> tuple[str, ...]:
    return tuple(validate_codes(_as_list(table.get(key, []), pyproject, key), known, f"{pyproject}: {key}"))


def _strings(table: dict, key: str, pyproject: Path) -> list[str]:
    return _as_list(table.get(key, []), pyproject, key)


def _as_list(value: object, pyproject: Path, key: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{pyproject}: {key} must be a list of strings")
    return value
