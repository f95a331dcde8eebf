"""The flake8 plugin: the real ``flake8 --select GL`` reports what ``gradlint`` reports, in one process or several."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixture_markers import FIXTURES
from gradlint.old_syntax import stand_in

FLAKE8_FORMAT = "%(path)s|%(row)d|%(col)d|%(code)s|%(text)s"


def flake8(cwd: Path, *args: str) -> set[tuple]:
    done = subprocess.run(
        [sys.executable, "-m", "flake8", "--isolated", f"--format={FLAKE8_FORMAT}", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    assert done.returncode in (0, 1), done.stderr
    rows = set()
    for line in done.stdout.splitlines():
        path, row, col, code, text = line.split("|", 4)
        rows.add((Path(path).as_posix().removeprefix("./"), int(row), int(col), code, text))
    return rows


def gradlint(cwd: Path, *args: str) -> set[tuple]:
    done = subprocess.run(
        [sys.executable, "-m", "gradlint", "--isolated", "--no-cache", "--output-format", "json", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    assert done.returncode in (0, 1), done.stderr
    return {(Path(f["path"]).as_posix(), f["line"], f["column"], f["code"], f["message"]) for f in json.loads(done.stdout)}


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    """The marker fixtures (not the fixed twins), where neither tool finds a configuration file."""
    root = tmp_path_factory.mktemp("flake8")
    # crossfile: flake8 checks one file at a time, so it cannot see a loop in another module (tests/test_crossfile.py)
    shutil.copytree(FIXTURES, root / "fixtures", ignore=shutil.ignore_patterns("fixed", "crossfile"))
    # Python 3.6 code with ``async`` as a name: flake8's own parser refuses it (E999) and runs no plugin on it,
    # while gradlint reads it through a stand-in (tests/test_old_syntax.py).
    for path in (root / "fixtures").rglob("*.py"):
        if stand_in(path.read_text(encoding="utf-8")) is not None:
            path.unlink()
    return root


@pytest.fixture(scope="module")
def expected(fixtures) -> set[tuple]:
    found = gradlint(fixtures, "fixtures")
    assert len(found) > 20
    return found


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_flake8_agrees_with_gradlint_on_every_fixture(fixtures, expected, jobs):
    assert flake8(fixtures, "--select", "GL", "-j", jobs, "fixtures") == expected


def test_flake8_agrees_with_gradlint_when_every_rule_is_selected(fixtures):
    every = gradlint(fixtures, "--select", "GL0,GL1,GL2,GL3", "fixtures")
    assert any(code == "GL204" for _, _, _, code, _ in every)  # an off-by-default rule fires here
    assert flake8(fixtures, "--select", "GL0,GL1,GL2,GL3", "fixtures") == every
    assert gradlint(fixtures, "--select", "ALL", "fixtures") == every  # ALL: gradlint's spelling of every rule


@pytest.mark.parametrize(
    "flake8_args, gradlint_codes, has_gl204",
    [
        (["--select", "GL"], "GL", False),
        (["--select", "GL0"], "GL0", False),
        (["--select", "GL,GL204"], "GL,GL204", True),
        (["--select", "GL2"], "GL2", True),
        (["--select", "GL", "--extend-select", "GL204"], "GL,GL204", True),
    ],
)
def test_one_meaning_of_select_in_flake8_and_gradlint(fixtures, expected, flake8_args, gradlint_codes, has_gl204):
    """``--select GL`` is the default rules in both; a longer code turns GL204 on in both."""
    got = flake8(fixtures, *flake8_args, "fixtures")
    assert got == gradlint(fixtures, "--select", gradlint_codes, "fixtures")
    assert any(code == "GL204" for _, _, _, code, _ in got) == has_gl204
    if gradlint_codes == "GL":
        assert got == expected  # the same as no selection at all


def test_columns_are_one_based_in_both(tmp_path):
    (tmp_path / "train.py").write_text(
        "def train(model, opt, data):\n"
        "    for x in data:\n"
        "        model(x).sum().backward()\n"
        "        opt.step()\n"
    )
    [row] = flake8(tmp_path, "--select", "GL", "train.py")
    assert row[1:4] == (4, 9, "GL001")
    assert gradlint(tmp_path, "train.py") == {row}


def test_flake8_applies_noqa_itself(tmp_path):
    (tmp_path / "train.py").write_text(
        "for x in data:\n"
        "    model(x).sum().backward()\n"
        "    opt.step()  # noqa: GL001\n"
    )
    assert flake8(tmp_path, "--select", "GL", "train.py") == set()
    assert gradlint(tmp_path, "train.py") == set()
    # The plugin leaves the comment to flake8: --disable-noqa brings the finding back.
    assert {row[3] for row in flake8(tmp_path, "--select", "GL", "--disable-noqa", "train.py")} == {"GL001"}


def test_plugin_is_registered_under_the_gl_prefix():
    done = subprocess.run([sys.executable, "-m", "flake8", "--version"], capture_output=True, text=True)
    assert "gradlint" in done.stdout
