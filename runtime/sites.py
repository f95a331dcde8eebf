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


def user_site(skip: int = 1) -> Site:
    """The innermost frame outside torch, this package and the stdlib plumbing that runs scripts."""
    frame = sys._getframe(skip)
    while frame is not None:
        filename = frame.f_code.co_filename
        if _is_user(filename):
            return Site(os.path.abspath(filename), frame.f_lineno)
        frame = frame.f_back
    return Site("<unknown>", 0)
