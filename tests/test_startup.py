"""The command line starts without LibCST, the rules or torch, and loads them when a file needs checking.

Times are measured by ``bench/startup.py``, never here; these tests hold the
import structure that makes start-up short.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("libcst", "gradlint.rules", "gradlint.linter", "gradlint.fixer", "torch")

# Runs the command line in-process with ARGS and prints the exit status and which heavy modules were imported.
_PROBE = textwrap.dedent(
    """
    import json, sys
    from gradlint.cli import main
    try:
        main(sys.argv[1:], prog_name="gradlint")
    except SystemExit as exit:
        status = exit.code
    print(json.dumps({"status": status, "imported": sorted(m for m in %r if m in sys.modules)}))
    """
    % (HEAVY,)
)


def probe(tmp_path: Path, *args: str) -> dict:
    """The exit status of ``gradlint ARGS`` in a fresh interpreter, and the heavy modules it imported."""
    completed = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    return json.loads(completed.stdout.splitlines()[-1])


def test_importing_the_command_line_imports_nothing_heavy(tmp_path):
    code = f"import sys, gradlint.cli; print([m for m in {HEAVY!r} if m in sys.modules])"
    completed = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert completed.stdout.strip() == "[]"


def test_version_imports_nothing_heavy(tmp_path):
    assert probe(tmp_path, "--version") == {"status": 0, "imported": []}


def test_a_file_without_a_training_loop_is_checked_without_the_parser(tmp_path):
    (tmp_path / "data.py").write_text(
        'import json\n\n\ndef load(paths):\n    """Read files; no backward( here."""\n    for path in paths:\n        yield json.load(open(path))\n'
    )
    assert probe(tmp_path, "--no-cache", "data.py") == {"status": 0, "imported": []}


def test_a_training_loop_loads_the_parser_and_the_rules(tmp_path):
    (tmp_path / "train.py").write_text("for x in data:\n    loss = model(x)\n    loss.backward()\n    opt.step()\n")
    outcome = probe(tmp_path, "--no-cache", "train.py")
    assert outcome["status"] == 1  # GL001: the check really ran
    assert {"libcst", "gradlint.rules", "gradlint.linter"} <= set(outcome["imported"])
    assert "torch" not in outcome["imported"]


def test_listing_the_rules_needs_no_rule_module(tmp_path):
    assert probe(tmp_path, "rules") == {"status": 0, "imported": []}
