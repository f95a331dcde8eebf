"""CI output formats: SARIF 2.1.0 (valid against the OASIS schema), GitHub workflow commands, --statistics."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import jsonschema
import pytest
from click.testing import CliRunner

from gradlint import output
from gradlint.cli import main
from gradlint.rules import ALL_RULES

SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text(encoding="utf-8"))

BUGGY = """import torch

model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i, x in enumerate(data):
    opt.zero_grad(set_to_none=False)
    (model(x).sum() / 4).backward()
    if (i + 1) % 4 == 0:
        opt.step()
"""

# A message with the characters GitHub's workflow commands must escape.
TWO_OPTIMIZERS = """import torch

for x in data:
    loss = model(x).sum()
    loss.backward()
    opt_g.step()
"""


@pytest.fixture()
def tree(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train one,two.py").write_text(BUGGY)
    (tmp_path / "gan.py").write_text(TWO_OPTIMIZERS)
    (tmp_path / "clean.py").write_text("print('no training here')\n")
    return tmp_path


def cli(tree, *args):
    old = os.getcwd()
    os.chdir(tree)
    try:
        return CliRunner().invoke(main, ["--isolated", "--no-cache", *args])
    finally:
        os.chdir(old)


def json_findings(tree, *args):
    result = cli(tree, ".", "--output-format", "json", *args)
    return json.loads(result.stdout)


def validator():
    return jsonschema.Draft4Validator(SCHEMA, format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER)


def test_sarif_validates_and_carries_every_finding(tree):
    result = cli(tree, ".", "--output-format", "sarif")
    assert result.exit_code == 1
    log = json.loads(result.stdout)
    errors = sorted(validator().iter_errors(log), key=str)
    assert not errors, [e.message for e in errors]
    expected = json_findings(tree)
    assert expected, "the tree has findings"
    run = log["runs"][0]
    located = [
        (
            r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
            r["locations"][0]["physicalLocation"]["region"]["startLine"],
            r["locations"][0]["physicalLocation"]["region"]["startColumn"],
            r["ruleId"],
            r["message"]["text"],
        )
        for r in run["results"]
    ]
    assert located == [
        (quote(f["path"].replace(os.sep, "/")), f["line"], f["column"], f["code"], f["message"]) for f in expected
    ]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [rule.code for rule in ALL_RULES]
    for result_entry in run["results"]:
        assert rules[result_entry["ruleIndex"]]["id"] == result_entry["ruleId"]
    for rule, entry in zip(ALL_RULES, rules):
        prose = "\n".join(line for line in entry["help"]["text"].splitlines() if not line.startswith("    "))  # not the examples
        assert "Fix." in prose and "**" not in prose and "``" not in prose
        assert "**Fix.**" in entry["help"]["markdown"] and "```python\n" in entry["help"]["markdown"]
        assert entry["shortDescription"]["text"] == rule.summary
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == tree.absolute().as_uri() + "/"


def test_sarif_help_uris_when_the_package_names_its_documentation(tree, monkeypatch):
    monkeypatch.setattr(output, "docs_url", lambda: "https://example.org/gradlint")
    log = json.loads(cli(tree, ".", "--output-format", "sarif").stdout)
    assert not list(validator().iter_errors(log))
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert [r["helpUri"] for r in rules] == [f"https://example.org/gradlint/rules/{rule.code}/" for rule in ALL_RULES]


def test_sarif_has_no_help_uris_without_a_documentation_url(tree, monkeypatch):
    monkeypatch.setattr(output, "docs_url", lambda: None)
    log = json.loads(cli(tree, ".", "--output-format", "sarif").stdout)
    assert not list(validator().iter_errors(log))
    assert not any("helpUri" in r for r in log["runs"][0]["tool"]["driver"]["rules"])


@pytest.mark.parametrize("base", ["https://example.org/docs", "https://example.org/docs/"])
def test_rule_url_is_the_rule_page_below_the_site_with_or_without_a_slash(base):
    assert output.rule_url("GL003", base) == "https://example.org/docs/rules/GL003/"
    assert output.rule_url("GL003", None) is None


def test_every_rule_url_names_a_page_of_the_site():
    """``BASE/rules/GL003/`` is where mkdocs serves ``docs/rules/GL003.md``."""
    root = Path(__file__).resolve().parent.parent
    for rule in ALL_RULES:
        path = output.rule_url(rule.code, "https://site").removeprefix("https://site/").rstrip("/")
        assert (root / "docs" / f"{path}.md").is_file(), path


def test_the_documentation_url_is_the_one_pyproject_names():
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8"))
    # None while the site has no published address: no finding links to a page that is not there.
    assert output.docs_url() == pyproject["project"].get("urls", {}).get("Documentation")


def test_json_findings_carry_the_url_of_their_rule_page(tree, monkeypatch):
    monkeypatch.setattr(output, "docs_url", lambda: "https://example.org/gradlint/")
    findings = json_findings(tree)
    assert findings
    assert [f["url"] for f in findings] == [f"https://example.org/gradlint/rules/{f['code']}/" for f in findings]
    monkeypatch.setattr(output, "docs_url", lambda: None)
    assert {f["url"] for f in json_findings(tree)} == {None}


def test_show_links_follows_each_text_finding_with_its_rule_page(tree, monkeypatch):
    monkeypatch.setattr(output, "docs_url", lambda: "https://example.org/gradlint/")
    plain = cli(tree, ".").stdout.splitlines()
    linked = cli(tree, ".", "--show-links").stdout.splitlines()
    findings = json_findings(tree)
    # Each finding line as before, then its link; the summary line unchanged.
    expected = []
    for line, finding in zip(plain, findings):
        expected += [line, f"    see https://example.org/gradlint/rules/{finding['code']}/"]
    assert linked == expected + plain[len(findings):]
    monkeypatch.setattr(output, "docs_url", lambda: None)
    unlinked = cli(tree, ".", "--show-links").stdout.splitlines()
    assert unlinked[1] == f"    see `gradlint rule {findings[0]['code']}`"


def test_sarif_reports_unreadable_files_as_notifications(tree):
    (tree / "broken.py").write_text("def f(:\n    loss.backward()\n    opt.step()\n")
    result = cli(tree, ".", "--output-format", "sarif")
    assert result.exit_code == 2
    log = json.loads(result.stdout)
    assert not list(validator().iter_errors(log))
    invocation = log["runs"][0]["invocations"][0]
    assert invocation["executionSuccessful"] is False
    [note] = invocation["toolExecutionNotifications"]
    assert "cannot parse" in note["message"]["text"]
    assert note["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "broken.py"


def test_schema_rejects_a_broken_log(tree):
    """The validator is not vacuous: a result without a message fails."""
    log = json.loads(cli(tree, ".", "--output-format", "sarif").stdout)
    del log["runs"][0]["results"][0]["message"]
    assert list(validator().iter_errors(log))


def test_github_annotations(tree):
    result = cli(tree, ".", "--output-format", "github")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    expected = json_findings(tree)
    assert len(lines) == len(expected)
    for line, finding in zip(lines, expected):
        level = {"error": "error", "warning": "warning", "info": "notice"}[finding["severity"]]
        path = finding["path"].replace(",", "%2C").replace(":", "%3A")
        assert line.startswith(
            f"::{level} file={path},line={finding['line']},col={finding['column']},"
            f"endLine={finding['end_line']},endColumn={finding['end_column']},title={finding['code']}::"
        ), line
        assert line.endswith(finding["message"].replace("%", "%25"))
    assert any("train one%2Ctwo.py" in line for line in lines)


def test_github_escapes_newlines_and_percent():
    assert output._github_escape("50%\nmore") == "50%25%0Amore"
    assert output._github_escape("a:b,c", property_value=True) == "a%3Ab%2Cc"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_statistics_count_per_code(tree, fmt):
    counts = Counter(f["code"] for f in json_findings(tree))
    result = cli(tree, ".", "--statistics", "--output-format", fmt)
    stream = result.stdout if fmt == "text" else result.stderr
    rows = [line.split() for line in stream.splitlines() if line.strip()[:1].isdigit()]
    assert {code: int(count) for count, code, _ in rows} == dict(counts)
    assert len(counts) >= 2
    if fmt == "json":  # the machine-readable output stays parseable
        assert json.loads(result.stdout)


def test_the_summary_spells_plural_fixes():
    import dataclasses

    from gradlint.findings import Finding, FixKind, Severity
    from gradlint.output import unsafe_hint

    finding = Finding("t.py", 1, 1, 1, 2, "GL004", "unscaled-accumulated-loss", "m", Severity.WARNING, FixKind.UNSAFE)
    assert unsafe_hint([finding]) == " 1 fix available with `--unsafe-fixes`."
    assert unsafe_hint([finding, dataclasses.replace(finding, line=2)]) == " 2 fixes available with `--unsafe-fixes`."
