"""Every rule documents itself: code, name, summary, and a docstring with a bad and a good example."""

from __future__ import annotations

import dataclasses
import re
import textwrap

import libcst as cst
import pytest
from click.testing import CliRunner

from gradlint.cli import main
from gradlint.config import Config
from gradlint.linter import lint_text
from gradlint.rules import ALL_RULES, RULES_BY_CODE

_EXAMPLE = re.compile(r"\*\*(?P<label>Bad|Good)\*\*::\n\n(?P<body>(?:(?: {4}.*)?\n)+)")


def examples(rule) -> dict[str, str]:
    """The ``**Bad**::`` and ``**Good**::`` code blocks of a rule's documentation, dedented."""
    doc = rule.documentation() + "\n"
    return {m.group("label"): textwrap.dedent(m.group("body")).strip() + "\n" for m in _EXAMPLE.finditer(doc)}


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.code)
def test_rule_has_code_name_and_summary(rule):
    assert re.fullmatch(r"GL\d{3}", rule.code)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", rule.name)
    assert rule.summary and "\n" not in rule.summary and len(rule.summary) <= 100
    assert RULES_BY_CODE[rule.code] is rule


def test_codes_and_names_are_unique():
    assert len({r.code for r in ALL_RULES}) == len(ALL_RULES)
    assert len({r.name for r in ALL_RULES}) == len(ALL_RULES)


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.code)
def test_docstring_has_a_bad_and_a_good_example_that_parse(rule):
    doc = rule.documentation()
    assert "Why it matters" in doc and "Fix" in doc
    found = examples(rule)
    assert set(found) == {"Bad", "Good"}, f"{rule.code} documents {sorted(found)}"
    assert found["Bad"] != found["Good"]
    for code in found.values():
        cst.parse_module(code)  # raises on an example that is not Python


def _as_loop(code: str) -> str:
    """An example as a training loop: fragments are put inside a batch loop, as they would be written.

    An example that starts with imports or a class is a whole module already.
    """
    if code.startswith(("for ", "while ", "import ", "from ", "class ")):
        return code
    return "for i, (x, y) in enumerate(loader):\n" + textwrap.indent(code, "    ")


OWN_RULES = [RULES_BY_CODE[c] for c in ("GL001", "GL002", "GL003", "GL004", "GL005", "GL006", "GL007", "GL008", "GL009", "GL101", "GL102", "GL103", "GL104", "GL105", "GL303")]


@pytest.mark.parametrize("rule", OWN_RULES, ids=lambda r: r.code)
def test_bad_example_is_flagged_and_good_example_is_not(rule):
    config = dataclasses.replace(Config(), select=(rule.code,))
    found = examples(rule)
    bad = lint_text(_as_loop(found["Bad"]), "bad.py", config, prefilter=False)
    good = lint_text(_as_loop(found["Good"]), "good.py", config, prefilter=False)
    assert bad.error is None and good.error is None
    assert [f.code for f in bad.findings] == [rule.code]
    assert good.findings == []


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.code)
def test_rule_command_prints_the_documentation(rule):
    result = CliRunner().invoke(main, ["rule", rule.code.lower()])
    assert result.exit_code == 0, result.output
    first_line = result.output.splitlines()[0]
    assert first_line.startswith(f"{rule.code} {rule.name} (")
    assert rule.severity.value in first_line
    opening = rule.documentation().split("\n\n", 1)[0].replace("``", "`")
    assert f"\n\n{opening}\n\n" in result.output  # the first paragraph, as readable text
    prose = "\n".join(line for line in result.output.splitlines() if not line.startswith("    "))  # examples may hold `**kwargs`
    assert "**" not in prose and "``" not in prose
    for code in examples(rule).values():
        assert textwrap.indent(code.rstrip("\n"), "    ") in result.output


def test_rule_command_rejects_an_unknown_code():
    result = CliRunner().invoke(main, ["rule", "GL999"])
    assert result.exit_code == 2
    assert "GL999" in result.output


def test_rules_command_lists_every_rule_with_its_summary():
    result = CliRunner().invoke(main, ["rules"])
    assert result.exit_code == 0
    for rule in ALL_RULES:
        line = next(line for line in result.output.splitlines() if line.startswith(rule.code))
        assert rule.name in line and rule.summary in line
