"""Crash-freedom on real code: every Python file of well-known training libraries, zero internal errors.

The wheels are downloaded with pip (no dependencies, nothing installed, no
torch needed) and their ``.py`` files are checked with every rule selected,
the off-by-default ones too; the files with findings are also fixed in
memory (``--diff``). Any exception inside a rule, the model or a fix fails
the test, naming the file. The findings per code are printed for the record.
Versions are pinned so that a new release cannot turn CI red overnight.
"""

from __future__ import annotations

import ast
import collections
import os
import subprocess
import sys
import zipfile
from concurrent.futures import ProcessPoolExecutor

import pytest

from gradlint.config import Config
from gradlint.fixer import fix_text
from gradlint.linter import lint_file
from gradlint.rules import ALL_RULES
from gradlint.source import read_source

pytestmark = pytest.mark.slow

PACKAGES = [
    "transformers==5.23.0",
    "timm==1.0.31",
    "accelerate==1.15.0",
    "torchtune==0.6.1",
    "lightning==2.6.6",
    "pytorch-ignite==0.5.5",
    "diffusers==0.42.1",
    "peft==0.21.2",
    "trl==1.16.0",
]

EVERY_RULE = Config(select=tuple(rule.code for rule in ALL_RULES))


def _download(folder: str) -> list[str]:
    """The wheels of :data:`PACKAGES`, fetched into ``folder`` (kept between runs when it is a cache)."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", folder, *PACKAGES]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, f"pip download failed:\n{completed.stderr[-2000:]}"
    return sorted(os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(".whl"))


def _extract(wheels: list[str], folder: str) -> list[str]:
    """Every ``.py`` file of the wheels, unpacked under ``folder``."""
    paths = []
    for wheel in wheels:
        target = os.path.join(folder, os.path.basename(wheel).split("-")[0])
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.endswith(".py"):
                    paths.append(archive.extract(name, target))
    return sorted(paths)


def check(path: str) -> tuple[str, str | None, list[str], str | None]:
    """Lint one file, and fix it in memory when it has findings: (path, error, codes found, fixing error)."""
    result = lint_file(path, EVERY_RULE)
    codes = [f.code for f in result.findings]
    fix_error = None
    if result.findings:
        outcome = fix_text(read_source(path).text, path, EVERY_RULE, unsafe=True)
        fix_error = outcome.result.error
        if fix_error is None:
            try:
                ast.parse(outcome.text)
            except SyntaxError as error:
                fix_error = f"the fixed code does not parse: {error}"
    return path, result.error, codes, fix_error


def test_real_packages_have_no_internal_errors(tmp_path, capsys):
    cache = os.environ.get("GRADLINT_SWEEP_CACHE") or str(tmp_path / "wheels")
    os.makedirs(cache, exist_ok=True)
    paths = _extract(_download(cache), str(tmp_path / "src"))
    assert len(paths) > 4000, "the packages should hold thousands of Python files"

    # Two processes: CI has two cores, and the sweep is the longest test.
    with ProcessPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(check, paths, chunksize=16))

    internal = [f"{path}: {error}" for path, error, _, _ in outcomes if error and "internal error" in error]
    broken_fixes = [f"{path}: {error}" for path, _, _, error in outcomes if error]
    codes = collections.Counter(code for _, _, found, _ in outcomes for code in found)
    unreadable = collections.Counter(error.split(":")[0] for _, error, _, _ in outcomes if error and "internal error" not in error)
    with capsys.disabled():
        print(f"\nreal-package sweep: {len(paths)} files of {len(PACKAGES)} packages")
        print("  findings per code: " + (", ".join(f"{code} {n}" for code, n in sorted(codes.items())) or "none"))
        if unreadable:
            print("  files not checked: " + ", ".join(f"{reason} {n}" for reason, n in sorted(unreadable.items())))
    assert internal == [], "\n".join(internal)
    assert broken_fixes == [], "\n".join(broken_fixes)
