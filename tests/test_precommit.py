"""The pre-commit hooks, run by the real ``pre-commit`` against this repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

BUGGY = """import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in zip(torch.randn(8, 4), torch.randn(8, 1)):
    loss = (model(x) - y).pow(2).mean()
    loss.backward()
    optimizer.step()
"""

CLEAN = BUGGY + "    optimizer.zero_grad()\n"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="pre-commit needs git")


def test_hooks_file_declares_both_hooks():
    hooks = {hook["id"]: hook for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"gradlint", "gradlint-fix"}
    for hook in hooks.values():
        assert hook["language"] == "python" and hook["types"] == ["python"]
    assert "--fix" in hooks["gradlint-fix"]["entry"] and "--fix" not in hooks["gradlint"]["entry"]


@pytest.fixture(scope="module")
def pre_commit_home(tmp_path_factory):
    """One hook environment for the module: pre-commit installs gradlint into it once."""
    return tmp_path_factory.mktemp("pre-commit-home")


def try_repo(repo: Path, home: Path, hook: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "try-repo", str(ROOT), hook, "--all-files", "--color", "never"],
        cwd=repo,
        capture_output=True,
        text=True,
        env={**os.environ, "PRE_COMMIT_HOME": str(home)},
        timeout=600,
    )


def make_repo(folder: Path, text: str, **more: str) -> Path:
    """A git repository holding ``train.py`` and the files of ``more`` (name: text), all staged."""
    folder.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=folder, check=True)
    # pre-commit refuses to run in a repository whose files are not staged.
    for name, content in {"train.py": text, **more}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(content)
        subprocess.run(["git", "add", name], cwd=folder, check=True)
    return folder


def test_gradlint_hook_fails_on_a_buggy_script_and_names_the_finding(tmp_path, pre_commit_home):
    repo = make_repo(tmp_path / "buggy", BUGGY)
    done = try_repo(repo, pre_commit_home, "gradlint")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "train.py:8:5: GL001" in output


def test_gradlint_hook_passes_on_a_clean_script(tmp_path, pre_commit_home):
    repo = make_repo(tmp_path / "clean", CLEAN)
    done = try_repo(repo, pre_commit_home, "gradlint")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Passed" in done.stdout


def test_gradlint_fix_hook_rewrites_the_script(tmp_path, pre_commit_home):
    repo = make_repo(tmp_path / "fixable", BUGGY)
    done = try_repo(repo, pre_commit_home, "gradlint-fix")
    assert done.returncode == 1, done.stdout + done.stderr  # pre-commit fails a hook that changed files
    fixed = (repo / "train.py").read_text()
    assert "optimizer.zero_grad()" in fixed and fixed != BUGGY
    again = try_repo(repo, pre_commit_home, "gradlint")
    assert again.returncode == 0, again.stdout + again.stderr


def test_extend_exclude_is_honoured_for_the_files_pre_commit_names(tmp_path, pre_commit_home):
    pyproject = '[tool.gradlint]\nextend-exclude = ["vendored/**"]\n'
    repo = make_repo(tmp_path / "excluded", CLEAN, **{"pyproject.toml": pyproject, "vendored/old_train.py": BUGGY})
    done = try_repo(repo, pre_commit_home, "gradlint")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "GL001" not in done.stdout
    (repo / "pyproject.toml").write_text("[tool.gradlint]\n")  # the same files, nothing excluded: the hook fails
    subprocess.run(["git", "add", "pyproject.toml"], cwd=repo, check=True)
    done = try_repo(repo, pre_commit_home, "gradlint")
    assert done.returncode == 1 and "vendored/old_train.py:8:5: GL001" in done.stdout, done.stdout


def test_a_syntax_error_fails_the_hook_even_in_a_file_no_rule_could_fire_on(tmp_path, pre_commit_home):
    repo = make_repo(tmp_path / "broken", CLEAN, **{"util.py": "import os\n\ndef broken(:\n    pass\n"})
    for hook in ("gradlint", "gradlint-fix"):
        done = try_repo(repo, pre_commit_home, hook)
        assert done.returncode == 1, done.stdout + done.stderr  # pre-commit reports any non-zero exit as 1
        assert "util.py: cannot parse: invalid syntax (line 3, column 12)" in done.stdout + done.stderr
