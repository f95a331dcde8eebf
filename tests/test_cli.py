"""The command line: exit codes, output formats, selection, configuration and noqa."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gradlint import __version__, output
from gradlint.cli import main

BUGGY = textwrap.dedent(
    """\
    import torch

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
    """
)
CLEAN = BUGGY + "    optimizer.zero_grad()\n"
FIXTURE_GL204 = Path(__file__).resolve().parent.parent / "fixtures" / "release" / "gl204_plain_loop.py"
BROKEN = "def broken(:\n    loss.backward()\n    opt.step()\n"  # passes the prefilter: it backpropagates and steps


@pytest.fixture()
def tree(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "buggy.py").write_text(BUGGY)
    (tmp_path / "clean.py").write_text(CLEAN)
    return tmp_path


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_clean_file_exits_zero(tree):
    result = invoke("clean.py")
    assert result.exit_code == 0, result.output
    assert "All checks passed (1 file checked)." in result.output


def test_finding_exits_one_with_path_line_column_code(tree):
    result = invoke("buggy.py")
    assert result.exit_code == 1
    first = result.output.splitlines()[0]
    assert first.startswith("buggy.py:8:5: GL001 `optimizer` is stepped at line 8")


def test_check_subcommand_is_the_same_as_the_default(tree):
    assert invoke("check", "buggy.py").output == invoke("buggy.py").output


def test_folder_is_walked_and_findings_sorted(tree):
    (tree / "sub").mkdir()
    (tree / "sub" / "more.py").write_text(BUGGY)
    result = invoke(".")
    paths = [line.split(":")[0] for line in result.output.splitlines() if ": GL" in line]
    assert paths == ["buggy.py", os.path.join("sub", "more.py")]


def test_json_output_has_every_field(tree):
    result = invoke("--output-format", "json", "buggy.py")
    assert result.exit_code == 1
    (finding,) = json.loads(result.output)
    assert finding == {
        "path": "buggy.py",
        "line": 8,
        "column": 5,
        "end_line": 8,
        "end_column": 21,
        "code": "GL001",
        "name": "missing-zero-grad",
        "message": finding["message"],
        "severity": "error",
        "fix": "safe",
        "url": output.rule_url("GL001", output.docs_url()),
    }
    assert "`optimizer`" in finding["message"]


def test_syntax_error_is_one_line_and_other_files_are_checked(tree):
    (tree / "broken.py").write_text(BROKEN)
    result = CliRunner().invoke(main, ["."])
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("broken.py")]
    assert len(errors) == 1 and errors[0].startswith("broken.py: cannot parse") and "line 1" in errors[0]
    assert "buggy.py:8:5: GL001" in result.stdout


def test_folder_walk_does_not_parse_a_file_no_rule_could_fire_on(tree):
    (tree / "unrelated.py").write_text("def broken(:\n    pass\n")
    result = CliRunner().invoke(main, ["."])
    assert result.exit_code == 1, result.output  # buggy.py's finding; unrelated.py is skipped unparsed
    assert "unrelated.py" not in result.output
    assert "(3 files checked" in result.stdout


@pytest.mark.parametrize("extra", [[], ["--no-cache"], ["--fix"], ["--diff"], ["-j", "2"]])
def test_named_file_with_a_syntax_error_exits_two_even_when_no_rule_could_fire(tree, extra):
    (tree / "unrelated.py").write_text("import os\n\ndef broken(:\n    pass\n")
    CliRunner().invoke(main, ["."])  # a folder walk first: its cached answer must not hide the error
    result = CliRunner().invoke(main, [*extra, "unrelated.py", "clean.py"])
    assert result.exit_code == 2, result.output
    assert "unrelated.py: cannot parse: invalid syntax (line 3, column 12)" in result.stderr.splitlines()
    assert (tree / "unrelated.py").read_text().endswith("def broken(:\n    pass\n")


def test_named_file_in_syntax_newer_than_this_python_is_not_an_error(tree):
    (tree / "generic.py").write_text("type Pair = tuple[int, int]\n\ndef first[T](items: list[T]) -> T:\n    return items[0]\n")
    result = CliRunner().invoke(main, ["generic.py"])
    assert result.exit_code == 0, result.output


def test_missing_path_exits_two(tree):
    result = invoke("nope.py")
    assert result.exit_code == 2
    assert "nope.py: no such file or directory" in result.stderr


def test_select_and_ignore(tree):
    assert invoke("--select", "GL1", "buggy.py").exit_code == 0
    assert invoke("--ignore", "GL001", "buggy.py").exit_code == 0
    assert invoke("--select", "GL0", "buggy.py").exit_code == 1
    assert invoke("--select", "GL001,GL002", "buggy.py").exit_code == 1


def test_unknown_code_is_a_usage_error(tree):
    result = invoke("--select", "GL999", "buggy.py")
    assert result.exit_code == 2
    assert "GL999" in result.output


def test_exit_zero(tree):
    result = invoke("--exit-zero", "buggy.py")
    assert result.exit_code == 0
    assert "GL001" in result.output


def test_noqa_with_code_and_bare(tree):
    lines = BUGGY.splitlines()
    lines[7] += "  # noqa: GL001"
    (tree / "quiet.py").write_text("\n".join(lines) + "\n")
    assert invoke("quiet.py").exit_code == 0
    lines[7] = lines[7].replace("# noqa: GL001", "# noqa: GL002")
    (tree / "other.py").write_text("\n".join(lines) + "\n")
    assert invoke("other.py").exit_code == 1
    lines[7] = lines[7].replace("# noqa: GL002", "# noqa")
    (tree / "bare.py").write_text("\n".join(lines) + "\n")
    assert invoke("bare.py").exit_code == 0


def test_pyproject_config_select_ignore_exclude_per_file(tree):
    (tree / "legacy").mkdir()
    (tree / "legacy" / "old.py").write_text(BUGGY)
    (tree / "tests").mkdir()
    (tree / "tests" / "t.py").write_text(BUGGY)
    (tree / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [tool.gradlint]
            extend-exclude = ["legacy/**"]
            per-file-ignores = { "tests/**" = ["GL001"] }
            """
        )
    )
    result = invoke(".")
    flagged = {line.split(":")[0] for line in result.output.splitlines() if ": GL" in line}
    assert flagged == {"buggy.py"}
    (tree / "pyproject.toml").write_text('[tool.gradlint]\nignore = ["GL001"]\n')
    assert invoke(".").exit_code == 0


def test_explicit_file_is_checked_even_when_excluded(tree):
    (tree / "pyproject.toml").write_text('[tool.gradlint]\nextend-exclude = ["buggy.py"]\n')
    assert invoke(".").exit_code == 0
    assert invoke("buggy.py").exit_code == 1


def test_force_exclude_applies_the_excludes_to_named_paths(tree):
    (tree / "legacy").mkdir()
    (tree / "legacy" / "old.py").write_text(BUGGY)
    (tree / "pyproject.toml").write_text('[tool.gradlint]\nextend-exclude = ["buggy.py", "legacy/**"]\n')
    named = ["buggy.py", "legacy/old.py", "legacy", "clean.py"]
    assert invoke(*named).exit_code == 1
    result = invoke("--force-exclude", *named)
    assert result.exit_code == 0, result.output
    assert "All checks passed (1 file checked)." in result.output
    (tree / "pyproject.toml").write_text('[tool.gradlint]\nextend-exclude = ["buggy.py"]\nforce-exclude = true\n')
    assert invoke("buggy.py").exit_code == 0
    (tree / "pyproject.toml").write_text('[tool.gradlint]\nforce-exclude = "yes"\n')
    assert "force-exclude must be true or false" in invoke("buggy.py").output


def test_bad_config_is_a_usage_error(tree):
    (tree / "pyproject.toml").write_text('[tool.gradlint]\nselct = ["GL001"]\n')
    result = invoke("buggy.py")
    assert result.exit_code == 2
    assert "unknown key(s) in [tool.gradlint]: selct" in result.output
    assert invoke("--isolated", "buggy.py").exit_code == 1


def test_rule_and_rules_commands():
    result = invoke("rule", "gl003")
    assert result.exit_code == 0
    assert result.output.startswith("GL003 zero-grad-in-accumulation (error, safe fix)\n\n")
    assert invoke("rule", "zero-grad-in-accumulation").output == result.output  # by name too
    listing = invoke("rules").output.splitlines()
    assert [line.split()[0] for line in listing][:3] == ["GL001", "GL002", "GL003"]
    assert invoke("rule", "GL999").exit_code == 2
    assert invoke("rule").exit_code == 2 and invoke("rule", "--all", "GL001").exit_code == 2


def test_rule_text_is_readable_not_restructuredtext():
    text = invoke("rule", "GL003").output  # not a terminal: no styles either
    assert "**" not in text and "``" not in text and "::" not in text and "\x1b" not in text
    assert "\nBad:\n\n    for i, (x, y) in enumerate(loader):\n        optimizer.zero_grad()\n" in text
    assert "Why it matters. Gradient accumulation" in text and "`optimizer.zero_grad()`" not in text.split("Bad:")[1]


def test_rule_markdown_has_fenced_examples_that_parse_for_every_rule():
    import ast

    from gradlint.rules import ALL_RULES

    markdown = invoke("rule", "--all", "--output-format", "markdown").output
    assert [line.split()[1] for line in markdown.splitlines() if line.startswith("## ")] == [r.code for r in ALL_RULES]
    examples = re.findall(r"```python\n(.*?)```", markdown, re.DOTALL)
    assert len(examples) == 2 * len(ALL_RULES)  # a bad and a good example each
    for example in examples:
        ast.parse(example)
    assert "``" not in markdown.replace("```", "") and "::\n" not in markdown


def test_rule_all_prints_every_rule_in_the_terminal_form():
    from gradlint.rules import ALL_RULES

    text = invoke("rule", "--all").output
    assert [line.split()[0] for line in text.splitlines() if re.match(r"GL\d{3} [a-z-]+ \(", line)] == [r.code for r in ALL_RULES]


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and __version__ in result.output


def test_installed_console_script_runs_in_a_subprocess(tree):
    script = Path(sys.executable).with_name("gradlint")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "gradlint"]
    completed = subprocess.run([*command, "buggy.py", "clean.py"], capture_output=True, text=True, cwd=tree, timeout=120)
    assert completed.returncode == 1, completed.stderr
    assert completed.stdout.startswith("buggy.py:8:5: GL001")
    assert "Found 1 problem in 1 file (2 files checked" in completed.stdout


def test_select_gl_means_the_default_rules_and_a_longer_code_turns_gl204_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(FIXTURE_GL204, tmp_path / "plain.py")

    def codes(*args):
        return {line.split()[1] for line in invoke("--no-cache", *args, "plain.py").output.splitlines() if ": GL" in line}

    assert "GL204" not in codes() and codes() == codes("--select", "GL")
    assert "GL204" in codes("--select", "GL2") and "GL204" in codes("--select", "GL,GL204") and "GL204" in codes("--select", "ALL")
    (tmp_path / "pyproject.toml").write_text('[tool.gradlint]\nselect = ["GL"]\n')
    assert "GL204" not in codes()
    (tmp_path / "pyproject.toml").write_text('[tool.gradlint]\nselect = ["GL", "GL204"]\n')
    assert "GL204" in codes()


def test_rule_text_is_bold_where_the_terminal_takes_styles():
    styled = CliRunner().invoke(main, ["rule", "GL001"], color=True).output
    assert "\x1b[1mGL001 missing-zero-grad" in styled and "\x1b[1mWhy it matters.\x1b[0m" in styled


@pytest.mark.parametrize("command", [[], ["check"], ["rule"], ["rules"], ["run"], ["measure"]])
def test_help_fits_an_80_column_terminal_without_cutting_anything(command):
    done = subprocess.run(
        [sys.executable, "-m", "gradlint", *command, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    # Click cuts a short help with "..."; "[ARGS]..." in the usage line is notation.
    assert not any(line.rstrip().endswith("...") for line in lines if not line.startswith("Usage:"))
    current = main.commands[command[0]] if command else main
    for param in current.params:  # every option and its help text is there, in words
        if not isinstance(param, click.Option) or param.hidden:
            continue
        for name in param.opts:
            assert name in done.stdout
        if getattr(param, "help", None):
            assert " ".join(param.help.split()[:3]) in " ".join(done.stdout.split())
    if not command:
        for name, sub in main.commands.items():
            listed = next(line for line in lines if line.split()[:1] == [name])
            assert " ".join(listed.split()[1:]) == sub.get_short_help_str(limit=1000)


def test_named_file_compiles_without_printing_the_compilers_warnings(tmp_path):
    (tmp_path / "odd.py").write_text('def f(x):\n    return x is 1 and "\\d"\n\nasync def g():\n    return 1\n')
    script = Path(sys.executable).with_name("gradlint")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "gradlint"]
    done = subprocess.run([*command, "--isolated", "--no-cache", "odd.py"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize("text", ["return 1\n", "def f():\n    nonlocal x\n", "await g()\n"])
def test_named_file_that_python_compiles_with_an_error_but_parses_is_not_refused(tree, text):
    (tree / "script.py").write_text(text)  # errors of the compiler, not of the syntax: as a walk parses them, so do named files
    result = CliRunner().invoke(main, ["--no-cache", "script.py"])
    assert result.exit_code == 0, result.output
