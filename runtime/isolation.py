"""Call a function in a fresh child process: nothing of one run reaches the next.

``gradlint measure`` runs the user's script several times (each mode, metered
and timed). Run in one process, every run inherits what the previous ones
left: the script's helper modules and their caches (``sys.modules``), global
hooks, CUDA's caching allocator with its blocks and cuBLAS workspaces, and any
object that a traceback or a cache still holds. A child process per run starts
every run from the same state, and whatever survives a run dies with it.

Children are forked from a server process that has imported torch and this
package once (``multiprocessing``'s forkserver): a child starts in tens of
milliseconds instead of the second or more that importing torch takes. The
server never runs a kernel nor touches CUDA, so each child initialises its own
CUDA context and its own OpenMP threads. Where forkserver is not available
(Windows), children are spawned.

The child runs with the parent's current environment, working directory and
``sys.path`` (the server's may be older). It can post messages (progress) to
the parent while it runs.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
import traceback
from typing import Any, Callable

PRELOAD = ["gradlint.runtime.measure"]


class ChildDied(RuntimeError):
    """The child process ended without a result (a crash, a signal, the out-of-memory killer)."""


class ChildFailed(RuntimeError):
    """The function raised in the child and its exception could not be sent back as it was."""


def _context() -> Any:
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)  # only takes effect before the server starts
        return context
    return multiprocessing.get_context("spawn")


def _child_main(connection: Any, where: tuple[str, str], args: tuple, state: dict[str, Any]) -> None:
    os.environ.clear()
    os.environ.update(state["environ"])
    os.chdir(state["cwd"])
    sys.path[:] = state["path"]
    try:
        # imported here, once sys.path is the parent's: the server's may not find the function's module
        function = getattr(importlib.import_module(where[0]), where[1])
        result = function(*args, lambda message: connection.send(("message", message)))
    except BaseException as exc:  # every failure goes back to the parent, which decides
        try:
            connection.send(("error", exc))
        except Exception:  # not picklable: send its text
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            connection.send(("error", ChildFailed(f"{type(exc).__name__}: {exc}\n{text}")))
    else:
        connection.send(("result", result))
    finally:
        connection.close()


def call_in_child(function: Callable, *args: Any, on_message: Callable[[Any], None] = lambda m: None) -> Any:
    """``function(*args, post)`` in a fresh process; its return value, or its exception raised here.

    ``function`` must be importable (a module-level function) and ``args`` and
    the result picklable. ``post(message)`` in the child calls
    ``on_message(message)`` here. Raises :class:`ChildDied` when the child
    ends without an answer.
    """
    context = _context()
    receiver, sender = context.Pipe(duplex=False)
    state = {"environ": dict(os.environ), "cwd": os.getcwd(), "path": list(sys.path)}
    # not a daemon: the script may start processes of its own (DataLoader workers)
    where = (function.__module__, function.__qualname__)
    process = context.Process(target=_child_main, args=(sender, where, args, state))
    process.start()
    sender.close()
    try:
        while True:
            try:
                kind, value = receiver.recv()
            except EOFError:
                process.join()
                raise ChildDied(_death(process.exitcode)) from None
            if kind == "message":
                on_message(value)
            elif kind == "result":
                return value
            else:
                raise value
    finally:
        receiver.close()
        process.join(timeout=30)
        if process.is_alive():  # interrupted (Ctrl-C) while the child still ran
            process.kill()
            process.join()


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        import signal

        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (often the out-of-memory killer)" if name == "SIGKILL" else ""
        return f"the run's process was killed by {name}{hint}"
    return f"the run's process exited with status {exitcode} without a result"
