"""DeepSpeed: the engine ``deepspeed.initialize`` returns, and its ``backward``.

What it does to gradients. ``deepspeed.initialize(...)`` returns
``(engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler)``,
whatever names the script unpacks them into (``model, opt, _, _ = ...``,
``engine, *_ = ...``). ``engine.backward(loss, retain_graph=False,
scale_wrt_gas=True)`` divides by ``engine.gradient_accumulation_steps()``
unless called with ``scale_wrt_gas=False``:

- v0.14.0 to v0.18.2: ``backward`` (from v0.18.0 ``_backward_prologue``) runs
  ``if self.gradient_accumulation_steps() > 1 and scale_wrt_gas: loss =
  self._scale_loss_by_gas(loss.float())``, which divides a tensor (or each tensor
  of a tuple or list; any other type goes through undivided, with a warning);
  an engine attribute ``scale_wrt_gas`` set to anything but None overrides the
  argument; v0.17.0-v0.18.2 skip the division inside ``engine.no_sync()`` or
  with ``enable_backward_allreduce`` off.
- v0.18.3 on (read at v0.19.5 and at the 0.19.6 development head): ``backward``
  keeps ``scale_wrt_gas`` in ``self._scale_wrt_gas``, and each parameter's
  gradient hook, ``_backward_prologue_per_tensor``, returns ``grad /
  self.gradient_accumulation_steps()`` while it is true, also with the 0.19
  ``managed_gradient_accumulation: false`` option (the returned loss is
  ``loss / gradient_accumulation_steps()`` for logging). The engine's forward
  registers the same prologue as a backward hook on the tensors it returns
  (``_register_output_backward_hooks``), so a plain ``loss.backward()`` of a
  loss computed from ``engine(batch)`` is divided by the count too; before
  v0.18.3 a plain backward through an engine was not supported.

The count is the configuration's ``"gradient_accumulation_steps"``, or, when the
configuration leaves it out, ``train_batch_size // train_micro_batch_size_per_gpu
// world_size`` (``DeepSpeedConfig._set_batch_related_parameters``); so a loss
divided by hand by that key of the configuration handed to ``initialize``
(``config=ds_config`` and ``ds_config["gradient_accumulation_steps"]``, however the
dict was made: a literal, a name, ``json.load``), by the value written under that
key, or by ``engine.gradient_accumulation_steps()``, is divided twice. A
configuration given as a JSON file path (``args.deepspeed_config``) is unknown.
The engine all-reduces only at its accumulation boundary
(``is_gradient_accumulation_boundary``): it decides the micro-batches itself,
whatever the loop around it does. Its fused optimizers (``deepspeed.ops.adam``,
``deepspeed.ops.lamb``) are optimizers.

Where it was read: DeepSpeed v0.19.5 and the development head after it
(0.19.6, commit edaa7221), ``deepspeed/__init__.py`` (``initialize``:
``return_items = [engine, engine.optimizer, engine.training_dataloader,
engine.lr_scheduler]``), ``deepspeed/runtime/engine.py`` (``DeepSpeedEngine.backward``,
``_backward_prologue_per_tensor``, ``_backward_epilogue``,
``is_gradient_accumulation_boundary``, ``gradient_accumulation_steps``,
``_scale_loss_by_gas``), ``deepspeed/runtime/config.py``
(``_set_batch_related_parameters``, ``managed_gradient_accumulation``);
``backward`` and ``_backward_prologue`` at v0.14.0, v0.16.5, v0.17.0, v0.18.0, v0.18.2 and v0.18.3.
The engine's backward has divided by the count since the first releases.
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
    returns_by_position={"deepspeed.initialize": {0: ObjKind.ENGINE, 1: ObjKind.OPTIMIZER, 3: ObjKind.SCHEDULER}},
    backwards=(
        Backward(
            "deepspeed", owners=frozenset({"engine", "model_engine"}), owner_kinds=frozenset({ObjKind.ENGINE}),
            owner_pattern=_ENGINE_NAME, divides_by_count=True, divides_outputs=True, decides_sync=True,
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
