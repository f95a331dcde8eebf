"""Start-up time of the command line, as ratios against a bare interpreter measured in the same run.

    python bench/startup.py                  # the installed code (this checkout, when installed with -e)
    python bench/startup.py --base 2e9b65b   # also the code of a commit, measured alternately in the same run

Each command is run as a fresh process (wall-clock time, best of
``--repeat`` runs; the commands take turns, so a burst of load elsewhere
hits them alike):

1. ``python -c pass``: the interpreter alone, the floor of any command;
2. ``python -c "import libcst"``: the parser the rules need;
3. ``gradlint --version``;
4. ``gradlint FILE`` on a module with no training loop (a data-loading
   helper: the prefilter lets it through unparsed);
5. ``gradlint check --force-exclude FILE`` on a copy of ``examples/train.py``
   with a fresh cache folder: what the pre-commit hook runs when one
   training script changed.

Every command runs in a temporary folder, so that ``python -m`` finds the
code under test and not this checkout's folder.

``gradlint`` is ``python -m gradlint``. With ``--base COMMIT`` the code of
that commit is exported into a temporary folder (as
``bench/compare_outputs.py`` does) and each gradlint command is measured
for it too. The goal of issue 27: ``--version`` and a loop-free file in at
most 0.15 s, and the pre-commit run no slower than before. Nothing is
asserted: the numbers go in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compare_outputs import export

ROOT = Path(__file__).resolve().parent.parent
GOAL_SECONDS = 0.15

# A module as a project holds many of: it loops, but over files, and never trains.
LOOP_FREE = '''"""Loading and batching a folder of token files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path


@dataclasses.dataclass
class Shard:
    path: Path
    tokens: int


def read_index(folder: Path) -> list[Shard]:
    """The shards listed in ``index.json``, largest first."""
    entries = json.loads((folder / "index.json").read_text())
    shards = [Shard(folder / e["file"], int(e["tokens"])) for e in entries]
    return sorted(shards, key=lambda s: -s.tokens)


def split(shards: list[Shard], parts: int) -> list[list[Shard]]:
    """Deal the shards into ``parts`` lists of about the same number of tokens."""
    out: list[list[Shard]] = [[] for _ in range(parts)]
    totals = [0] * parts
    for shard in shards:
        i = totals.index(min(totals))
        out[i].append(shard)
        totals[i] += shard.tokens
    return out


def batches(tokens: list[int], size: int):
    for start in range(0, len(tokens) - size, size):
        yield tokens[start:start + size]
'''


def best_time(command: list[str], cwd: Path, env: dict[str, str], expected: tuple[int, ...] = (0,)) -> float:
    """Wall-clock seconds of one run of ``command``; a run that exits otherwise than ``expected`` stops the bench."""
    start = time.perf_counter()
    completed = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    elapsed = time.perf_counter() - start
    if completed.returncode not in expected:
        sys.exit(f"startup: {' '.join(command)} exited {completed.returncode}: {completed.stderr.decode(errors='replace')}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=15, help="runs of each command; the best counts (default 15)")
    parser.add_argument("--base", help="a commit whose code is measured beside the installed code")
    args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="gradlint-startup-") as work:
        work_dir = Path(work)
        loop_free = work_dir / "shards.py"
        loop_free.write_text(LOOP_FREE, encoding="utf-8")
        train = work_dir / "train.py"
        train.write_bytes((ROOT / "examples" / "train.py").read_bytes())
        # Bytecode is written in the dropped first round, as an installed package has it.
        env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
        versions = {"installed": env}
        if args.base:
            base_dir = work_dir / "base"
            export(args.base, base_dir)
            versions[args.base] = {**env, "PYTHONPATH": str(base_dir)}
        cache_runs = iter(range(10**9))

        def fresh_cache() -> str:
            return str(work_dir / f"cache-{next(cache_runs)}")

        commands: dict[str, tuple] = {
            "python -c pass": (lambda: [python, "-c", "pass"], work_dir, env, (0,)),
            'python -c "import libcst"': (lambda: [python, "-c", "import libcst"], work_dir, env, (0,)),
        }
        for label, version_env in versions.items():
            commands[f"gradlint --version [{label}]"] = (lambda: [python, "-m", "gradlint", "--version"], work_dir, version_env, (0,))
            commands[f"gradlint loop-free file [{label}]"] = (
                lambda: [python, "-m", "gradlint", "--no-cache", str(loop_free)], work_dir, version_env, (0,),
            )
            commands[f"pre-commit: examples/train.py [{label}]"] = (
                lambda: [python, "-m", "gradlint", "check", "--force-exclude", "--cache-dir", fresh_cache(), "train.py"],
                work_dir, version_env, (1,),
            )
        times: dict[str, list[float]] = {label: [] for label in commands}
        for _ in range(args.repeat + 1):  # the first round warms the bytecode caches and is dropped
            for label, (make, cwd, command_env, expected) in commands.items():
                times[label].append(best_time(make(), cwd, command_env, expected))
        best = {label: min(runs[1:]) for label, runs in times.items()}
    bare, libcst_import = best["python -c pass"], best['python -c "import libcst"']
    print(f"gradlint start-up, best of {args.repeat} runs each, wall clock")
    print(f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    print(f"{'command':<44} {'seconds':>8} {'/ python -c pass':>17} {'/ import libcst':>16}")
    for label, seconds in best.items():
        print(f"{label:<44} {seconds:>8.3f} {seconds / bare:>17.1f} {seconds / libcst_import:>16.2f}")
    for label in versions:
        met = all(best[f"{name} [{label}]"] <= GOAL_SECONDS for name in ("gradlint --version", "gradlint loop-free file"))
        print(f"goal, --version and loop-free file <= {GOAL_SECONDS} s [{label}]: {'met' if met else 'not met'}")
    if args.base:
        ratio = best["pre-commit: examples/train.py [installed]"] / best[f"pre-commit: examples/train.py [{args.base}]"]
        print(f"pre-commit run, installed / {args.base}: {ratio:.2f}")


if __name__ == "__main__":
    main()
