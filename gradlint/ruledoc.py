"""A rule's documentation for people: readable text in a terminal, or markdown.

Rule docstrings are written in a small part of reStructuredText: paragraphs,
``**strong**`` and ````literal```` inline, and a paragraph ending in ``::``
followed by an indented literal block (the bad and good examples). This
module renders exactly that part; anything else passes through as written.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
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


# The title of each family of rules (the module of ``rules/`` that holds it) on the rule pages. Several modules may
# share a family: each holds one idea, a family groups the ideas a reader looks for together.
FAMILIES = {
    "clearing": "Clearing gradients",
    "foreign_gradients": "Clearing gradients",
    "steps": "Clearing gradients",
    "gradient_reads": "Clearing gradients",
    "accumulation": "Gradient accumulation",
    "pass_end": "Gradient accumulation",
    "guard_precedence": "Gradient accumulation",
    "parameters": "What the optimizer holds",
    "parameter_groups": "What the optimizer holds",
    "network_in_no_optimizer": "What the optimizer holds",
    "replaced_network": "What the optimizer holds",
    "amp": "Mixed precision with a GradScaler",
    "gradient_release": "Gradient release",
    "schedule": "Learning-rate schedulers",
    "distributed": "Distributed data-parallel training",
}
_CODE = re.compile(r"\bGL\d{3}\b")
_CODE_SPAN = re.compile(r"(`[^`]*`)")


def _inline(text: str) -> str:
    """reStructuredText's ````literal```` as markdown's ```literal```."""
    return _LITERAL.sub(r"`\1`", text)


def family(rule: type[Rule]) -> str:
    """The title of the family ``rule`` belongs to: its module under ``rules/``."""
    module = rule.__module__.rsplit(".", 1)[-1]
    return FAMILIES.get(module, module)


def related(rule: type[Rule], rules: Sequence[type[Rule]]) -> list[type[Rule]]:
    """The rules ``rule``'s documentation names and the others of its family, in code order."""
    named = set(_CODE.findall(rule.documentation()))
    return [other for other in rules if other is not rule and (other.code in named or family(other) == family(rule))]


def _link_codes(text: str, known: set[str], own: str) -> str:
    """``GL002`` in prose as a link to its page; code spans and the page's own code are left alone."""
    def link(match: re.Match) -> str:
        code = match.group(0)
        return f"[{code}]({code}.md)" if code in known and code != own else code

    pieces = _CODE_SPAN.split(text)
    return "".join(piece if piece.startswith("`") else _CODE.sub(link, piece) for piece in pieces)


def render_page(rule: type[Rule], rules: Sequence[type[Rule]]) -> str:
    """The rule's page of the documentation site (``docs/rules/GL003.md``).

    The heading, traits and family, the documentation as markdown (what it
    flags, why, the fix, a bad and a good example, when it stays quiet) with
    the codes it names linked, the related rules, and how to read it in a
    terminal or silence one finding.
    """
    known = {other.code for other in rules}
    parts = [f"# {rule.code} `{rule.name}`", f"*{traits(rule)}* · {family(rule)} · [all rules](index.md)"]
    for kind, block in _blocks(rule.documentation()):
        if kind == "code":
            parts.append(f"```python\n{block}\n```")
        else:
            parts.append(_link_codes(_inline(block), known, rule.code))
    others = related(rule, rules)
    if others:
        parts.append("## Related rules")
        parts.append("\n".join(f"- [{o.code}]({o.code}.md) `{o.name}`: {_inline(o.summary)}" for o in others))
    parts.append(
        f"`gradlint rule {rule.code}` prints this page in a terminal; `# noqa: {rule.code}` on the reported line silences one finding."
    )
    return "\n\n".join(parts) + "\n"


def render_index(rules: Sequence[type[Rule]]) -> str:
    """The index of the rule pages (``docs/rules/index.md``): one table per family, in code order."""
    parts = [
        "# Rules",
        "Every rule gradlint has, by family. `gradlint rules` prints this list; each code links to the rule's page, "
        "which `gradlint rule CODE` also prints. Rules marked *off unless selected* run only when a code names them "
        "(`--select GL204`).",
    ]
    families: dict[str, list[type[Rule]]] = {}
    for rule in rules:
        families.setdefault(family(rule), []).append(rule)
    for title, members in families.items():
        rows = ["| code | name | flags | severity | fix |", "| --- | --- | --- | --- | --- |"]
        for rule in members:
            default = "" if rule.enabled_by_default else ", off unless selected"
            fix = rule.fix.value if rule.fix else "none"
            summary = _inline(rule.summary).replace("|", "\\|")
            rows.append(f"| [{rule.code}]({rule.code}.md) | `{rule.name}` | {summary} | {rule.severity.value}{default} | {fix} |")
        parts.append(f"## {title}")
        parts.append("\n".join(rows))
    return "\n\n".join(parts) + "\n"
