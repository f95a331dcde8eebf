"""Python 3.6 code with ``async``/``await`` as names is checked through a same-length stand-in, never rewritten."""

from __future__ import annotations

import json
import subprocess
import sys

from gradlint.config import Config
from gradlint.fixer import fix_text
from gradlint.linter import OLD_NAMES, lint_text
from gradlint.old_syntax import stand_in

OLD = '''import torch
from torch.nn.utils import clip_grad_norm_


def train(model, loader, optimizer, criterion, accum):
    note = "async=True moved to non_blocking"  # async as a keyword argument
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x.cuda(async=True)), y.cuda(async=True))
        loss.backward()
        clip_grad_norm_(model.parameters(async=True), 1.0)
        if (i + 1) % accum == 0:
            optimizer.step()
'''


def test_the_stand_in_replaces_only_names_and_keeps_every_position():
    text = OLD + "\n\nasync def fetch(queue):\n    await queue.get()\n"
    substitute = stand_in(text)
    assert substitute is not None and substitute.originals == {"asyn_": "async"}
    replaced = substitute.text
    assert len(replaced) == len(text)
    assert [len(line) for line in replaced.splitlines()] == [len(line) for line in text.splitlines()]
    assert replaced.count("async") == text.count("async") - 3  # the three keyword arguments, nothing else
    assert '"async=True moved to non_blocking"  # async as a keyword argument' in replaced
    assert "async def fetch" in replaced and "await queue.get()" in replaced


def test_no_stand_in_for_code_that_parses_or_that_python_36_refuses_too():
    assert stand_in("x = 1\n") is None
    assert stand_in("async def f():\n    await g()\n") is None  # nothing used as a name
    assert stand_in("x = y.cuda(async=True)\ndef broken(:\n") is None


def test_old_code_is_checked_and_messages_quote_the_original_text():
    result = lint_text(OLD, "old.py", Config())
    assert result.error is None
    found = {(f.line, f.code): f for f in result.findings}
    assert set(found) == {(9, "GL004"), (10, "GL006"), (12, "GL001")}
    clip = found[(10, "GL006")]
    assert clip.column == 9 and "model.parameters(async=True)" in clip.message
    assert all("asyn_" not in f.message for f in result.findings)
    assert all(f.fix is None for f in result.findings)  # the fixer will not rewrite such a file


def test_a_file_that_fails_for_another_reason_keeps_its_own_error():
    text = OLD + "def broken(:\n    pass\n"
    result = lint_text(text, "broken.py", Config())
    # Python's own parser names the first line it cannot read as Python 3.11: the first `async=True`
    assert result.findings == [] and result.error == "cannot parse: invalid syntax (line 8, column 39)"


def test_fix_leaves_the_file_as_it_was(tmp_path):
    """The findings claim no fix, so ``--fix`` has nothing to do: the file stays byte for byte."""
    path = tmp_path / "old.py"
    path.write_text(OLD)
    run = subprocess.run(
        [sys.executable, "-m", "gradlint", "check", "--fix", "--output-format", "json", str(path)],
        capture_output=True, text=True,
    )
    assert path.read_text() == OLD
    assert run.returncode == 1
    found = json.loads(run.stdout)
    assert {f["code"] for f in found} == {"GL001", "GL004", "GL006"} and all(f["fix"] is None for f in found)


def test_the_fixer_refuses_to_write_a_stand_in_and_still_reports():
    """Asked directly (as for a file whose findings once claimed a fix), the fixer writes nothing and says why."""
    outcome = fix_text(OLD, "old.py", Config(), unsafe=True)
    assert outcome.text == OLD and outcome.fixed == 0
    assert outcome.result.error == "cannot fix: " + OLD_NAMES
    assert {f.code for f in outcome.result.findings} == {"GL001", "GL004", "GL006"}
