"""Where a finding stands: at the call the user changes when the problem lies between a helper and its caller."""

from __future__ import annotations

from pathlib import Path

from fixture_markers import FIXTURES
from gradlint.fixer import fix_text
from gradlint.linter import lint_file, lint_text


def _messages(path: Path, code: str) -> dict[int, str]:
    return {f.line: f.message for f in lint_file(str(path)).findings if f.code == code}


def test_a_clip_helper_called_before_unscale_is_reported_at_the_call_naming_the_helper_line():
    messages = _messages(FIXTURES / "amp" / "clip_helper_called_before_unscale.py", "GL103")
    assert sorted(messages) == [26]
    assert messages[26].endswith("(line 18, in `self._clip_gradients`, which this call runs)")


def test_a_clip_inside_a_step_helper_with_its_own_guarded_step_stays_inside():
    messages = _messages(FIXTURES / "accumulation" / "clip_helper_called_every_micro_batch.py", "GL006")
    assert sorted(messages) == [20, 29]
    assert "which this call runs" not in messages[20]
    assert "(line 17, in `self._clip_gradients`, which this call runs)" in messages[29]


def test_a_step_helper_with_its_own_guard_is_one_finding_at_its_backward():
    findings = lint_file(str(FIXTURES / "distributed" / "step_helper_with_own_guard_reported_once.py")).findings
    assert [(f.line, f.code) for f in findings if f.code == "GL302"] == [(18, "GL302")]


def test_a_helper_that_also_backpropagates_keeps_its_finding():
    """Moving ``self.train_step(batch)`` would move the backward too: the clear inside is the line to change."""
    path = FIXTURES / "accumulation" / "trainer_class_clear_in_step_helper.py"
    clear = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if "zero_grad()  # expect: GL003" in line)
    assert "def train_step" in path.read_text().splitlines()[clear - 2]  # the clear inside the helper, not the call
    assert sorted(_messages(path, "GL003")) == [clear]


def test_a_backward_is_reported_where_its_loss_is_made():
    """Handed the loss by its caller, the backward helper is reported at the call; a helper that computes the loss
    itself is reported at its backward."""
    handed = _messages(FIXTURES / "accumulation" / "loss_in_output_dict_unscaled.py", "GL004")
    assert sorted(handed) == [23] and "(line 17, in `self.backward_step`, which this call runs)" in handed[23]
    computed = _messages(FIXTURES / "accumulation" / "fp16_loss_scale_undone_still_summed.py", "GL004")
    assert computed and all("which this call runs" not in m for m in computed.values())


def test_the_fix_of_a_finding_at_the_call_still_edits_the_helper():
    text = (FIXTURES / "clearing" / "optimizer_step_helper_no_clear.py").read_text(encoding="utf-8")
    findings = [f for f in lint_text(text, "seg.py").findings if f.code == "GL001"]
    assert [f.line for f in findings] == [22]
    fixed = fix_text(text, "seg.py").text
    assert "    optimizer.step()\n    optimizer.zero_grad()\n" in fixed
    assert "            optimizer_step(opt, sched)  # expect: GL001\n" in fixed


def test_a_clear_off_the_path_is_named_in_the_message():
    messages = _messages(FIXTURES / "clearing" / "clear_on_one_branch_only.py", "GL001")
    assert sorted(messages) == [26, 33]
    assert "runs only in the other branch of the `if` at line 16" in messages[26]
    assert "runs only when `step % log_every == 0` (line 34)" in messages[33]
