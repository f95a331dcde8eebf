"""Find the user's file and line for an event recorded deep inside torch."""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from types import CodeType, FrameType
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


class _CodeInfo(NamedTuple):
    code: object  # held so that its id is not reused while cached
    path: str | None  # the user's absolute path, or None for plumbing
    lines: dict[int, int]  # instruction offset -> line


# id(code object) -> what the walk needs about it. Keyed by id, not by the code
# object: hashing a code object hashes its constants every time (about 9 us for
# a script's module-level code, where training loops often live).
_code_info: dict[int, _CodeInfo] = {}


def _info(code: CodeType) -> _CodeInfo:
    filename = code.co_filename
    info = _CodeInfo(code, os.path.abspath(filename) if _is_user(filename) else None, {})
    if len(_code_info) > 65536:  # code compiled anew in a loop (exec): do not grow without bound
        _code_info.clear()
    _code_info[id(code)] = info
    return info


def user_site(frame: FrameType | None = None) -> Site:
    """The innermost frame outside torch, this package and the stdlib plumbing that runs scripts.

    The search starts at ``frame`` (default: the caller's); a wrapper passes
    its own caller's frame so that its frames are not walked again.
    """
    if frame is None:
        frame = sys._getframe(1)
    known = _code_info
    while frame is not None:
        code = frame.f_code
        info = known.get(id(code))
        if info is None:
            info = _info(code)
        if info.path is not None:
            # CPython 3.11 computes f_lineno by scanning the code's line table from its start.
            line = info.lines.get(frame.f_lasti)
            if line is None:
                line = info.lines[frame.f_lasti] = frame.f_lineno
            return Site(info.path, line)
        frame = frame.f_back
    return Site("<unknown>", 0)
