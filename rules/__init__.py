"""The rule catalogue: every rule, one module per family.

- ``clearing``: when gradients are cleared (GL001–GL005)
- ``amp``: mixed precision with a ``GradScaler`` (GL101–GL104)
"""

from __future__ import annotations

from gradlint.rule import Rule
from gradlint.rules.amp import BackwardWithoutScaler, ClipBeforeUnscale, ScalerWithoutUpdate, StepBypassesScaler
from gradlint.rules.clearing import (
    GradsKeptAllocated,
    MissingZeroGrad,
    UnscaledAccumulatedLoss,
    ZeroGradBetweenBackwardAndStep,
    ZeroGradInAccumulation,
)

ALL_RULES: tuple[type[Rule], ...] = (
    MissingZeroGrad,
    ZeroGradBetweenBackwardAndStep,
    ZeroGradInAccumulation,
    UnscaledAccumulatedLoss,
    GradsKeptAllocated,
    BackwardWithoutScaler,
    StepBypassesScaler,
    ClipBeforeUnscale,
    ScalerWithoutUpdate,
)

RULES_BY_CODE: dict[str, type[Rule]] = {rule.code: rule for rule in ALL_RULES}
