"""Find the user's file and line for an event recorded deep inside torch."""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from typing import NamedTuple

import torch

# torch, this package and the standard library (runpy, contextlib, functools)
# are plumbing between the user's statement and the hook that records it.
_SKIP_DIRS = tuple(
    os.path.realpath(d) + os.sep
    for d in (
        os.path.dirname(torch.__file__),
        os.path.dirname(os.path.abspath(__file__)),
        sysconfig.get_paths()["stdlib"],
    )
)


class Site(NamedTuple):
    """A position in the user's code (``line`` is 1-based)."""

    path: str
    line: int

    def __str__(self) -> str:
        return f"{os.path.basename(self.path)}:{self.line}"


@functools.lru_cache(maxsize=4096)
def _is_user(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    return not os.path.realpath(filename).startswith(_SKIP_DIRS)


# code object -> the user's absolute path for its file, or None for plumbing.
# Keyed by code object so that each frame of the walk costs one dict lookup;
# code objects live as long as their functions, and a loop has few of them.
_user_path_of_code: dict = {}
_UNSEEN = object()


def _user_path(code: object) -> str | None:
    filename = code.co_filename  # type: ignore[attr-defined]
    path = os.path.abspath(filename) if _is_user(filename) else None
    if len(_user_path_of_code) > 65536:  # code compiled anew in a loop (exec): do not grow without bound
        _user_path_of_code.clear()
    _user_path_of_code[code] = path
    return path


# (code object, instruction offset) -> line: CPython 3.11 computes ``f_lineno``
# by scanning the code's line table from its start, on every call.
_line_at: dict = {}


def user_site(skip: int = 1) -> Site:
    """The innermost frame outside torch, this package and the stdlib plumbing that runs scripts."""
    frame = sys._getframe(skip)
    known = _user_path_of_code
    while frame is not None:
        code = frame.f_code
        path = known.get(code, _UNSEEN)
        if path is _UNSEEN:
            path = _user_path(code)
        if path is not None:
            where = (code, frame.f_lasti)
            line = _line_at.get(where)
            if line is None:
                if len(_line_at) > 65536:
                    _line_at.clear()
                line = _line_at[where] = frame.f_lineno
            return Site(path, line)
        frame = frame.f_back
    return Site("<unknown>", 0)
