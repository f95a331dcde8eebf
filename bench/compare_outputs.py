"""Whether a change of structure left gradlint's output alone: two versions of the code over the same trees.

    python bench/compare_outputs.py --base f517494 /tmp/sweep/trees/*/
    python bench/compare_outputs.py --base HEAD~3 --jobs 2 path/to/repo another/repo

The code of ``--base`` (a commit of this repository) is exported into a
temporary folder, laid out as the installed package (``rules/`` as
``gradlint/rules``, ``runtime/`` as ``gradlint/runtime``), and run on
``PYTHONPATH``; the code of the working tree is the installed one. Each tree
is checked by both, from inside the tree, with ``--no-cache --isolated
--exit-zero --output-format json -j 1``, and the two JSON outputs and the two
error streams are compared (findings as sets, leaving out each finding's ``url``,
the address of its rule's page, which older versions do not print). The script prints one line per tree that
differs (with the findings only one side has) and a summary, and exits 1 when
any tree differs.

``tests/test_golden_output.py`` holds the repository's own code to a golden
file; this script is the same check over real code, such as the trees
``bench/sweep.py --work DIR`` extracts. It is not part of the test suite.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Where each top-level folder of the repository lives in the installed package (pyproject.toml's package-dir).
PACKAGE_DIRS = {"gradlint": "gradlint", "rules": "gradlint/rules", "runtime": "gradlint/runtime"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", type=Path, help="folders to check, each from inside")
    parser.add_argument("--base", required=True, help="the commit whose code the working tree's is compared with")
    parser.add_argument("--jobs", type=int, default=2, help="trees checked at once (each check runs on one job)")
    args = parser.parse_args()
    trees = [tree for tree in args.trees if tree.is_dir()]
    if not trees:
        sys.exit("compare_outputs: no folder to check")
    with tempfile.TemporaryDirectory(prefix="gradlint-base-") as base:
        export(args.base, Path(base))
        imported = subprocess.run(
            [sys.executable, "-c", "import gradlint; print(gradlint.__file__)"],
            cwd=tempfile.gettempdir(), env={**os.environ, "PYTHONPATH": base}, capture_output=True, text=True, check=True,
        ).stdout.strip()
        if not imported.startswith(base):
            sys.exit(f"compare_outputs: the base code is shadowed by {imported}")
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            outcomes = list(pool.map(lambda tree: compare(tree, base), trees))
    differing = [(tree, detail) for tree, detail in zip(trees, outcomes) if detail is not None]
    for tree, detail in differing:
        print(f"DIFFERS {tree}: {detail}")
    print(f"{len(trees) - len(differing)} of {len(trees)} trees identical (base {args.base}, working tree {ROOT})")
    sys.exit(1 if differing else 0)


def export(commit: str, into: Path) -> None:
    """The package as it was at ``commit``, laid out under ``into`` as it is installed."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, *PACKAGE_DIRS], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            top, _, rest = member.name.partition("/")
            if not member.isfile() or top not in PACKAGE_DIRS:
                continue
            target = into / PACKAGE_DIRS[top] / rest
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())


def check(tree: Path, pythonpath: str | None) -> tuple[str, str]:
    """gradlint's JSON output and error stream over ``tree``, with the package on ``pythonpath`` (None: the installed one)."""
    env = None if pythonpath is None else {**os.environ, "PYTHONPATH": pythonpath}
    command = [sys.executable, "-m", "gradlint", "check", "--no-cache", "--isolated", "--exit-zero", "--output-format", "json", "-j", "1", "."]
    completed = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    return completed.stdout, completed.stderr


def _finding_key(finding: dict) -> str:
    """A finding as compared: every field but ``url``, the address of the rule's page (which older versions
    do not print and which depends on the documentation's address, not on what was found)."""
    return json.dumps({k: v for k, v in finding.items() if k != "url"}, sort_keys=True)


def compare(tree: Path, base: str) -> str | None:
    """None when both versions print the same for ``tree``; else what differs."""
    old_out, old_err = check(tree, base)
    new_out, new_err = check(tree, None)
    if old_out == new_out and old_err == new_err:
        return None
    if old_out != new_out:
        try:
            old = {_finding_key(f) for f in json.loads(old_out or "[]")}
            new = {_finding_key(f) for f in json.loads(new_out or "[]")}
        except json.JSONDecodeError:
            return "output is not JSON on one side"
        if old != new:
            return f"{len(old - new)} findings only in the base, {len(new - old)} only in the working tree: {sorted(old ^ new)[:3]}"
    if old_err == new_err:
        return None
    return f"error streams differ: base {old_err.strip()[:200]!r}, working tree {new_err.strip()[:200]!r}"


if __name__ == "__main__":
    main()
