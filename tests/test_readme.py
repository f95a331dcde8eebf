"""The README stays in step with the code: its rule table, and the test command CI runs."""

from __future__ import annotations

import re
from pathlib import Path

from gradlint.rules import ALL_RULES

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def table_rows() -> dict[str, list[str]]:
    """The rows of the rule table (the "Rules" section; other tables list codes too), by the code its first cell links."""
    rows = {}
    section = README.split("\n## Rules\n", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        linked = re.fullmatch(r"\[(GL\d{3})\]\(docs/rules/(GL\d{3})\.md\)", cells[0]) if cells else None
        if linked:
            assert linked.group(1) == linked.group(2), f"{cells[0]} links another rule's page"
            rows[linked.group(1)] = cells
    return rows


def test_rule_table_lists_every_rule_with_its_name_and_fix_kind_and_links_its_page():
    rows = table_rows()
    assert sorted(rows) == sorted(rule.code for rule in ALL_RULES)
    for rule in ALL_RULES:
        code, name, _, fix = rows[rule.code]
        assert name == rule.name
        assert fix == (rule.fix.value if rule.fix else "none")
        assert (ROOT / "docs" / "rules" / f"{rule.code}.md").is_file()


def test_readme_stays_short_and_every_link_into_the_repository_resolves():
    assert len(README.splitlines()) <= 300
    for target in re.findall(r"\]\(((?:docs/)[^)#]+)(?:#[^)]*)?\)", README):
        assert (ROOT / target).is_file(), target


def test_the_pictured_plot_is_committed_and_small():
    picture = ROOT / "docs" / "images" / "measure-plot.png"
    assert "](docs/images/measure-plot.png)" in README
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert picture.stat().st_size < 100_000


def test_ci_runs_the_readme_test_command_verbatim():
    blocks = re.findall(r"```sh\n(.*?)\n```", README, re.DOTALL)
    test_command = next(b for b in blocks if "pytest" in b)
    assert "torch==2.13.0" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_readme_starts_with_install_and_lint_of_the_shipped_example():
    first = re.search(r"```sh\n(.*?)\n```", README, re.DOTALL).group(1)
    assert "pip install ." in first and "gradlint examples/train.py" in first
    assert (ROOT / "examples" / "train.py").is_file()


def test_readme_example_output_is_what_gradlint_prints(monkeypatch):
    from gradlint.linter import lint_paths
    from gradlint.output import all_findings, format_text

    monkeypatch.chdir(ROOT)
    shown = re.search(r"```console\n\$ gradlint examples/train.py\n(.*?)```", README, re.DOTALL).group(1)
    assert format_text(all_findings(lint_paths(["examples/train.py"]))) == shown
