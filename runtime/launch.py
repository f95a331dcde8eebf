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


def run_script(path: str, args: Sequence[str] = ()) -> Outcome:
    """Run ``path`` as ``__main__`` with ``sys.argv = [path, *args]`` and the script's folder on ``sys.path``.

    :class:`StopTraining` ends the run as ``stopped``; ``sys.exit`` as ``exited``;
    any other exception as ``raised`` with its last traceback lines. ``sys.argv``
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
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        return Outcome(RAISED, "".join(tb[-3:]).rstrip(), exc)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
