"""A GradScaler that is disabled at run time is a no-op: the scaler rules are not exercised, never confirmed or refuted."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from gradlint.findings import Finding, Severity
from gradlint.runtime.commands import run_command
from gradlint.runtime.predicates import evaluate
from gradlint.runtime.run import run_and_judge, trace_script
from gradlint.runtime.verdicts import CONFIRMED, NOT_EXERCISED

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train.py")


def _finding(path, line, code):
    return Finding(path, line, 1, line, 1, code, "n", "m", Severity.ERROR, None)


def test_disabled_scaler_shows_no_violation_and_enabled_one_is_traced(fixtures_dir):
    path = os.path.join(fixtures_dir, "run_scaler_disabled.py")
    for args in ([], ["--amp"]):
        tracer, outcome = trace_script(path, args, steps=3)
        assert outcome.ok and tracer.steps == 3
        results = evaluate(tracer.events)
        assert all(not checked.violations for checked in results.values()), args
        assert results["GL101"].exercised is bool(args)
        assert tracer.disabled_scalers == (set() if args else {"GradScaler#0"})


def test_scaler_findings_on_a_disabled_scaler_are_not_exercised(fixtures_dir):
    path = os.path.join(fixtures_dir, "run_scaler_disabled.py")
    lines = {"GL101": 25, "GL102": 28, "GL103": 27, "GL104": 28}
    findings = [_finding(path, line, code) for code, line in lines.items()]
    report = run_and_judge(path, findings, steps=3)
    assert [v.status for v in report.verdicts] == [NOT_EXERCISED] * 4
    assert all(v.evidence.startswith("scaler disabled: GradScaler#0 ran with enabled=False") for v in report.verdicts)
    assert report.unreported == []


def test_shipped_example_verdicts_without_and_with_amp():
    linter = pytest.importorskip("gradlint.linter")
    findings = list(linter.lint_file(EXAMPLE).findings)
    # The static side folds the undivided loss into the GL003 finding (one problem, one finding);
    # the runtime still judges a GL004 finding on the backward line when one is handed to it.
    assert sorted(f.code for f in findings) == ["GL003", "GL103"]
    findings.append(_finding(EXAMPLE, 50, "GL004"))
    off = {v.finding.code: v for v in run_and_judge(EXAMPLE, findings, steps=3).verdicts}
    assert off["GL003"].status == CONFIRMED
    assert off["GL004"].status == NOT_EXERCISED and "a clear between them" in off["GL004"].evidence
    assert off["GL103"].status == NOT_EXERCISED and off["GL103"].evidence.startswith("scaler disabled")
    on_report = run_and_judge(EXAMPLE, findings, ["--amp"], steps=3)
    on = {v.finding.code: v for v in on_report.verdicts}
    assert on["GL003"].status == CONFIRMED and on["GL103"].status == CONFIRMED
    assert on["GL004"].status == NOT_EXERCISED
    assert on_report.unreported == []


def test_cli_on_the_example_reports_no_runtime_only_gl101():
    pytest.importorskip("gradlint.linter")
    result = CliRunner().invoke(run_command, [EXAMPLE, "--steps", "2"])
    assert result.exit_code == 1, result.output  # GL003 is confirmed
    assert "GL101" not in result.output
    assert "GL103 not exercised: scaler disabled" in result.output
