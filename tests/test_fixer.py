"""Fixing files: what --fix, --unsafe-fixes and --diff write, print and exit with, and how files are written."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import libcst as cst
import pytest
from click.testing import CliRunner

from gradlint import fixer
from gradlint.cli import main
from gradlint.fixer import fix_file, fix_text

MISSING_CLEAR = """\
import torch

optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
"""

UNSCALED = """\
import torch

optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for i, (x, y) in enumerate(loader):
    loss = loss_fn(model(x), y)
    loss.backward()
    if (i + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
"""

CLEAN = """\
import torch

optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
"""


def _run(*args):
    return CliRunner().invoke(main, ["check", "--isolated", *args])


def test_fix_writes_the_fixed_file_reports_what_is_left_and_counts_the_fixes(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(MISSING_CLEAR + "\n" + UNSCALED.replace("import torch\n", ""))
    result = _run("--fix", str(path))
    text = path.read_text()
    assert "    optimizer.step()\n    optimizer.zero_grad()\n" in text  # GL001 fixed (safe)
    assert "    loss.backward()\n    if (i + 1)" in text  # GL004 left alone (unsafe)
    assert "GL004" in result.output and "GL001" not in result.output
    assert "Fixed 1 problem." in result.output
    assert result.exit_code == 1


def test_unsafe_fixes_also_applies_the_unsafe_ones_and_exits_clean(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(UNSCALED)
    result = _run("--fix", "--unsafe-fixes", str(path))
    assert "    (loss / accum).backward()\n" in path.read_text()
    assert "All checks passed" in result.output and "Fixed 1 problem." in result.output
    assert result.exit_code == 0


def test_diff_prints_a_unified_diff_writes_nothing_and_exits_1(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(MISSING_CLEAR)
    before = path.stat().st_mtime_ns
    result = _run("--diff", str(path))
    assert result.exit_code == 1
    assert f"--- a/{path}" in result.output and "+    optimizer.zero_grad()" in result.output
    assert path.read_text() == MISSING_CLEAR and path.stat().st_mtime_ns == before


def test_diff_with_nothing_to_fix_exits_0(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(CLEAN)
    result = _run("--diff", str(path))
    assert result.exit_code == 0
    assert "---" not in result.output


def test_diff_shows_unsafe_fixes_only_when_asked_and_says_they_exist(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(UNSCALED)
    hidden = _run("--diff", str(path))
    assert hidden.exit_code == 0 and "+++" not in hidden.stdout
    assert hidden.stderr == "Would fix 0 problems in 0 files. 1 fix available with `--unsafe-fixes`.\n"
    shown = _run("--diff", "--unsafe-fixes", str(path))
    assert shown.exit_code == 1 and "+    (loss / accum).backward()" in shown.output
    assert shown.stderr == "Would fix 1 problem in 1 file.\n"


def test_summary_counts_safe_fixes_and_names_the_unsafe_ones(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(MISSING_CLEAR + "\n" + UNSCALED.replace("import torch\n", ""))
    plain = _run(str(path)).stdout.splitlines()[-1]
    assert plain == "Found 2 problems in 1 file (1 file checked; 1 fixable with `--fix`). 1 fix available with `--unsafe-fixes`."
    unsafe = _run("--unsafe-fixes", str(path)).stdout.splitlines()[-1]
    assert unsafe == "Found 2 problems in 1 file (1 file checked; 2 fixable with `--fix`)."
    fixed = _run("--fix", str(path)).stdout.splitlines()[-1]
    assert fixed == "Found 1 problem in 1 file (1 file checked). Fixed 1 problem. 1 fix available with `--unsafe-fixes`."


def test_a_file_with_nothing_to_fix_keeps_its_bytes_and_mtime(tmp_path):
    path = tmp_path / "clean.py"
    path.write_text(CLEAN)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    result = _run("--fix", "--unsafe-fixes", str(path))
    assert result.exit_code == 0 and "Fixed 0 problems." in result.output
    assert path.read_text() == CLEAN and path.stat().st_mtime_ns == 1_000_000_000


def test_fixing_keeps_crlf_line_endings_encoding_and_permissions(tmp_path):
    path = tmp_path / "legacy.py"
    text = "# -*- coding: latin-1 -*-\n# entraînement\n" + MISSING_CLEAR
    path.write_bytes(text.replace("\n", "\r\n").encode("latin-1"))
    path.chmod(0o751)
    outcome = fix_file(str(path))
    assert outcome.fixed == 1
    data = path.read_bytes()
    assert b"\r\n    optimizer.zero_grad()\r\n" in data
    assert data.count(b"\n") == data.count(b"\r\n")
    assert "entraînement".encode("latin-1") in data
    assert stat.S_IMODE(path.stat().st_mode) == 0o751


def test_fixing_keeps_a_utf8_bom(tmp_path):
    path = tmp_path / "bom.py"
    path.write_bytes(b"\xef\xbb\xbf" + MISSING_CLEAR.encode())
    fix_file(str(path))
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    assert b"optimizer.zero_grad()" in path.read_bytes()


def test_fixing_through_a_symlink_rewrites_the_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "real.py"
    target.write_text(MISSING_CLEAR)
    link = tmp_path / "link.py"
    link.symlink_to(target)
    fix_file(str(link))
    assert link.is_symlink()
    assert "optimizer.zero_grad()" in target.read_text()


def test_no_temporary_file_is_left_behind(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(MISSING_CLEAR)
    fix_file(str(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_a_fix_that_would_not_parse_leaves_the_file_untouched_with_an_error(tmp_path, monkeypatch):
    def broken(module, edits):
        return SimpleNamespace(code=module.code + "    optimizer.zero_grad(\n")

    monkeypatch.setattr(fixer, "apply_edits", broken)
    path = tmp_path / "train.py"
    path.write_text(MISSING_CLEAR)
    result = _run("--fix", str(path))
    assert path.read_text() == MISSING_CLEAR
    assert "GL001 would produce code that does not parse" in result.output
    assert result.exit_code == 2


def test_noqa_for_the_fixed_rule_leaves_its_line_alone_and_the_rest_is_fixed():
    text = MISSING_CLEAR.replace("    optimizer.step()\n", "    optimizer.step()  # noqa: GL001\n")
    text += "for x, y in loader:\n    optimizer.zero_grad(set_to_none=False)\n    loss_fn(model(x), y).backward()\n    optimizer.step()\n"
    outcome = fix_text(text)
    assert outcome.text == text.replace("set_to_none=False", "set_to_none=True")
    assert outcome.fixed == 1


def test_a_second_fix_changes_nothing():
    once = fix_text(MISSING_CLEAR + UNSCALED.replace("import torch\n", ""), unsafe=True)
    twice = fix_text(once.text, unsafe=True)
    assert once.fixed == 2 and twice.fixed == 0 and twice.text == once.text


def test_fixes_that_touch_the_same_code_are_applied_one_after_the_other():
    # GL003 moves the clear and GL005 rewrites it: the same line, so two rounds.
    text = (
        "for i, (x, y) in enumerate(loader):\n"
        "    optimizer.zero_grad(set_to_none=False)\n"
        "    (loss_fn(model(x), y) / k).backward()\n"
        "    if (i + 1) % k == 0:\n"
        "        optimizer.step()\n"
    )
    outcome = fix_text(text)
    assert outcome.fixed == 2
    assert outcome.text == (
        "for i, (x, y) in enumerate(loader):\n"
        "    (loss_fn(model(x), y) / k).backward()\n"
        "    if (i + 1) % k == 0:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad(set_to_none=True)\n"
    )


def test_the_clear_goes_after_the_scaler_update_only_when_every_path_from_the_step_reaches_it():
    # The update after `if ...: continue` runs on boundary micro-batches only: a clear after it would leave
    # the every-iteration step uncleared, and each round would add another.
    text = (
        "for i, (x, y) in enumerate(loader):\n"
        "    scaler.scale(loss_fn(model(x), y)).backward()\n"
        "    scaler.step(optimizer)\n"
        "    if (i + 1) % log_every != 0:\n"
        "        continue\n"
        "    scaler.update()\n"
    )
    outcome = fix_text(text)
    assert outcome.fixed == 1
    assert "    scaler.step(optimizer)\n    optimizer.zero_grad()\n    if (i + 1)" in outcome.text
    assert not [f for f in outcome.result.findings if f.code == "GL001"]


def test_fixing_stops_after_a_bounded_number_of_rounds(monkeypatch):
    # A fix that never makes its finding go away must not loop forever.
    rounds = []
    real_apply = fixer.apply_edits

    def counting(module, edits):
        rounds.append(1)
        return real_apply(module, edits).with_changes(footer=[*module.footer, cst.EmptyLine(comment=cst.Comment(f"# {len(rounds)}"))])

    monkeypatch.setattr(fixer, "apply_edits", counting)
    monkeypatch.setattr(fixer, "_lint_round", lambda model, *args: ([], _always_one_candidate(model)))
    outcome = fix_text(MISSING_CLEAR)
    assert len(rounds) == fixer.MAX_ROUNDS
    assert outcome.fixed == fixer.MAX_ROUNDS


def _always_one_candidate(model):
    from gradlint.findings import Finding, Severity

    finding = Finding("<string>", 1, 1, 1, 1, "GL001", "missing-zero-grad", "", Severity.ERROR, None)
    return [fixer._Candidate(finding, [], [(1, 1)])]


def test_a_file_that_does_not_parse_is_reported_and_not_touched(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("loss.backward(\nopt.step()\n")  # passes the prefilter, so it is parsed
    result = _run("--fix", str(path))
    assert result.exit_code == 2 and "cannot parse" in result.output
    assert path.read_text() == "loss.backward(\nopt.step()\n"


@pytest.mark.parametrize("flag", ["--fix", "--diff"])
def test_folders_are_walked_like_a_plain_check(tmp_path, flag):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(MISSING_CLEAR)
    (tmp_path / "pkg" / "b.py").write_text(CLEAN)
    result = _run(flag, str(tmp_path))
    assert result.exit_code in (0, 1)
    changed = "optimizer.zero_grad()" in (tmp_path / "pkg" / "a.py").read_text().split("optimizer.step()")[-1]
    assert changed == (flag == "--fix")
    assert (tmp_path / "pkg" / "b.py").read_text() == CLEAN


def test_torch_autograd_backward_is_not_mistaken_for_a_loss():
    text = (
        "scaler = torch.amp.GradScaler()\n"
        "for i, (x, y) in enumerate(loader):\n"
        "    torch.autograd.backward(loss_fn(model(x), y))\n"
        "    if (i + 1) % k == 0:\n"
        "        scaler.step(optimizer)\n"
        "        scaler.update()\n"
        "        optimizer.zero_grad()\n"
    )
    outcome = fix_text(text, unsafe=True)
    # The loss is the argument, as with ``import torch`` in view: it is divided, ``torch.autograd`` never is.
    assert outcome.text == text.replace("loss_fn(model(x), y))", "loss_fn(model(x), y) / k)")
    assert outcome.fixed == 1
    assert {f.code for f in outcome.result.findings} == {"GL101"}  # what is left once GL004 is fixed
