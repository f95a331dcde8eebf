"""Under torchrun, hand every rank's report to rank 0, which alone prints them, merged.

Ranks exchange small JSON files in a folder named after the torchrun launch
(its run id and master port), so the exchange works even after the script has
destroyed its process group. Rank 0 waits for the others, up to a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any


def rank_and_world() -> tuple[int, int] | None:
    """``(rank, world size)`` when launched by torchrun with more than one process, else ``None``."""
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return (rank, world) if world > 1 else None


def _folder() -> str:
    launch = "-".join(os.environ.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"))
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in launch)
    return os.path.join(tempfile.gettempdir(), f"gradlint-ranks-{os.getuid()}-{safe}")


def exchange(payload: dict[str, Any], rank: int, world: int, timeout: float = 120.0) -> list[dict[str, Any]] | None:
    """Write this rank's ``payload``; on rank 0 return every rank's, in rank order (``None`` elsewhere).

    A rank whose payload did not arrive within ``timeout`` seconds is given as
    ``{"rank": r, "missing": True}``.
    """
    folder = _folder()
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".rank{rank}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(payload, handle)
    os.replace(temporary, os.path.join(folder, f"rank{rank}.json"))
    if rank != 0:
        return None
    deadline = time.monotonic() + timeout
    paths = [os.path.join(folder, f"rank{r}.json") for r in range(world)]
    while not all(os.path.exists(p) for p in paths) and time.monotonic() < deadline:
        time.sleep(0.05)
    found = []
    for r, path in enumerate(paths):
        try:
            with open(path, encoding="utf-8") as handle:
                found.append(json.load(handle))
        except OSError:
            found.append({"rank": r, "missing": True})
    shutil.rmtree(folder, ignore_errors=True)
    return found
