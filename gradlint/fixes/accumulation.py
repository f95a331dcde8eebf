"""Fix for GL007: drop the manual division by the accumulation count that the framework already makes."""

from __future__ import annotations

import libcst as cst

from gradlint.fixes.edits import Edit, Fix, Remove, Replace
from gradlint.fixes.locate import statement_of
from gradlint.model import LoopModel
from gradlint.syntax import dotted_name


def drop_division(model: LoopModel, division: cst.CSTNode) -> Fix:
    """``x / n`` → ``x``; a statement left doing nothing (``loss = loss / n``, ``loss /= n``) is removed."""

    def build() -> list[Edit] | None:
        statement = statement_of(model.file, division)
        if type(division) is cst.AugAssign:
            return [Remove(division)] if statement is division else None
        if type(division) is not cst.BinaryOperation or type(division.operator) is not cst.Divide:
            return None
        if (
            type(statement) is cst.Assign
            and statement.value is division
            and len(statement.targets) == 1
            and dotted_name(statement.targets[0].target) is not None
            and dotted_name(statement.targets[0].target) == dotted_name(division.left)
        ):
            return [Remove(statement)]

        def make(node: cst.CSTNode) -> cst.CSTNode:
            left = node.left
            if node.lpar and not left.lpar:
                return left.with_changes(lpar=node.lpar, rpar=node.rpar)
            return left

        return [Replace(division, make)]

    return Fix("drop the division the framework already makes", build)
