"""DeepSpeed: the engine ``deepspeed.initialize`` returns, and its ``backward``.

What it does to gradients. ``deepspeed.initialize(...)`` returns
``(engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler)``.
``engine.backward(loss)`` divides by the configuration's
``gradient_accumulation_steps`` unless called with ``scale_wrt_gas=False``
(v0.14: ``loss = self._scale_loss_by_gas(loss.float())`` before
backpropagating; v0.19: each parameter's gradient hook,
``_backward_prologue_per_tensor``, divides ``grad / self.gradient_accumulation_steps()``),
and all-reduces only at its accumulation boundary
(``is_gradient_accumulation_boundary``): it decides the micro-batches
itself, whatever the loop around it does. ``engine.gradient_accumulation_steps()``
is the count. Its fused optimizers (``deepspeed.ops.adam``, ``deepspeed.ops.lamb``)
are optimizers.

Where it was read: DeepSpeed v0.19.5, ``deepspeed/__init__.py``
(``initialize``: ``return_items = [engine, engine.optimizer,
engine.training_dataloader, engine.lr_scheduler]``),
``deepspeed/runtime/engine.py`` (``DeepSpeedEngine.backward(loss,
retain_graph=False, scale_wrt_gas=True)``, ``_backward_prologue_per_tensor``,
``_backward_epilogue``, ``is_gradient_accumulation_boundary``,
``gradient_accumulation_steps``); v0.14.0 for ``_scale_loss_by_gas`` in
``backward``. The engine's backward has divided by the count since the
first releases.
"""

from __future__ import annotations

import re

import libcst as cst

from gradlint.frameworks.framework import Backward, ConfigSetting, CountSetting, Framework
from gradlint.kinds import ObjKind
from gradlint.syntax import bool_literal, dotted_name, keyword_arg

# What an engine is called when nothing says where it came from: ``engine``, ``ds_engine``, ``model_engine``, ``deepspeed_...``.
_ENGINE_NAME = re.compile(r"(^|_)(ds_|deepspeed_)?engine$|^deepspeed", re.IGNORECASE)


def _own_count(divisor: cst.BaseExpression, owner: str) -> bool:
    """``engine.gradient_accumulation_steps()`` of the engine that backpropagates."""
    return type(divisor) is cst.Call and not divisor.args and dotted_name(divisor.func) == f"{owner}.gradient_accumulation_steps"


def _opted_out(call: cst.Call) -> bool:
    """``engine.backward(loss, scale_wrt_gas=False)`` (anything but a literal True): the engine divides nothing."""
    wrt_gas = keyword_arg(call, "scale_wrt_gas")
    return wrt_gas is not None and bool_literal(wrt_gas.value) is not True


FRAMEWORK = Framework(
    name="DeepSpeed",
    optimizer_modules=("deepspeed.ops.adam.", "deepspeed.ops.lamb."),
    returns_by_position={"initialize": {0: ObjKind.ENGINE, 1: ObjKind.OPTIMIZER, 3: ObjKind.SCHEDULER}},
    backwards=(
        Backward(
            "deepspeed", owners=frozenset({"engine", "model_engine"}), owner_kinds=frozenset({ObjKind.ENGINE}),
            owner_pattern=_ENGINE_NAME, divides_by_count=True, decides_sync=True,
            count=CountSetting(
                "deepspeed",
                tokens=("gradient_accumulation_steps",),
                own_count=_own_count,
                divides_again="`{call}` divides it again (the DeepSpeed config's `gradient_accumulation_steps`)",
                opted_out=_opted_out,
            ),
        ),
    ),
    config_settings={
        "deepspeed": ConfigSetting(frozenset({"deepspeed.initialize"}), ("config", "config_params"), "gradient_accumulation_steps"),
    },
)
