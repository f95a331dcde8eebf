"""Execute a training script the way ``python script.py ARGS`` would, inside this process."""

from __future__ import annotations

import dataclasses
import datetime
import io
import os
import runpy
import sys
import traceback
from typing import Callable, Iterable, Sequence

from gradlint.runtime.reached import MARKER, compile_watching

from gradlint.runtime.tracer import StopTraining

FINISHED = "finished"
STOPPED = "stopped"
EXITED = "exited"
RAISED = "raised"


@dataclasses.dataclass
class Outcome:
    """How the script ended: ``finished``, ``stopped`` (step budget spent), ``exited`` or ``raised``."""

    how: str
    detail: str = ""
    exc: BaseException | None = dataclasses.field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.how in (FINISHED, STOPPED) or (self.how == EXITED and self.detail in ("0", "None"))


def _one_line(exc: BaseException, script: str) -> str:
    """``RuntimeError: message (at train.py:12)``: the exception and the script line it came through."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f for f in reversed(frames) if f.filename == script), frames[-1] if frames else None)
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return f"{text} (at {os.path.basename(where.filename)}:{where.lineno})" if where else text


def _run_as_main(
    path: str, watch_lines: Iterable[int], reached: Callable[[int], None], source: str | None = None
) -> None:
    """``runpy.run_path(path, run_name="__main__")``, with marker calls in front of ``watch_lines``.

    ``source``: text run in place of the file's, under the file's name.
    """
    lines = list(watch_lines)
    if not lines and source is None:
        runpy.run_path(path, run_name="__main__")
        return
    if source is None:
        with io.open_code(path) as handle:
            text: bytes | str = handle.read()
    else:
        text = source
    code = compile_watching(text, path, lines) if lines else compile(text, path, "exec", dont_inherit=True)
    # the same steps as run_path for a plain file, with our code object
    runpy._run_module_code(code, {MARKER: reached}, "__main__", pkg_name="", script_name=path)  # type: ignore[attr-defined]


def run_script(
    path: str,
    args: Sequence[str] = (),
    watch_lines: Iterable[int] = (),
    reached: Callable[[int], None] = lambda line: None,
    source: str | None = None,
) -> Outcome:
    """Run ``path`` as ``__main__`` with ``sys.argv = [path, *args]`` and the script's folder on ``sys.path``.

    :class:`StopTraining` ends the run as ``stopped``; ``sys.exit`` as ``exited``;
    any other exception as ``raised``, summed up in one line. ``sys.argv``
    and ``sys.path`` are restored afterwards. ``reached(line)`` is called when
    the statement holding one of ``watch_lines`` is about to run. ``source``:
    text to run instead of the file's (a rewrite of it), under the file's name.
    """
    path = os.path.abspath(path)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(path))
    had_process_group = _process_group_initialized()
    outcome = Outcome(RAISED, "not run")
    try:
        _run_as_main(path, watch_lines, reached, source)
        outcome = Outcome(FINISHED)
    except StopTraining as stop:
        outcome = Outcome(STOPPED, str(stop))
    except SystemExit as exit_:
        outcome = Outcome(EXITED, str(exit_.code))
    except Exception as exc:  # the user's script failed: report it, do not crash the tool
        outcome = Outcome(RAISED, _one_line(exc, path), exc)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        if not had_process_group:
            _close_process_group(synchronise=outcome.ok)
    return outcome


def _process_group_initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _close_process_group(synchronise: bool) -> None:
    """Destroy the process group a stopped script left open, after every rank got here.

    A script stopped after N steps never reaches its own ``destroy_process_group``.
    Left to interpreter exit, the ranks tear gloo down at different moments: a
    rank that exits first closes the connections its peers still read from, and
    torchrun stops the others once one rank exits non-zero. A barrier first
    keeps every rank alive until all have stopped. (The SIGABRT seen at a rank's
    exit under load had another cause, found in a core dump: see ``ddp_hook.py``.)
    """
    import torch.distributed as dist

    if not _process_group_initialized():
        return
    if synchronise:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=120))
        else:
            dist.barrier()
    dist.destroy_process_group()
    _name_next_default_group()


_groups_closed = 0


def groups_closed() -> int:
    """How many default process groups runs in this process have closed (see :func:`_name_next_default_group`)."""
    return _groups_closed


def set_groups_closed(count: int) -> None:
    """Carry the count over from the runs of another process: the next group is named after it."""
    import torch.distributed as dist

    global _groups_closed
    _groups_closed = count
    if count and dist.is_available():
        import torch.distributed.distributed_c10d as c10d

        c10d._world.group_count = count


def _name_next_default_group() -> None:
    """Give the default group the script creates in its next run here its own keys in the launch's store.

    ``gradlint measure`` runs a script once per mode, each run in a process of
    its own that is handed the count (:func:`set_groups_closed`), and under
    torchrun every run initialises its group in the same store. The default
    group is named after a counter that ``destroy_process_group`` resets to 0,
    so a new group would read the keys the previous one left: gloo connected
    to the peers' old, closed addresses (connection refused) and the store
    barrier found its count already complete. Every rank closes as many groups
    as the others, so the number closed so far is the same name on every rank.
    """
    import torch.distributed.distributed_c10d as c10d

    global _groups_closed
    _groups_closed += 1
    c10d._world.group_count = _groups_closed
