"""A real, non-editable install maps rules/ and runtime/ into the gradlint package, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHECK = """
import importlib.util, sys
import gradlint.rules, gradlint.runtime, gradlint.linter
assert gradlint.rules.__file__.startswith(sys.argv[1]), gradlint.rules.__file__
assert importlib.util.find_spec("rules") is None, "a top-level 'rules' module is importable"
assert importlib.util.find_spec("runtime") is None, "a top-level 'runtime' module is importable"
assert "torch" not in sys.modules, "the static linter imported torch"
print(len(gradlint.rules.ALL_RULES))
"""


def test_non_editable_install(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(REPO)],
        check=True,
        timeout=600,
    )
    assert not (target / "rules").exists() and not (target / "runtime").exists()
    env = {**os.environ, "PYTHONPATH": str(target)}
    completed = subprocess.run(
        [sys.executable, "-c", CHECK, str(target)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    assert int(completed.stdout) >= 9
