"""NVIDIA apex: its ``DistributedDataParallel``, ``amp.scale_loss`` and its fused optimizers.

What it does to gradients. ``apex.parallel.DistributedDataParallel``
all-reduces the gradients of every backward from hooks it installs; it has
no ``no_sync()``: ``disable_allreduce()`` switches the all-reduce off until
``enable_allreduce()``. ``with amp.scale_loss(loss, optimizer) as scaled_loss``
yields ``loss.float() * loss_scale``: the loss it is handed, multiplied by
the loss scale, so a loss divided on its way there stays divided.
``apex.optimizers`` and ``apex.contrib.optimizers`` hold optimizers (its
fp16 optimizers' ``backward(loss)`` are read with
:mod:`gradlint.frameworks.fp16_optimizers`).

Where it was read: apex tag 23.10, ``apex/parallel/distributed.py``
(``DistributedDataParallel.enable_allreduce``, ``disable_allreduce``,
``allreduce_hook``), ``apex/amp/handle.py`` (``scale_loss``: ``yield
(loss.float())*loss_scale``). ``apex.parallel`` and ``apex.amp`` are gone
from apex's main branch (25.09); code written for them is still common.
"""

from __future__ import annotations

import libcst as cst

from gradlint.frameworks.framework import Framework, SyncSwitch, Wrap


def _message(name: str, where: str) -> str:
    return (
        f"the apex DDP model `{name}` all-reduces the gradients of this backward on every micro-batch, "
        f"but {where}: apex's `DistributedDataParallel` has no `no_sync()`; call `{name}.disable_allreduce()` "
        f"before the micro-batches that do not step and `{name}.enable_allreduce()` before the one that does"
    )


def _switches_off(call: cst.Call) -> bool:
    """``model.disable_allreduce()``."""
    return not call.args


FRAMEWORK = Framework(
    name="apex",
    optimizer_modules=("apex.optimizers.", "apex.contrib.optimizers."),
    sync_switches=(SyncSwitch("disable_allreduce", _switches_off),),
    # Read as torch's DistributedDataParallel (the same class name, the same per-backward all-reduce); its constructor
    # under ``apex.parallel`` tells messages whose it is.
    wraps=(Wrap("apex_ddp", _message, class_name="DistributedDataParallel", constructor_prefix="apex.parallel.", wrapper_object=True),),
    loss_scalers=frozenset({"scale_loss"}),
)
