"""gradlint as a flake8 plugin: ``flake8 --select GL`` reports what ``gradlint`` reports.

The plugin reads the file once, through the lines and Python's tree flake8
has already made, runs the same prefilter and rules as the command line, and leaves ``# noqa``
to flake8 (so ``--disable-noqa`` and flake8's own noqa rules apply). The
rules that are off by default run only when a code longer than the ``GL``
prefix selects them (``--select GL204`` or ``--extend-select GL2``):
``--select GL`` means the default rules, here as in ``gradlint --select GL``
(see :func:`gradlint.config.narrow_selectors`). Columns are 0-based here: flake8 adds one.

A file gradlint cannot check (LibCST cannot parse it, or a rule fails) is
reported as ``GL000`` on line 1, so that a silent plugin never means an
unchecked file.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import Any

from gradlint import __version__
from gradlint.config import narrow_selectors
from gradlint.linter import check_module, cyclic_gc_paused, parse
from gradlint.prefilter import called_names, rules_that_might_fire
from gradlint.python_nodes import FiledTree
from gradlint.rules import ALL_RULES
from gradlint.source import SourceError


class GradlintChecker:
    """The flake8 entry point (``flake8.extension``, prefix ``GL``)."""

    name = "gradlint"
    version = __version__

    def __init__(self, tree: ast.AST, lines: list[str], filename: str) -> None:
        # flake8 hands every plugin of this kind Python's tree: the prefilter reads its calls, LibCST reads the lines.
        self.tree = tree if isinstance(tree, ast.Module) else None
        self.lines = lines
        self.filename = filename

    rules = tuple(rule for rule in ALL_RULES if rule.enabled_by_default)

    @classmethod
    def parse_options(cls, options: Any) -> None:
        """Add the off-by-default rules that ``--select``/``--extend-select`` name more precisely than ``GL``."""
        chosen = narrow_selectors(code.upper() for code in (options.select or []) + (options.extend_select or []))
        cls.rules = tuple(
            rule for rule in ALL_RULES if rule.enabled_by_default or any(rule.code.startswith(code) for code in chosen)
        )

    def run(self) -> Iterator[tuple[int, int, str, type]]:
        """Yield ``(line, column, "GL003 message", type)`` for each finding."""
        text = "".join(self.lines)
        tree = FiledTree.of(self.tree)  # read by the prefilter, then by the project index
        rules = rules_that_might_fire(text, self.rules)
        if rules and tree is not None:
            rules = rules_that_might_fire(text, rules, called_names(tree))
        if not rules:
            return
        with cyclic_gc_paused():
            try:
                parsed = parse(text, tree)
            except SourceError as error:
                parsed, failure = None, error
            else:
                result = check_module(parsed, self.filename, rules, noqa=False)
        if parsed is None:
            yield 1, 0, f"GL000 gradlint could not check this file: {failure}", type(self)
            return
        if result.error:
            yield 1, 0, f"GL000 gradlint could not check this file: {result.error}", type(self)
        for finding in result.findings:
            yield finding.line, finding.column - 1, f"{finding.code} {finding.message}", type(self)
