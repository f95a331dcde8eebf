"""What compiling named files costs: the same files checked as a folder walk and as named paths.

A file named on the command line is compiled even when the prefilter skips
it (so that its syntax errors are reported); a walked one is not. This runs
both over one folder, without the cache, in one process, alternating, and
prints the best time of each and their ratio, and the compile time of the
skipped files alone against the walk.

    python bench/named_files.py FOLDER [--repeat N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gradlint.config import Config
from gradlint.discovery import discover
from gradlint.linter import might_fire
from gradlint.named import syntax_error
from gradlint.rules import ALL_RULES
from gradlint.runner import run
from gradlint.source import read_source


def timed(action) -> float:
    """How long ``action()`` takes, in seconds."""
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    config = Config(root=Path(args.folder).absolute())
    files = [item for item in discover([args.folder], config) if isinstance(item, str)]
    texts = {path: read_source(path).text for path in files}
    default_rules = [rule for rule in ALL_RULES if rule.enabled_by_default]
    skipped = [text for text in texts.values() if not might_fire(text, default_rules)]
    lines = sum(text.count("\n") for text in texts.values())
    walk = named = compiled = float("inf")
    for _ in range(args.repeat):  # alternating, so that both see the same load on a shared machine
        walk = min(walk, timed(lambda: run([args.folder], config, jobs=1)))
        named = min(named, timed(lambda: run(files, config, jobs=1)))
        compiled = min(compiled, timed(lambda: [syntax_error(text) for text in skipped]))
    print(f"{len(files)} files, {lines:,} lines; the prefilter skips {len(skipped)} of them")
    print(f"folder walk:           {walk:7.2f} s")
    print(f"the same files named:  {named:7.2f} s   named / walk = {named / walk:.2f}")
    print(f"compiling the skipped: {compiled:7.2f} s   compile / walk = {compiled / walk:.2f}")


if __name__ == "__main__":
    main()
