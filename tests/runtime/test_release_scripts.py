"""Scripts that already release gradients (torch-optimi, PyTorch's hook recipe) run and measure without a crash.

torch-optimi's ``prepare_for_gradient_release`` refuses a parameter that has any
post-accumulate-grad hook, so neither the tracer nor the memory meter may add one.
Their optimizers step from inside backward, once per parameter: that is one loop step.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gradlint.events import EventKind
from gradlint.runtime.measure import AS_WRITTEN, SET_TO_NONE, measure_script
from gradlint.runtime.predicates import evaluate
from gradlint.runtime.run import run_and_judge, trace_script

pytest.importorskip("optimi")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PLAIN_LOOP = """\
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
data, target = torch.randn(64, 8), torch.randn(64, 1)
for i in range(24):
    x, y = data[(i % 8) * 8:(i % 8 + 1) * 8], target[(i % 8) * 8:(i % 8 + 1) * 8]
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("name,optimizers", [("run_optimi_release.py", 1), ("run_hook_release.py", 4)])
def test_release_script_runs_and_counts_one_step_per_backward(fixtures_dir, name, optimizers):
    tracer, outcome = trace_script(os.path.join(fixtures_dir, name), steps=3)
    assert outcome.how == "stopped", outcome.detail
    assert tracer.steps == 3
    backwards = [e for e in tracer.events if e.kind is EventKind.BACKWARD]
    steps = [e for e in tracer.events if e.kind is EventKind.STEP]
    assert len(backwards) == 3
    assert len(steps) == 3 * optimizers
    assert all(s.facts["released"] >= 1 and s.site.line == backwards[0].site.line for s in steps)
    assert sum(s.facts["released"] for s in steps) == 3 * 4  # two Linear layers: 4 parameters stepped per backward
    for code, (violations, _, _) in evaluate(tracer.events).items():
        assert violations == [], code


def test_release_script_is_measured_as_written_and_release_is_not_applied_twice(fixtures_dir):
    results, refused = measure_script(os.path.join(fixtures_dir, "run_optimi_release.py"), steps=3, time_steps=0)
    assert [r.mode for r in results] == [AS_WRITTEN, SET_TO_NONE]
    assert all(r.steps == 3 for r in results)
    assert "already" in refused and "inside backward" in refused
    # gradient release as written: never more than one parameter's gradient (32 x 8 floats) alive
    assert results[0].memory.split["gradients"] <= 32 * 8 * 4


def test_gl204_rewrite_output_runs_under_gradlint_run(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PLAIN_LOOP)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    fixed = subprocess.run(
        [sys.executable, "-m", "gradlint", "check", "--fix", "--unsafe-fixes", "--select", "GL204", "--no-cache", str(script)],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )
    text = script.read_text()
    assert "GradientRelease(optimizer)" in text, fixed.stdout + fixed.stderr
    report = run_and_judge(str(script), [], steps=3)
    assert report.steps == 3 and report.outcome.how == "stopped"
    assert [e.facts["released"] for e in report.events if e.kind is EventKind.STEP] == [4, 4, 4]
