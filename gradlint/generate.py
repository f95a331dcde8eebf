"""Files generated from the rule classes: ``gradlint/catalogue.py`` and the rule pages under ``docs/rules/``.

    python -m gradlint.generate           # rewrite every generated file
    python -m gradlint.generate --check   # exit 1, naming each file that is out of date

Run it from a checkout after changing a rule's attributes or docstring.
``tests/test_generated.py`` fails while a committed file differs from what
this writes.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from gradlint import tokens
from gradlint.rule import Rule
from gradlint.ruledoc import render_index, render_page
from gradlint.tokens import Need, token_key

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = Path("gradlint") / "catalogue.py"
RULE_PAGES = Path("docs") / "rules"
COMMAND = "python -m gradlint.generate"

# Tokens the rules share, written by name in the catalogue.
_NAMED_TOKENS = {token_key(tokens.BACKWARD): "BACKWARD", token_key(tokens.STEP): "STEP", token_key(tokens.SCALER): "SCALER"}


def expected_files(rules: Sequence[type[Rule]]) -> dict[Path, str]:
    """Every generated file, by its path relative to the repository root, with the text it must hold."""
    files = {CATALOGUE: catalogue_source(rules), RULE_PAGES / "index.md": render_index(rules)}
    for rule in rules:
        files[RULE_PAGES / f"{rule.code}.md"] = render_page(rule, rules)
    return files


def stale_files(root: Path, expected: dict[Path, str]) -> list[Path]:
    """The generated files under ``root`` that differ from ``expected``, are missing, or belong to no rule any more."""
    stale = [path for path, text in expected.items() if _read(root / path) != text]
    pages = root / RULE_PAGES
    if pages.is_dir():
        stale += [page.relative_to(root) for page in sorted(pages.glob("*.md")) if page.relative_to(root) not in expected]
    return stale


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def catalogue_source(rules: Sequence[type[Rule]]) -> str:
    """The text of ``gradlint/catalogue.py``: each rule's traits and prefilter tokens, in the order of ``rules``."""
    shared: dict[tuple, str] = {}  # token key -> the name of its module-level constant
    definitions: list[str] = []

    def source(token: Need) -> str:
        key = token_key(token)
        if isinstance(token, tuple):
            parts = [source(part) for part in token]
            return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
        if isinstance(token, str):
            return repr(token)
        if key in _NAMED_TOKENS:
            return _NAMED_TOKENS[key]
        if key not in shared:
            shared[key] = f"_TOKEN_{len(shared) + 1}"
            definitions.append(f"{shared[key]} = {_constructor(token)}")
        return shared[key]

    entries = []
    for rule in rules:
        needs = ", ".join(source(token) for token in rule.needs)
        entries.append(
            "    RuleInfo(\n"
            f"        code={rule.code!r},\n"
            f"        name={rule.name!r},\n"
            f"        summary={rule.summary!r},\n"
            f"        severity=Severity.{rule.severity.name},\n"
            f"        fix={'FixKind.' + rule.fix.name if rule.fix else 'None'},\n"
            f"        enabled_by_default={rule.enabled_by_default!r},\n"
            f"        needs=({needs}{',' if len(rule.needs) == 1 else ''}),\n"
            "    ),\n"
        )
    return (
        '"""Every rule\'s traits and prefilter tokens, known without importing the rules.\n'
        "\n"
        f"Generated from the rule classes by ``{COMMAND}``: do not edit.\n"
        "``tests/test_generated.py`` fails when it is out of date.\n"
        '"""\n'
        "\n"
        "from __future__ import annotations\n"
        "\n"
        "import re\n"
        "\n"
        "from gradlint.findings import FixKind, Severity\n"
        "from gradlint.rule_info import RuleInfo\n"
        "from gradlint.tokens import BACKWARD, SCALER, STEP, AnyOf, CallNeed, Spelled, call_of  # noqa: F401\n"
        "\n"
        + "".join(f"{line}\n" for line in definitions)
        + "\n"
        "ALL_RULES: tuple[RuleInfo, ...] = (\n"
        + "".join(entries)
        + ")\n"
        "\n"
        "RULES_BY_CODE: dict[str, RuleInfo] = {rule.code: rule for rule in ALL_RULES}\n"
    )


def _constructor(token: Need) -> str:
    """Python source that builds ``token`` again."""
    if isinstance(token, re.Pattern):
        flags = re.RegexFlag(token.flags & ~re.UNICODE)
        return f"re.compile({token.pattern!r}{', re.' + flags.name if flags else ''})"
    if isinstance(token, tokens.Spelled):
        return f"Spelled({token.literal!r}, {token.pattern.pattern!r})"
    if isinstance(token, tokens.AnyOf):
        return f"AnyOf({', '.join(repr(s) for s in token.substrings)})"
    if isinstance(token, tokens.CallNeed):
        if len(token.suffixes) == 1 and token_key(token) == token_key(tokens.call_of(token.suffixes[0], handed=token.handed)):
            return f"call_of({token.suffixes[0]!r}{', handed=True' if token.handed else ''})"
        options = [repr(token.pattern.pattern)]
        if token.suffixes:
            options.append(f"suffixes={token.suffixes!r}")
        if token.names:
            options.append(f"names={tuple(sorted(token.names))!r}")
        if token.alias_import:
            options.append("alias_import=True")
        if token.handed:
            options.append("handed=True")
        return f"CallNeed({', '.join(options)})"
    raise TypeError(f"no source for the prefilter token {token!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite the generated files, or with ``--check`` list the stale ones (exit 1 when there is any)."""
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a generated file is out of date")
    args = parser.parse_args(argv)
    if not (ROOT / "mkdocs.yml").is_file():
        print(f"{COMMAND}: {ROOT} is not a checkout of gradlint (no mkdocs.yml): nothing to write", file=sys.stderr)
        return 2
    from gradlint.rules import ALL_RULES

    expected = expected_files(ALL_RULES)
    stale = stale_files(ROOT, expected)
    if args.check:
        for path in stale:
            print(f"out of date: {path.as_posix()}")
        return 1 if stale else 0
    for path in stale:
        target = ROOT / path
        if path in expected:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(expected[path], encoding="utf-8")
            print(f"wrote {path.as_posix()}")
        else:
            target.unlink()
            print(f"removed {path.as_posix()} (no such rule)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
