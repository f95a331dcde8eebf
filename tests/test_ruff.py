"""gradlint beside the real ruff: the README's ``lint.external`` setting keeps ``# noqa: GL001``, in ruff and in pre-commit."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed (it is in the dev extra)")

SILENCED = textwrap.dedent(
    """\
    def train(model, optimizer, loss_fn, loader):
        for x, y in loader:
            loss_fn(model(x), y).backward()
            optimizer.step()  # noqa: GL001
    """
)


def readme_ruff_setting() -> str:
    """The ``[tool.ruff.lint]`` block the README tells users to add."""
    return next(block for block in re.findall(r"```toml\n(.*?)```", README, re.DOTALL) if "[tool.ruff.lint]" in block)


def ruff(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def gradlint(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gradlint", "--no-cache", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("external", [True, False])
def test_ruff_keeps_the_gl_noqa_only_with_the_readme_setting(tmp_path, external):
    (tmp_path / "pyproject.toml").write_text(readme_ruff_setting() if external else "[tool.ruff.lint]\n")
    (tmp_path / "train.py").write_text(SILENCED)
    fixed = ruff(tmp_path, "check", "--fix", "--extend-select", "RUF100,RUF102", "train.py")
    after = (tmp_path / "train.py").read_text()
    if external:
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert after == SILENCED
        assert gradlint(tmp_path, "train.py").returncode == 0
    else:
        assert "# noqa" not in after  # ruff removed the comment as an invalid code ...
        assert "train.py:4:9: GL001" in gradlint(tmp_path, "train.py").stdout  # ... and the finding is back


@pytest.mark.skipif(shutil.which("git") is None, reason="pre-commit needs git")
@pytest.mark.parametrize("external", [True, False])
def test_one_pre_commit_run_with_ruff_and_gradlint(tmp_path, external):
    """Both tools as pre-commit hooks, with the entries they ship, in one commit check."""
    gradlint_entry = next(h["entry"] for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text()) if h["id"] == "gradlint")
    bin_dir = Path(sys.executable).parent
    config = {
        "repos": [
            {
                "repo": "local",
                "hooks": [
                    # ruff-pre-commit's ruff-check hook runs `ruff check --force-exclude`.
                    {"id": "ruff-check", "name": "ruff check", "language": "system", "types": ["python"],
                     "entry": f"{bin_dir / 'ruff'} check --force-exclude --fix --extend-select RUF100,RUF102"},
                    {"id": "gradlint", "name": "gradlint", "language": "system", "types": ["python"],
                     "entry": str(bin_dir / gradlint_entry), "require_serial": True},
                ],
            }
        ]
    }
    repo = tmp_path / "project"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config))
    (repo / "pyproject.toml").write_text(readme_ruff_setting() if external else "[tool.ruff.lint]\n")
    (repo / "train.py").write_text(SILENCED)
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", "--all-files", "--color", "never"],
        cwd=repo, capture_output=True, text=True, env=env, timeout=600,
    )
    output = done.stdout + done.stderr
    if external:
        assert done.returncode == 0, output
        assert (repo / "train.py").read_text() == SILENCED
    else:
        assert done.returncode == 1, output
        assert "# noqa" not in (repo / "train.py").read_text()
        assert "train.py:4:9: GL001" in output
