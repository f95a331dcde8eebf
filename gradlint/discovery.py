"""Which files a run checks: the paths given, with folders walked for ``*.py`` files."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from gradlint.config import Config


@dataclasses.dataclass(frozen=True)
class Unreadable:
    """A path that could not be walked or does not exist, with the reason in one line."""

    path: str
    reason: str


def discover(paths: Iterable[str], config: Config) -> Iterator[str | Unreadable]:
    """Yield each file to check, in a stable sorted order, or an :class:`Unreadable` for a bad path.

    Files named explicitly are checked whatever their suffix, and even when
    excluded unless ``config.force_exclude`` is set; folders are walked for
    ``*.py`` files, skipping excluded paths, symlink loops and folders that
    cannot be listed.
    """
    for raw in paths:
        path = Path(raw)
        if config.force_exclude and config.is_excluded(path):
            continue
        if path.is_dir():
            yield from _walk(path, config)
        elif path.exists() or path.is_symlink():
            yield os.path.normpath(raw)
        else:
            yield Unreadable(os.path.normpath(raw), "no such file or directory")


def _walk(top: Path, config: Config) -> Iterator[str | Unreadable]:
    seen_dirs: set[tuple[int, int]] = set()
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            stat = folder.stat()
        except OSError as error:
            yield Unreadable(os.path.normpath(folder), f"cannot read: {error.strerror or error}")
            continue
        key = (stat.st_dev, stat.st_ino)
        if key in seen_dirs:  # a symlink loop, or a link back to a folder already walked
            continue
        seen_dirs.add(key)
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except PermissionError:
            yield Unreadable(os.path.normpath(folder), "cannot read: permission denied")
            continue
        except OSError as error:
            yield Unreadable(os.path.normpath(folder), f"cannot read: {error.strerror or error}")
            continue
        subfolders = []
        for entry in entries:
            entry_path = Path(entry.path)
            if config.is_excluded(entry_path):
                continue
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                subfolders.append(entry_path)
            elif entry.name.endswith(".py"):
                try:
                    entry.stat()
                except OSError as error:  # a dangling link or a link loop
                    yield Unreadable(os.path.normpath(entry.path), f"cannot read: {error.strerror or error}")
                    continue
                yield os.path.normpath(entry.path)
        # Depth first, in name order: the output order is stable from run to run.
        stack.extend(reversed(subfolders))
