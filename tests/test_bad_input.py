"""Bad input gets one clear line, and the run goes on with the other files (exit 2 when something was skipped)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from click.testing import CliRunner

from gradlint.cli import main
from gradlint.linter import lint_file, lint_paths, lint_text

TRAINING = (
    "import torch\n"
    "model = torch.nn.Linear(2, 1)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "for x in data:\n"
    "    model(x).sum().backward()\n"
    "    opt.step()\n"
)


def run(tmp_path, *paths):
    """Run the CLI in ``tmp_path``; return (exit code, stdout, stderr lines)."""
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        result = CliRunner().invoke(main, [str(p) for p in paths])
    finally:
        os.chdir(old)
    return result.exit_code, result.stdout, result.stderr.splitlines()


@pytest.fixture()
def good(tmp_path):
    (tmp_path / "good.py").write_text(TRAINING)
    return tmp_path


def assert_one_error_and_good_still_checked(tmp_path, name, expected_reason):
    code, out, err = run(tmp_path, ".")
    assert code == 2
    lines = [line for line in err if line.startswith(name)]
    assert len(lines) == 1, err
    assert expected_reason in lines[0], lines[0]
    assert "good.py:6:5: GL001" in out


def test_syntax_error_says_where(good):
    # A file the prefilter lets through (it backpropagates and steps): only those are parsed.
    (good / "bad.py").write_text("x = 1\nloss.backward(\nopt.step()\n")
    assert_one_error_and_good_still_checked(good, "bad.py", "cannot parse: '(' was never closed (line 2")


def test_latin1_with_coding_line_is_honoured(tmp_path):
    text = "# -*- coding: latin-1 -*-\n# caf\xe9\n" + TRAINING
    (tmp_path / "latin.py").write_bytes(text.encode("latin-1"))
    result = lint_file(str(tmp_path / "latin.py"))
    assert result.error is None
    assert [f.code for f in result.findings] == ["GL001"]
    assert result.findings[0].line == 8


def test_not_utf8_without_coding_line_is_reported(good):
    (good / "latin.py").write_bytes(("# caf\xe9\n" + TRAINING).encode("latin-1"))
    assert_one_error_and_good_still_checked(good, "latin.py", "cannot decode as utf-8 at byte 5")


def test_binary_file_named_py(good):
    (good / "blob.py").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00backward\x00\xff\xfe")
    assert_one_error_and_good_still_checked(good, "blob.py", "not a Python source file (binary content)")


@pytest.mark.parametrize("text", ["", "# only a comment\n# loss.backward() in a comment\n", "\n\n\n"])
def test_empty_and_comment_only_files_are_clean(tmp_path, text):
    (tmp_path / "empty.py").write_text(text)
    result = lint_file(str(tmp_path / "empty.py"))
    assert result.error is None and result.findings == []


def test_huge_generated_file_completes(tmp_path):
    body = "".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(50_000))
    path = tmp_path / "huge.py"
    path.write_text(TRAINING + body)
    assert len(path.read_text().splitlines()) > 100_000
    result = lint_file(str(path))
    assert result.error is None
    assert [f.code for f in result.findings] == ["GL001"]


def test_deeply_nested_code_is_an_error_not_a_crash(tmp_path):
    depth = 300
    lines = ["def train():"]
    for level in range(1, depth):
        lines.append("    " * level + f"if c{level}:")
    lines.append("    " * depth + "loss.backward()")
    (tmp_path / "deep.py").write_text("\n".join(lines) + "\n")
    result = lint_file(str(tmp_path / "deep.py"))
    assert result.findings == []
    assert result.error is None or result.error.startswith("cannot parse")


def test_deeply_nested_expression(tmp_path):
    expression = "(" * 500 + "loss" + ")" * 500
    result = lint_text(f"{expression}.backward()\n", "nested.py")
    assert result.findings == []
    assert result.error is None or result.error.startswith("cannot parse")


def test_path_that_does_not_exist(good):
    code, out, err = run(good, "missing.py", "good.py")
    assert code == 2
    assert err == ["missing.py: no such file or directory"]
    assert "good.py:6:5: GL001" in out


def test_directory_without_permission(good, monkeypatch):
    locked = good / "locked"
    locked.mkdir()
    (locked / "inner.py").write_text(TRAINING)
    if os.geteuid() == 0:  # root reads through permissions; make the listing fail as it would for a user
        real_scandir = os.scandir

        def scandir(path="."):
            if os.path.basename(os.fspath(path)) == "locked":
                raise PermissionError(13, "Permission denied", os.fspath(path))
            return real_scandir(path)

        monkeypatch.setattr(os, "scandir", scandir)
    else:
        locked.chmod(0)
    try:
        results = lint_paths([str(good)])
    finally:
        locked.chmod(0o755)
    errors = {os.path.basename(r.path): r.error for r in results if r.error}
    assert errors == {"locked": "cannot read: permission denied"}
    assert any(r.findings for r in results if r.path.endswith("good.py"))


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_symlink_loop_is_walked_once(good):
    (good / "sub").mkdir()
    (good / "sub" / "train.py").write_text(TRAINING)
    os.symlink("..", good / "sub" / "parent")
    os.symlink("self.py", good / "self.py")  # a link to itself
    results = lint_paths([str(good)])
    checked = sorted(os.path.relpath(r.path, good) for r in results if not r.error)
    assert checked == ["good.py", os.path.join("sub", "train.py")]
    errors = [os.path.basename(r.path) for r in results if r.error]
    assert errors == ["self.py"]


def test_python2_code(good):
    (good / "old.py").write_text("print 'training'\nloss.backward()\nopt.step()\n")
    assert_one_error_and_good_still_checked(good, "old.py", "cannot parse: Missing parentheses in call to 'print'")


def test_thousands_of_files(tmp_path):
    for i in range(2000):
        (tmp_path / f"m{i:04d}.py").write_text(f"VALUE = {i}\n")
    (tmp_path / "train.py").write_text(TRAINING)
    results = lint_paths([str(tmp_path)])
    assert len(results) == 2001
    assert [os.path.basename(r.path) for r in results if r.findings] == ["train.py"]


def test_internal_error_in_a_rule_is_reported_per_file(tmp_path, monkeypatch):
    from gradlint.rules import clearing

    def explode(self, model):
        raise ValueError("boom")
        yield  # pragma: no cover

    monkeypatch.setattr(clearing.MissingZeroGrad, "check", explode)
    (tmp_path / "a.py").write_text(TRAINING)
    (tmp_path / "b.py").write_text(TRAINING.replace("opt.step()", "opt.step()\n    opt.zero_grad(set_to_none=False)"))
    code, out, err = run(tmp_path, ".")
    assert code == 2
    assert "a.py: internal error in GL001: ValueError: boom" in err
    assert "b.py: internal error in GL001: ValueError: boom" in err


def run_fix(tmp_path, *paths):
    """``gradlint --fix`` in ``tmp_path``; return (exit code, stdout, stderr lines)."""
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        result = CliRunner().invoke(main, ["--fix", *[str(p) for p in paths]])
    finally:
        os.chdir(old)
    return result.exit_code, result.stdout, result.stderr.splitlines()


def test_file_changed_while_being_fixed_is_not_overwritten(good, monkeypatch):
    from gradlint import fixer

    edited = "# edited by someone else meanwhile\n" + TRAINING
    (good / "busy.py").write_text(TRAINING)
    real_fix_text = fixer.fix_text

    def fix_text_while_someone_edits(text, path, *args, **kwargs):
        outcome = real_fix_text(text, path, *args, **kwargs)
        if path.endswith("busy.py"):
            (good / "busy.py").write_text(edited)  # the edit lands after reading, before writing
        return outcome

    monkeypatch.setattr(fixer, "fix_text", fix_text_while_someone_edits)
    code, out, err = run_fix(good, ".")
    assert code == 2
    assert [line for line in err if "busy.py" in line] == [
        "busy.py: changed while being fixed; left as it is now (run again to fix it)"
    ]
    assert (good / "busy.py").read_text() == edited
    assert "opt.zero_grad()" in (good / "good.py").read_text()  # the other file was fixed
    assert not [p.name for p in good.iterdir() if p.name.endswith(".gradlint")]  # no temporary left behind


def test_read_only_file_under_fix(good):
    locked = good / "locked.py"
    locked.write_text(TRAINING)
    locked.chmod(0o444)
    try:
        code, out, err = run_fix(good, ".")
        assert code == 2
        assert [line for line in err if "locked.py" in line] == ["locked.py: cannot fix: the file is read-only; left unchanged"]
        assert locked.read_text() == TRAINING
        assert stat.S_IMODE(locked.stat().st_mode) == 0o444
        assert "opt.zero_grad()" in (good / "good.py").read_text()
    finally:
        locked.chmod(0o644)


def test_read_only_file_can_still_be_checked_and_diffed(tmp_path):
    locked = tmp_path / "locked.py"
    locked.write_text(TRAINING)
    locked.chmod(0o444)
    try:
        assert [f.code for f in lint_file(str(locked)).findings] == ["GL001"]
        from gradlint.fixer import fix_file

        outcome = fix_file(str(locked), write=False)
        assert outcome.result.error is None and outcome.changed
        assert locked.read_text() == TRAINING
    finally:
        locked.chmod(0o644)


DEEP = {
    "sum.py": "loss = a" + " + a" * 20000 + "\nloss.backward()\nopt.step()\n",  # crashed LibCST's parser (stack overflow)
    "flags.py": "ok = a" + " and a" * 20000 + "\nloss.backward()\nopt.step()\n",  # flat for Python, nested for LibCST
    "negations.py": "x = " + "-" * 20000 + "a\nloss.backward()\nopt.step()\n",
    "brackets.py": "x = " + "[" * 5000 + "]" * 5000 + "\nloss.backward()\nopt.step()\n",
    "chain.py": "x = a" + ".b" * 20000 + "\nloss.backward()\nopt.step()\n",
    "bytes_and_text.py": "x = b'\\xff' 'text'\nloss.backward()\nopt.step()\n",  # Python reads it; LibCST refuses it
}


def test_code_too_deep_for_libcst_is_one_line_not_a_crash(good):
    for name, text in DEEP.items():
        (good / name).write_text(text)
    # In a child process: a crash of the parser must fail this test, not end the test run.
    completed = subprocess.run(
        [sys.executable, "-m", "gradlint", "--isolated", "."], cwd=good, capture_output=True, text=True, timeout=600
    )
    assert completed.returncode == 2, completed.stderr[-2000:]
    errors = dict(line.split(": ", 1) for line in completed.stderr.splitlines())
    assert set(errors) == set(DEEP)
    assert all(reason.endswith("code nested too deeply") for name, reason in errors.items() if name != "bytes_and_text.py")
    assert errors["bytes_and_text.py"] == "cannot parse: Cannot concatenate string and bytes."
    assert "good.py:6:5: GL001" in completed.stdout


def test_long_but_ordinary_chains_are_checked(tmp_path):
    text = TRAINING.replace("for x in data:", "if a" + " and a" * 150 + " or b" * 150 + ":\n    pass\nfor x in data:")
    result = lint_text(text, "flags.py")
    assert result.error is None
    assert [f.code for f in result.findings] == ["GL001"]
