"""Baselines: ``--write-baseline`` records today's findings, ``--baseline`` reports only new ones, and moving code keeps them known."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from gradlint.cli import main

LOOP = textwrap.dedent(
    """\
    for x, y in loader:
        loss_fn(model(x), y).backward()
        optimizer.step()
    """
)  # GL001 on the step


def invoke(*args):
    return CliRunner().invoke(main, ["--no-cache", *map(str, args)])


def reported(result) -> list[tuple[str, int, str]]:
    rows = []
    for line in result.stdout.splitlines():
        if ": GL" in line:
            place, code = line.split()[:2]
            path, row = place.split(":")[:2]
            rows.append((path, int(row), code))
    return rows


@pytest.fixture()
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.gradlint]\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("import torch\n\n" + LOOP)
    (tmp_path / "src" / "gan.py").write_text(LOOP + "\n" + LOOP.replace("optimizer", "opt_d"))
    return tmp_path


def test_write_baseline_records_every_finding_by_path_code_and_line_text(project):
    result = invoke("--write-baseline", "gradlint-baseline.json", ".")
    assert result.exit_code == 0, result.output
    assert result.stderr == "Wrote a baseline of 3 findings to gradlint-baseline.json.\n" and result.stdout == ""
    document = json.loads((project / "gradlint-baseline.json").read_text())
    assert document["format"] == "gradlint-baseline" and document["version"] == 1
    assert document["findings"] == [
        {"path": "src/gan.py", "code": "GL001", "line": "opt_d.step()", "count": 1},
        {"path": "src/gan.py", "code": "GL001", "line": "optimizer.step()", "count": 1},
        {"path": "src/train.py", "code": "GL001", "line": "optimizer.step()", "count": 1},
    ]


def test_baseline_hides_the_recorded_findings_and_reports_new_ones(project):
    invoke("--write-baseline", "base.json", ".")
    quiet = invoke("--baseline", "base.json", ".")
    assert quiet.exit_code == 0, quiet.output
    assert reported(quiet) == []
    assert quiet.stdout.endswith("All checks passed (2 files checked). 3 baseline findings not shown.\n")
    (project / "src" / "new.py").write_text(LOOP)  # a new file
    with open(project / "src" / "train.py", "a") as handle:  # and a second, identical loop in an old file
        handle.write("\n" + LOOP)
    loud = invoke("--baseline", "base.json", ".")
    assert loud.exit_code == 1
    assert reported(loud) == [("src/new.py", 3, "GL001"), ("src/train.py", 9, "GL001")]


def test_moved_and_reindented_code_stays_known(project):
    invoke("--write-baseline", "base.json", ".")
    moved = "import torch\nimport os\n\n\ndef train(loader, model, optimizer, loss_fn):\n" + textwrap.indent(LOOP, "    ")
    (project / "src" / "train.py").write_text(moved)
    result = invoke("--baseline", "base.json", ".")
    assert result.exit_code == 0, result.output
    assert "3 baseline findings not shown" in result.stdout
    (project / "src" / "train.py").write_text(moved.replace("optimizer.step()", "optimizer.step(closure=None)"))
    assert reported(invoke("--baseline", "base.json", ".")) == [("src/train.py", 8, "GL001")]  # a changed line is new


def test_paths_are_keyed_from_the_configuration_folder_not_the_current_one(project, monkeypatch):
    invoke("--write-baseline", "base.json", "src")
    monkeypatch.chdir(project / "src")
    result = invoke("--baseline", "../base.json", ".")
    assert result.exit_code == 0, result.output
    assert reported(result) == []


def test_a_missing_or_foreign_baseline_is_an_error(project):
    missing = invoke("--baseline", "nope.json", ".")
    assert missing.exit_code == 2 and "nope.json: no such file (write one with --write-baseline)" in missing.output
    (project / "other.json").write_text('{"findings": []}')
    foreign = invoke("--baseline", "other.json", ".")
    assert foreign.exit_code == 2 and "not a gradlint baseline" in foreign.output
    both = invoke("--baseline", "other.json", "--write-baseline", "x.json", ".")
    assert both.exit_code == 2 and "do not go together" in both.output


def test_baseline_through_the_installed_command(project):
    script = Path(sys.executable).with_name("gradlint")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "gradlint"]
    written = subprocess.run([*command, "--write-baseline", "base.json", "."], capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr
    (project / "src" / "new.py").write_text(LOOP)
    checked = subprocess.run([*command, "--baseline", "base.json", "."], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 1
    assert checked.stdout.startswith("src/new.py:3:5: GL001")
    assert "3 baseline findings not shown." in checked.stdout
