"""`gradlint run`: fixtures are confirmed on their marked lines, correct twins come back clean."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from gradlint.findings import Finding, Severity
from gradlint.runtime import run as run_module
from gradlint.runtime.commands import run_command
from gradlint.runtime.predicates import evaluate
from gradlint.runtime.run import RunError, run_and_judge, trace_script
from gradlint.runtime.verdicts import CONFIRMED, NOT_REACHED, REFUTED

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "fixtures")

BUGGY = {
    "run_missing_zero_grad.py": "GL001",
    "run_zero_between_backward_and_step.py": "GL002",
    "run_zero_in_accumulation.py": "GL003",
    "run_clear_before_boundary_backward.py": "GL003",
    "run_undivided_accumulation.py": "GL004",
    "run_step_bypasses_scaler.py": "GL102",
    "run_step_outside_guard.py": "GL011",
}
CLEAN = ["run_clean_basic.py", "run_clean_accumulation.py", "run_clean_scaler.py"]


@pytest.mark.parametrize("name,code", sorted(BUGGY.items()))
def test_buggy_fixture_is_confirmed_on_its_marker(name, code, fixtures_dir, markers):
    path = os.path.join(fixtures_dir, name)
    findings = markers(path)
    assert [f.code for f in findings] == [code]
    report = run_and_judge(path, findings)
    assert report.steps == 5
    [verdict] = report.verdicts
    assert verdict.status == CONFIRMED, verdict.evidence
    assert "step" in verdict.evidence


@pytest.mark.parametrize("name", CLEAN)
def test_correct_twin_shows_no_violation_at_all(name, fixtures_dir):
    tracer, outcome = trace_script(os.path.join(fixtures_dir, name))
    assert outcome.ok and tracer.steps == 5
    for code, (violations, _, _) in evaluate(tracer.events).items():
        assert violations == [], (code, violations)


def _finding(path, line, code):
    return Finding(path, line, 1, line, 1, code, "n", "m", Severity.ERROR, None)


def test_findings_on_correct_lines_are_refuted_and_dead_lines_not_reached(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(8):\n"
        "    opt.zero_grad()\n"
        "    model(torch.randn(2, 3)).sum().backward()\n"
        "    opt.step()\n"
        "    if i > 100:\n"
        "        opt.zero_grad(set_to_none=False)\n"
    )
    findings = [_finding(str(script), 7, "GL001"), _finding(str(script), 5, "GL002"), _finding(str(script), 9, "GL005")]
    report = run_and_judge(str(script), findings, steps=3)
    statuses = [v.status for v in report.verdicts]
    assert statuses == [REFUTED, REFUTED, NOT_REACHED]
    assert "started from cleared gradients" in report.verdicts[0].evidence
    assert "first 3 optimizer steps" in report.verdicts[2].evidence


def test_allocated_zero_gradients_confirm_gl005_on_a_manual_loop(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(8):\n"
        "    model(torch.randn(2, 3)).sum().backward()\n"
        "    opt.step()\n"
        "    for p in model.parameters():\n"
        "        p.grad.zero_()\n"
    )
    report = run_and_judge(str(script), [_finding(str(script), 8, "GL005")], steps=3)
    assert report.verdicts[0].status == CONFIRMED
    assert "allocated and all zero" in report.verdicts[0].evidence


@pytest.fixture
def fake_static(monkeypatch, markers):
    """Stand in for the static linter with the fixtures' markers."""
    monkeypatch.setattr(run_module, "static_findings", lambda path: markers(path))


def test_cli_exit_codes_and_output(fake_static, fixtures_dir):
    runner = CliRunner()
    buggy = runner.invoke(run_command, [os.path.join(fixtures_dir, "run_missing_zero_grad.py"), "--steps", "3"])
    assert buggy.exit_code == 1, buggy.output
    assert "GL001 confirmed: step 2 of SGD#0 used gradients from 2 backwards without a clear in between" in buggy.output
    assert "step 1:" in buggy.output and "BACKWARD" in buggy.output
    clean = runner.invoke(run_command, [os.path.join(fixtures_dir, "run_clean_basic.py")])
    assert clean.exit_code == 0, clean.output
    assert "static findings: none" in clean.output


def test_cli_passes_script_arguments(fake_static, fixtures_dir):
    result = CliRunner().invoke(
        run_command, [os.path.join(fixtures_dir, "run_clean_accumulation.py"), "--steps", "2", "--", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "factor=0.5" in result.output and "factor=0.25" not in result.output


@pytest.mark.parametrize(
    "body,message",
    [
        ("raise ValueError('boom')\n", "ValueError: boom"),
        ("import sys\nsys.exit(3)\n", "sys.exit(3)"),
        ("import torch\nprint(torch.ones(2).sum())\n", "no training loop"),
        (
            "import torch\nm = torch.nn.Linear(2, 1)\nfor _ in range(3):\n    m(torch.ones(2)).sum().backward()\n",
            "never stepped",
        ),
    ],
)
def test_scripts_that_cannot_be_judged_exit_2(tmp_path, fake_static, body, message):
    script = tmp_path / "bad.py"
    script.write_text(body)
    result = CliRunner().invoke(run_command, [str(script)])
    assert result.exit_code == 2
    assert message in result.output
    with pytest.raises(RunError):
        run_and_judge(str(script), [])


def test_real_static_linter_agrees_with_markers(fixtures_dir, markers):
    linter = pytest.importorskip("gradlint.linter")
    for name, code in BUGGY.items():
        path = os.path.join(fixtures_dir, name)
        static = linter.lint_file(path).findings
        expected = {(f.code, f.line) for f in markers(path)}
        assert expected <= {(f.code, f.line) for f in static}, name
        report = run_and_judge(path, static)
        assert any(v.status == CONFIRMED and v.finding.code == code for v in report.verdicts)
    for name in CLEAN:
        path = os.path.join(fixtures_dir, name)
        report = run_and_judge(path, linter.lint_file(path).findings)
        assert not report.confirmed, name


FIXED_TWINS = sorted(name for name in BUGGY if os.path.exists(os.path.join(FIXTURES, "fixed", name)))


@pytest.mark.parametrize("name", FIXED_TWINS)
def test_fixed_twin_of_a_buggy_script_shows_no_violation(name):
    """What ``gradlint --fix`` produces is right when it runs, not only when it is read."""
    tracer, outcome = trace_script(os.path.join(FIXTURES, "fixed", name))
    assert outcome.ok and tracer.steps == 5
    for code, (violations, _, _) in evaluate(tracer.events).items():
        assert violations == [], (code, violations)


# ---------------------------------------------------------------------- errors a finding predicts
ACCUMULATING_SCALER = """\
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu")
accum = 4
for i in range(16):
    loss = model(torch.randn(4, 8)).square().mean() / accum
    scaler.scale(loss).backward()
{body}
"""

CRASHES = {
    # GL105: update() on every micro-batch; the second one finds nothing unscaled or stepped
    "update per micro-batch": (
        "    if (i + 1) % accum == 0:\n        scaler.step(optimizer)\n        optimizer.zero_grad()\n    scaler.update()\n",
        "GL105", 15, "AssertionError: No inf checks were recorded prior to update at train.py:15 (`scaler.update()`)",
    ),
    # GL105: unscale_() on every micro-batch; the second one before an update() raises
    "unscale_ per micro-batch": (
        "    scaler.unscale_(optimizer)\n    if (i + 1) % accum == 0:\n        scaler.step(optimizer)\n"
        "        scaler.update()\n        optimizer.zero_grad()\n",
        "GL105", 12, "RuntimeError: unscale_() has already been called on this optimizer since the last update() "
        "at train.py:12 (`scaler.unscale_(optimizer)`)",
    ),
    # GL104: scaler.step() with no update() ever: the second step raises
    "no update": (
        "    scaler.step(optimizer)\n    optimizer.zero_grad()\n",
        "GL104", 12, "RuntimeError: step() has already been called since the last update() at train.py:12 "
        "(`scaler.step(optimizer)`)",
    ),
}


@pytest.mark.parametrize("name", sorted(CRASHES))
def test_the_error_a_finding_predicts_raised_at_its_line_confirms_it(tmp_path, name):
    linter = pytest.importorskip("gradlint.linter")
    body, code, line, evidence = CRASHES[name]
    script = tmp_path / "train.py"
    script.write_text(ACCUMULATING_SCALER.format(body=body))
    findings = linter.lint_file(str(script)).findings
    assert (code, line) in {(f.code, f.line) for f in findings}
    result = CliRunner().invoke(run_command, [str(script)])
    assert result.exit_code == 1, result.output
    assert f"train.py:{line}: {code} confirmed: the script raised {evidence}, the error {code} predicts" in result.output
    assert "the script's traceback:" in result.output and f'line {line}, in <module>' in result.output


def test_another_error_at_the_line_of_such_a_finding_still_cannot_be_judged(tmp_path, fake_static):
    script = tmp_path / "train.py"
    script.write_text(ACCUMULATING_SCALER.format(
        body="    if (i + 1) % accum == 0:\n        scaler.step(optimizer)\n"
             "    raise RuntimeError('loader died')  # expect: GL105\n"
    ))
    result = CliRunner().invoke(run_command, [str(script)])
    assert result.exit_code == 2
    assert "the script raised RuntimeError: loader died (at train.py:14)" in result.output
