"""`gradlint run` / `measure` as a user types them: arguments after `--`, exit codes, a failing script's traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = """\
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--fail-at", type=int, default=-1)
args = parser.parse_args()
print("script steps", args.steps)
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(args.steps):
    opt.zero_grad()
    model(torch.ones(2)).sum().backward()
    if i == args.fail_at:
        raise RuntimeError("loader died")
    opt.step()
"""


def _gradlint(*args: str, cwd: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "gradlint", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def test_arguments_after_double_dash_go_to_the_script_and_before_it_to_gradlint(script, tmp_path):
    proc = _gradlint("run", str(script), "--steps", "2", "--", "--steps", "3", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "script steps 3" in proc.stdout
    assert "train.py: 2 optimizer steps (stopped)" in proc.stdout
    proc = _gradlint("run", str(script), "--", "--steps", "3", cwd=str(tmp_path))
    assert "script steps 3" in proc.stdout and "train.py: 3 optimizer steps (finished)" in proc.stdout


def test_an_unknown_option_before_double_dash_is_an_error_not_passed_on(script, tmp_path):
    proc = _gradlint("run", str(script), "--fail-at", "0", cwd=str(tmp_path))
    assert proc.returncode == 2
    assert "no such option: --fail-at (arguments for the script go after '--'" in proc.stderr
    assert "script steps" not in proc.stdout


def test_a_script_that_raises_shows_its_traceback_and_the_events_then_exits_2(script, tmp_path):
    proc = _gradlint("run", str(script), "--", "--fail-at", "2", cwd=str(tmp_path))
    assert proc.returncode == 2
    err = proc.stderr
    assert "Traceback (most recent call last):" in err
    assert f'File "{script}", line 15, in <module>' in err
    assert "RuntimeError: loader died" in err
    assert "runpy" not in err and "gradlint/runtime" not in err  # the tool's own frames are left out
    assert "events seen before the failure:" in err
    assert err.count("BACKWARD") == 3 and err.count("STEP(SGD#0)") == 2
    assert err.strip().splitlines()[-1] == (
        f"gradlint run: {script}: the script raised RuntimeError: loader died (at train.py:15) after 2 optimizer steps"
    )


def test_a_confirmed_finding_exits_1_and_a_clean_run_0(tmp_path, fixtures_dir):
    buggy = _gradlint("run", os.path.join(fixtures_dir, "run_missing_zero_grad.py"), "--steps", "3", cwd=str(tmp_path))
    assert buggy.returncode == 1, buggy.stdout + buggy.stderr
    assert "GL001 confirmed" in buggy.stdout
    clean = _gradlint("run", os.path.join(fixtures_dir, "run_clean_basic.py"), "--steps", "3", cwd=str(tmp_path))
    assert clean.returncode == 0, clean.stdout + clean.stderr


def test_measure_shows_the_traceback_of_a_failing_script(script, tmp_path):
    proc = _gradlint("measure", str(script), "--steps", "2", "--", "--fail-at", "0", cwd=str(tmp_path))
    assert proc.returncode == 2
    assert "Traceback (most recent call last):" in proc.stderr and "RuntimeError: loader died" in proc.stderr
