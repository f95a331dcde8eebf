"""Execute a training script the way ``python script.py ARGS`` would, inside this process."""

from __future__ import annotations

import dataclasses
import os
import runpy
import sys
import traceback
from typing import Sequence

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


def run_script(path: str, args: Sequence[str] = ()) -> Outcome:
    """Run ``path`` as ``__main__`` with ``sys.argv = [path, *args]`` and the script's folder on ``sys.path``.

    :class:`StopTraining` ends the run as ``stopped``; ``sys.exit`` as ``exited``;
    any other exception as ``raised``, summed up in one line. ``sys.argv``
    and ``sys.path`` are restored afterwards.
    """
    path = os.path.abspath(path)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(path))
    try:
        runpy.run_path(path, run_name="__main__")
        return Outcome(FINISHED)
    except StopTraining as stop:
        return Outcome(STOPPED, str(stop))
    except SystemExit as exit_:
        return Outcome(EXITED, str(exit_.code))
    except Exception as exc:  # the user's script failed: report it, do not crash the tool
        return Outcome(RAISED, _one_line(exc, path), exc)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
