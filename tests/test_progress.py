"""Logs stay clean: a progress line only on a terminal, and ``--quiet`` prints findings and errors only."""

from __future__ import annotations

import io
import textwrap

import pytest
from click.testing import CliRunner

from gradlint.cli import main
from gradlint.progress import StatusLine

BUGGY = textwrap.dedent(
    """\
    for x, y in loader:
        loss_fn(model(x), y).backward()
        optimizer.step()
    """
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_status_line_redraws_in_place_on_a_terminal_and_erases_itself():
    stream = Terminal()
    status = StatusLine("measure: ", stream)
    status.update("step 1/5")
    status.update("step 2/5")
    status.close()
    assert stream.getvalue() == "\r\x1b[Kmeasure: step 1/5\r\x1b[Kmeasure: step 2/5\r\x1b[K"


@pytest.mark.parametrize("stream, quiet", [(io.StringIO(), False), (Terminal(), True)])
def test_status_line_writes_nothing_off_a_terminal_or_when_quiet(stream, quiet):
    status = StatusLine("measure: ", stream, quiet=quiet)
    status.update("step 1/5")
    status.close()
    assert stream.getvalue() == ""


def test_measure_writes_no_carriage_returns_into_a_log(tmp_path):
    pytest.importorskip("torch")
    from gradlint.runtime.commands import measure_command

    script = tmp_path / "bad.py"
    script.write_text("import torch\nraise RuntimeError('no data')\n")
    result = CliRunner().invoke(measure_command, [str(script)])  # not a terminal, as in CI
    assert result.exit_code == 2
    assert "\r" not in result.output and "\x1b" not in result.output
    # The script's own traceback first, then gradlint's one line
    assert result.stderr.startswith("Traceback") and "RuntimeError: no data" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("gradlint measure: ") and "no data" in result.stderr.splitlines()[-1]


@pytest.fixture()
def tree(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "buggy.py").write_text(BUGGY)
    (tmp_path / "clean.py").write_text(BUGGY + "    optimizer.zero_grad()\n")
    return tmp_path


def test_quiet_prints_the_findings_and_nothing_else(tree):
    loud = CliRunner().invoke(main, ["--isolated", "buggy.py"])
    quiet = CliRunner().invoke(main, ["--isolated", "-q", "buggy.py"])
    assert quiet.exit_code == loud.exit_code == 1
    assert loud.stdout.splitlines()[-1].startswith("Found 1 problem")
    assert quiet.stdout == "".join(line + "\n" for line in loud.stdout.splitlines()[:-1])
    assert quiet.stdout.startswith("buggy.py:3:5: GL001") and quiet.stderr == ""


def test_quiet_keeps_errors_and_drops_the_diff_summary(tree):
    (tree / "broken.py").write_text("def broken(:\n")
    clean = CliRunner().invoke(main, ["--isolated", "--quiet", "clean.py"])
    assert clean.exit_code == 0 and clean.output == ""
    broken = CliRunner().invoke(main, ["--isolated", "--quiet", "broken.py"])
    assert broken.exit_code == 2 and broken.stderr.startswith("broken.py: cannot parse")
    diff = CliRunner().invoke(main, ["--isolated", "--quiet", "--diff", "buggy.py"])
    assert diff.exit_code == 1 and diff.stdout.startswith("--- a/buggy.py") and "Would fix" not in diff.output
