"""Source on stdin, as editors send it: ``gradlint - --stdin-filename path.py``, through a real subprocess."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

UNSCALED = textwrap.dedent(
    """\
    import torch

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(loader):
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
    """
)  # GL001 (safe fix) and GL004 (unsafe fix)


def gradlint(cwd: Path, source: str | bytes, *args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("gradlint")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "gradlint"]
    data = source.encode() if isinstance(source, str) else source
    return subprocess.run([*command, *args], input=data, capture_output=True, cwd=cwd, timeout=120)


@pytest.fixture()
def project(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.gradlint]\nextend-exclude = ["vendored/**"]\n\n[tool.gradlint.per-file-ignores]\n"tests/**" = ["GL001"]\n'
    )
    return tmp_path


def test_findings_are_named_after_the_stdin_filename(project):
    done = gradlint(project, UNSCALED, "-", "--stdin-filename", "src/train.py")
    out = done.stdout.decode()
    assert done.returncode == 1, done.stderr
    assert [line.split()[:2] for line in out.splitlines() if ": GL" in line] == [
        ["src/train.py:7:5:", "GL004"],
        ["src/train.py:9:9:", "GL001"],
    ]


def test_per_file_ignores_are_resolved_against_the_stdin_filename(project):
    done = gradlint(project, UNSCALED, "-", "--stdin-filename", "tests/test_train.py")
    codes = [line.split()[1] for line in done.stdout.decode().splitlines() if ": GL" in line]
    assert codes == ["GL004"]


def test_force_exclude_matches_the_stdin_filename(project):
    done = gradlint(project, UNSCALED, "-", "--stdin-filename", "vendored/train.py", "--force-exclude")
    assert done.returncode == 0 and "GL0" not in done.stdout.decode()
    fixed = gradlint(project, UNSCALED, "-", "--stdin-filename", "vendored/train.py", "--force-exclude", "--fix")
    assert fixed.returncode == 0 and fixed.stdout == UNSCALED.encode()  # an excluded file comes back as it was


def test_fix_prints_the_fixed_source_on_stdout_and_the_rest_on_stderr(project):
    done = gradlint(project, UNSCALED, "-", "--stdin-filename", "train.py", "--fix")
    assert done.stdout.decode() == UNSCALED + "        optimizer.zero_grad()\n"
    assert done.returncode == 1  # GL004 is left: its fix is unsafe
    err = done.stderr.decode()
    assert "train.py:7:5: GL004" in err and "Fixed 1 problem." in err and "1 fix available with `--unsafe-fixes`." in err
    both = gradlint(project, UNSCALED, "-", "--stdin-filename", "train.py", "--fix", "--unsafe-fixes")
    assert both.returncode == 0 and "(loss / accum).backward()" in both.stdout.decode()
    assert not (project / "train.py").exists()  # nothing is written


def test_fix_keeps_the_encoding_and_line_endings_of_the_source(project):
    source = ("# -*- coding: latin-1 -*-\n# entraînement\n" + UNSCALED).replace("\n", "\r\n").encode("latin-1")
    done = gradlint(project, source, "-", "--stdin-filename", "train.py", "--fix")
    assert done.stdout == source + "        optimizer.zero_grad()\r\n".encode("latin-1")


def test_a_syntax_error_on_stdin_exits_two_and_fix_hands_the_source_back(project):
    broken = "import os\n\ndef broken(:\n    pass\n"
    done = gradlint(project, broken, "-", "--stdin-filename", "util.py")
    assert done.returncode == 2 and "util.py: cannot parse: invalid syntax (line 3, column 12)" in done.stderr.decode()
    fixed = gradlint(project, broken, "-", "--stdin-filename", "util.py", "--fix")
    assert fixed.returncode == 2 and fixed.stdout == broken.encode()


def test_diff_on_stdin_names_the_stdin_filename(project):
    done = gradlint(project, UNSCALED, "-", "--stdin-filename", "train.py", "--diff")
    assert done.returncode == 1
    assert done.stdout.decode().startswith("--- a/train.py\n+++ b/train.py\n")
    assert "+        optimizer.zero_grad()" in done.stdout.decode()


def test_json_output_and_plain_dash_without_a_filename(project):
    done = gradlint(project, UNSCALED, "-", "--output-format", "json", "--select", "GL004")
    assert done.returncode == 1
    assert '"path": "-"' in done.stdout.decode() and '"code": "GL004"' in done.stdout.decode()


def test_dash_with_other_paths_is_a_usage_error(project):
    done = gradlint(project, UNSCALED, "-", "train.py")
    assert done.returncode == 2 and "takes no other path" in done.stderr.decode()
    (project / "train.py").write_text(UNSCALED)
    named = gradlint(project, "", "--stdin-filename", "tests/x.py", "train.py")
    assert named.returncode == 2 and "give `-` as the only path" in named.stderr.decode()


def test_configuration_is_found_from_the_stdin_filename_wherever_gradlint_runs(project, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    named = project / "tests" / "test_train.py"
    done = gradlint(elsewhere, UNSCALED, "-", "--stdin-filename", str(named))
    codes = [line.split()[1] for line in done.stdout.decode().splitlines() if ": GL" in line]
    assert codes == ["GL004"]  # the project's per-file-ignores silenced GL001
    assert done.stdout.decode().startswith(f"{named}:7:5: GL004")
