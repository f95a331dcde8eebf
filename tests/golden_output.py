"""The linter's whole observable output over the repository's own Python code, kept as a golden file.

``tests/test_golden_output.py`` checks that the JSON findings (every rule,
GL204 included) and the ``--diff --unsafe-fixes`` output over ``fixtures/``,
``examples/`` and ``tests/`` are exactly what ``tests/data/golden-output.json``
holds. A change of structure or speed must leave them identical; a change of
behaviour regenerates the file on purpose, in its own commit::

    .venv/bin/python tests/golden_output.py --write
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "data" / "golden-output.json"
PATHS = ("fixtures", "examples", "tests")
EVERY_RULE = "GL,GL204"


def _gradlint(*args: str) -> str:
    completed = subprocess.run(
        [sys.executable, "-m", "gradlint", "check", "--isolated", "--no-cache", "-j", "1", "--select", EVERY_RULE, *args, *PATHS],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    # Exit 1 means findings, but an uncaught exception also exits 1: its traceback on stderr is a failure too.
    if completed.returncode not in (0, 1) or "Traceback (most recent call last)" in completed.stderr:
        raise RuntimeError(f"gradlint exited {completed.returncode}: {completed.stderr}")
    return completed.stdout


def current_output() -> dict[str, object]:
    """The findings as JSON and the fixes as a diff, as gradlint prints them now.

    A finding's ``url`` is left out: it is the rule's page under the installed
    package's Documentation URL, the same for every finding of a code
    (``tests/test_output_formats.py`` checks it).
    """
    findings = [{key: value for key, value in f.items() if key != "url"} for f in json.loads(_gradlint("--output-format", "json"))]
    return {
        "findings": findings,
        "diff": _gradlint("--diff", "--unsafe-fixes").splitlines(),
    }


def main() -> int:
    output = current_output()
    if "--write" in sys.argv[1:]:
        GOLDEN.write_text(json.dumps(output, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {GOLDEN.relative_to(ROOT)}: {len(output['findings'])} findings, {len(output['diff'])} diff lines")
        return 0
    same = output == json.loads(GOLDEN.read_text(encoding="utf-8"))
    print("identical" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
