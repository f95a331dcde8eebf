"""Functions the isolation tests run in a child process: importable by name (test modules are not)."""

from __future__ import annotations

import os
import signal


def exit_hard(code: int, post) -> None:
    os._exit(code)


def kill_self(post) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def post_and_return(value: int, post) -> int:
    post(("step", value))
    return value * 2
