"""The rule catalogue: every rule, one module per family.

- ``clearing``: when gradients are cleared (GL001–GL005), and an inverted accumulation guard (GL013)
- ``accumulation``: clipping and loss division under gradient accumulation (GL006–GL008, GL010, GL011, GL015)
- ``steps``: whether a step has gradients to apply (GL022)
- ``parameter_groups``: whether every parameter group a function fills reaches its optimizer, once (GL025, GL026)
- ``network_in_no_optimizer``: whether every network a backpropagated loss runs through is held by an optimizer (GL027)
- ``replaced_network``: whether a network an optimizer holds is replaced by a new one before it steps (GL028)
- ``guard_precedence``: whether a step's guard computes the remainder it means (GL023)
- ``gradient_reads``: whether gradients read in a loop are that iteration's own (GL024)
- ``pass_end``: the micro-batches left over at the end of a pass over the data (GL021)
- ``parameters``: which parameters an optimizer holds and updates (GL009, GL012, GL018–GL020)
- ``foreign_gradients``: an optimizer applying the gradients another network's loss left on its parameters (GL017)
- ``amp``: mixed precision with a ``GradScaler`` (GL101–GL108)
- ``gradient_release``: gradient release, the fused backward and optimizer step (GL201–GL204)
- ``schedule``: learning-rate schedulers (GL301, GL308)
- ``distributed``: distributed data-parallel training (GL302–GL307)
"""

from __future__ import annotations

from gradlint.rule import Rule
from gradlint.rules.accumulation import (
    ClipOnlyUnderAccumulationGuard,
    ClipPerMicroBatch,
    LossDividedTwice,
    LossDividedWithoutAccumulation,
    LossGivenAsItsOwnGradient,
    NumItemsInBatchIgnored,
    ShiftedAccumulationWindow,
    StepOutsideAccumulationGuard,
)
from gradlint.rules.amp import (
    BackwardWithoutScaler,
    ClipBeforeUnscale,
    ScaledGradientStatistic,
    ScalerRebuiltEveryStep,
    ScalerUnscalePerMicroBatch,
    ScalerUpdateSkipped,
    ScalerWithoutUpdate,
    StepBypassesScaler,
)
from gradlint.rules.clearing import (
    GradsKeptAllocated,
    InvertedAccumulationGuard,
    MissingZeroGrad,
    UnscaledAccumulatedLoss,
    ZeroGradBetweenBackwardAndStep,
    ZeroGradInAccumulation,
)
from gradlint.rules.pass_end import LastWindowOfPassNotStepped
from gradlint.rules.steps import StepWithoutBackward
from gradlint.rules.guard_precedence import RemainderPrecedenceInGuard
from gradlint.rules.parameter_groups import ParameterGroupNeverAdded, ParametersRepeatedInGroup
from gradlint.rules.network_in_no_optimizer import NetworkInNoOptimizer
from gradlint.rules.replaced_network import OptimizerOverReplacedNetwork
from gradlint.rules.gradient_reads import GradientReadWithoutClear
from gradlint.rules.parameters import (
    OptimizerOverFrozenParams,
    OptimizerSteppedOnOneSettingBranch,
    OptimizerNeverStepped,
    ParameterInNoOptimizer,
    UnregisteredParameters,
)
from gradlint.rules.foreign_gradients import StepTakesAnotherLossGradients
from gradlint.rules.distributed import (
    AccumulationWithoutNoSync,
    DdpModelChangedAfterWrap,
    GradSyncSetAfterForward,
    NoSyncAfterForward,
    ForwardAroundWrapper,
    NoSyncOnSteppingMicroBatch,
    NormClippedOnShards,
)
from gradlint.rules.gradient_release import (
    AccumulationWithGradientRelease,
    ClippingWithGradientRelease,
    GradientReleaseCandidate,
    GradScalerWithGradientRelease,
)
from gradlint.rules.schedule import SchedulerNeverStepped, SchedulerStepsPerMicroBatch

ALL_RULES: tuple[type[Rule], ...] = (
    MissingZeroGrad,
    ZeroGradBetweenBackwardAndStep,
    ZeroGradInAccumulation,
    UnscaledAccumulatedLoss,
    GradsKeptAllocated,
    ClipPerMicroBatch,
    LossDividedTwice,
    NumItemsInBatchIgnored,
    OptimizerOverFrozenParams,
    LossDividedWithoutAccumulation,
    StepOutsideAccumulationGuard,
    OptimizerSteppedOnOneSettingBranch,
    InvertedAccumulationGuard,
    ShiftedAccumulationWindow,
    ClipOnlyUnderAccumulationGuard,
    LossGivenAsItsOwnGradient,
    StepTakesAnotherLossGradients,
    UnregisteredParameters,
    OptimizerNeverStepped,
    ParameterInNoOptimizer,
    LastWindowOfPassNotStepped,
    StepWithoutBackward,
    RemainderPrecedenceInGuard,
    GradientReadWithoutClear,
    ParameterGroupNeverAdded,
    ParametersRepeatedInGroup,
    NetworkInNoOptimizer,
    OptimizerOverReplacedNetwork,
    BackwardWithoutScaler,
    StepBypassesScaler,
    ClipBeforeUnscale,
    ScalerWithoutUpdate,
    ScalerUnscalePerMicroBatch,
    ScalerUpdateSkipped,
    ScaledGradientStatistic,
    ScalerRebuiltEveryStep,
    GradScalerWithGradientRelease,
    AccumulationWithGradientRelease,
    ClippingWithGradientRelease,
    GradientReleaseCandidate,
    SchedulerStepsPerMicroBatch,
    AccumulationWithoutNoSync,
    DdpModelChangedAfterWrap,
    GradSyncSetAfterForward,
    NoSyncOnSteppingMicroBatch,
    NoSyncAfterForward,
    NormClippedOnShards,
    ForwardAroundWrapper,
    SchedulerNeverStepped,
)

RULES_BY_CODE: dict[str, type[Rule]] = {rule.code: rule for rule in ALL_RULES}
