"""How the current linter fares on the pending fixtures reduced from the sweep.

    python bench/realworld/check_pending.py

Each fixture in ``bench/realworld/pending/`` is either correct code reduced from a false alarm
(no ``# expect:`` marker: it must end up silent) or buggy code reduced from a real defect (its
markers name the lines that must be flagged). The script prints, per fixture, whether the
current findings already equal the markers (``ready``: it can move into ``fixtures/``) or not
(``pending``), with the unexpected and the missing findings. It asserts nothing and always exits 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from fixture_markers import expected_findings  # noqa: E402

PENDING = Path(__file__).resolve().parent / "pending"


def findings(path: Path) -> set[tuple[int, str]]:
    """``(line, code)`` of every default-rule finding of the current linter on one file."""
    result = subprocess.run(
        [sys.executable, "-m", "gradlint", "check", "--no-cache", "--isolated", "--exit-zero",
         "--output-format", "json", str(path)],
        capture_output=True, text=True, check=True,
    )
    return {(item["line"], item["code"]) for item in json.loads(result.stdout)}


def main() -> int:
    """Print one line per pending fixture, then how many are ready."""
    ready = 0
    fixtures = sorted(PENDING.glob("*.py"))
    for path in fixtures:
        expected = expected_findings(path.read_text(encoding="utf-8"))
        found = findings(path)
        extra = sorted(found - expected)
        missing = sorted(expected - found)
        kind = "buggy" if expected else "correct"
        status = "ready" if not extra and not missing else "pending"
        ready += status == "ready"
        detail = "".join(
            [f" unexpected {extra}" if extra else "", f" missing {missing}" if missing else ""]
        )
        print(f"{status:8} {kind:8} {path.name}{detail}")
    print(f"\n{ready} of {len(fixtures)} pending fixtures already match their markers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
