"""A rule's documentation for people: readable text in a terminal, or markdown.

Rule docstrings are written in a small part of reStructuredText: paragraphs,
``**strong**`` and ````literal```` inline, and a paragraph ending in ``::``
followed by an indented literal block (the bad and good examples). This
module renders exactly that part; anything else passes through as written.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable

import click

from gradlint.rule import Rule

# Inline markup may wrap onto the paragraph's next line, as reStructuredText allows.
_STRONG = re.compile(r"\*\*(.+?)\*\*", re.DOTALL)
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)


def find_rule(query: str, rules: Iterable[type[Rule]]) -> type[Rule] | None:
    """The rule whose code (any case) or name is ``query``, or None."""
    wanted = query.strip()
    for rule in rules:
        if rule.code == wanted.upper() or rule.name == wanted.lower():
            return rule
    return None


def traits(rule: type[Rule]) -> str:
    """``error, safe fix``: the severity and the fix, noting a rule that is off by default."""
    fix = f"{rule.fix.value} fix" if rule.fix else "no automatic fix"
    default = "" if rule.enabled_by_default else ", off unless selected"
    return f"{rule.severity.value}, {fix}{default}"


def heading(rule: type[Rule]) -> str:
    """``GL003 zero-grad-in-accumulation (error, safe fix)``."""
    return f"{rule.code} {rule.name} ({traits(rule)})"


def _blocks(doc: str) -> list[tuple[str, str]]:
    """The documentation as ``("text", paragraph)`` and ``("code", literal block)`` pieces, in order."""
    blocks: list[tuple[str, str]] = []
    lines = doc.splitlines()
    i = 0
    expect_code = False
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        if expect_code and lines[i].startswith((" ", "\t")):
            start = i
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                i += 1
            blocks.append(("code", textwrap.dedent("\n".join(lines[start:i])).strip("\n")))
            expect_code = False
            continue
        start = i
        while i < len(lines) and lines[i].strip():
            i += 1
        paragraph = "\n".join(lines[start:i])
        expect_code = paragraph.endswith("::")
        if expect_code:  # "Bad::" reads "Bad:"; "Bad ::" reads "Bad"; a lone "::" vanishes
            body = paragraph[:-2]
            paragraph = body.rstrip() + (":" if body and not body[-1].isspace() else "")
        if paragraph.strip():
            blocks.append(("text", paragraph))
    return blocks


def render_text(rule: type[Rule], *, style: bool = True) -> str:
    """The documentation as terminal text: strong text in bold (``style``), literals in backquotes, examples indented."""
    def strong(match: re.Match) -> str:
        return click.style(match.group(1), bold=True) if style else match.group(1)

    parts = [click.style(heading(rule), bold=True) if style else heading(rule)]
    for kind, block in _blocks(rule.documentation()):
        if kind == "code":
            parts.append(textwrap.indent(block, "    "))
        else:
            parts.append(_STRONG.sub(strong, _LITERAL.sub(r"`\1`", block)))
    return "\n\n".join(parts) + "\n"


def render_markdown(rule: type[Rule]) -> str:
    """The documentation as markdown: a heading, then paragraphs and fenced Python examples."""
    parts = [f"## {rule.code} `{rule.name}`", f"*{traits(rule)}*"]
    for kind, block in _blocks(rule.documentation()):
        if kind == "code":
            parts.append(f"```python\n{block}\n```")
        else:
            parts.append(_LITERAL.sub(r"`\1`", block))
    return "\n\n".join(parts) + "\n"
