"""How an optimizer's update answers the scale of the gradient, and how GL004 says what a gradient N times too large does.

Plain and momentum SGD step in proportion to the gradient: a gradient N
times too large is a step N times too large, the learning rate secretly
multiplied by N. Adam and the optimizers built like it divide the update by
a running estimate of the gradient's own scale (Adam, AdamW, Adamax, NAdam,
RAdam: ``m / (sqrt(v) + eps)``; Adagrad, Adadelta, RMSprop, Adafactor: a
running or accumulated square; LAMB and LARS: a trust ratio; Lion, Rprop:
the sign; Muon: an orthogonalised momentum): the step barely changes, and
what the factor still moves is what compares the raw gradient with a
constant: gradient clipping thresholds, ``eps`` (N times smaller beside the
gradient) and the gradient norms a loop logs. Where the optimizer's class
is unknown, the message says both.

The algorithm is read from the class that builds the optimizer, by its last
name, and only for a class of a module known to build optimizers
(``objects.kind_of_constructor``): ``torch.optim``, bitsandbytes, timm,
torch-optimizer, lion-pytorch, schedule-free, heavyball, and what the
framework modules add (DeepSpeed's and apex's fused optimizers,
transformers' ``AdamW`` and ``Adafactor``, torch-optimi). A class of the
project (``class MyAdam(Optimizer)``) or a factory (``create_optimizer``)
is unknown.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gradlint import frameworks
from gradlint.kinds import ObjKind
from gradlint.objects import kind_of_constructor, last_name
from gradlint.syntax import callee_name, dotted_name, positional_args

if TYPE_CHECKING:
    from gradlint.model import Event, LoopModel


class UpdateScale(enum.Enum):
    """How an optimizer's step answers a gradient N times larger."""

    PROPORTIONAL = "proportional"  # a step N times larger (SGD)
    NORMALISED = "normalised"  # about the same step (Adam and its kin)
    UNKNOWN = "unknown"


# The last name of an optimizer class whose update is divided by the gradient's scale (``FusedAdam``, ``AdamW8bit``,
# ``PagedAdamW``, ``DeepSpeedCPUAdam``, ``FusedLAMB``, ``Lion8bit``...), and of one that steps in proportion to it.
_NORMALISED = re.compile(
    r"adam|adagrad|adadelta|rmsprop|adafactor|lamb(?!da)|lars|lion|adan|adabelief|yogi|novograd|rprop|muon|soap",
    re.IGNORECASE,
)
_PROPORTIONAL = re.compile(r"sgd", re.IGNORECASE)


def update_scale(constructors: Iterable[Iterable[str]]) -> UpdateScale:
    """How the optimizer built by these constructions answers the gradient's scale.

    ``constructors`` holds, for each construction of the optimizer the loop steps, the
    qualified names its callee stands for. Every construction must say the same.
    """
    found: set[UpdateScale] = set()
    for qualified in constructors:
        found.add(_of_class(qualified))
    return found.pop() if len(found) == 1 else UpdateScale.UNKNOWN


def stepped_update_scale(model: "LoopModel", step: "Event") -> tuple[UpdateScale, str | None]:
    """How the optimizer a step steps answers the gradient's scale, from the classes it is built from, and the class.

    Every ``name = Class(...)`` of the optimizer's last name in the module counts
    (``model, opt = accelerator.prepare(model, opt)`` hands it back unchanged).
    """
    if model.index is None or step.target is None:
        return UpdateScale.UNKNOWN, None
    calls = list(model.index.constructions.get(last_name(step.target), ()))
    built: list[set[str]] = []
    seen: set[int] = set()
    while calls:
        call = calls.pop()
        if id(call) in seen:
            continue
        seen.add(id(call))
        handed = positional_args(call)
        if callee_name(call) in frameworks.RETURNS_GIVEN_ALONE and len(handed) == 1 and dotted_name(handed[0].value):
            calls.extend(model.index.constructions.get(last_name(dotted_name(handed[0].value)), ()))
            continue
        built.append(model.index.qualified_names(call.func))
    scale = update_scale(built)
    names = {q.rsplit(".", 1)[-1] for q in built[0]} if built and scale is not UpdateScale.UNKNOWN else set()
    return scale, names.pop() if len(names) == 1 else None


def _of_class(qualified: Iterable[str]) -> UpdateScale:
    for name in qualified:
        if kind_of_constructor(name) is not ObjKind.OPTIMIZER:
            continue
        last = name.rsplit(".", 1)[-1]
        if _NORMALISED.search(last):
            return UpdateScale.NORMALISED
        if _PROPORTIONAL.search(last):
            return UpdateScale.PROPORTIONAL
    return UpdateScale.UNKNOWN


def too_small(scale: UpdateScale, optimizer: str | None) -> str:
    """What a gradient that many times too small does to the steps of this optimizer, for GL007's message."""
    return _off_by_a_factor(scale, optimizer, "small")


def too_large(scale: UpdateScale, optimizer: str | None) -> str:
    """What a gradient that many times too large does to the steps of this optimizer, for GL004's message."""
    return _off_by_a_factor(scale, optimizer, "large")


def _off_by_a_factor(scale: UpdateScale, optimizer: str | None, size: str) -> str:
    """What gradients that many times too ``size`` (``"large"`` or ``"small"``) do to this optimizer's steps."""
    named = f"`{optimizer}`" if optimizer else "the optimizer"
    if scale is UpdateScale.PROPORTIONAL:
        return f"each step of {named} is that many times too {size}"
    if scale is UpdateScale.NORMALISED:
        return (
            f"the gradients are that many times too {size}; {named} divides its update by the gradient's scale, so "
            f"its steps barely change, but gradient clipping thresholds, `eps` and logged gradient norms see "
            f"gradients that many times too {size}"
        )
    return (
        f"the gradients are that many times too {size}: with an optimizer that steps in proportion to the gradient "
        f"(SGD) each step is that many times too {size}; with one that divides its update by the gradient's scale "
        f"(Adam and its kin) the steps barely change, but gradient clipping thresholds, `eps` and logged gradient "
        f"norms see gradients that many times too {size}"
    )
