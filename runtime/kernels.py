"""Which kernel a ``torch.optim`` optimizer steps with, and whether a fused one exists for its parameters.

torch has three implementations of most optimizers: a Python loop over the
parameters (``foreach=False``), multi-tensor ``_foreach_*`` ops (the default
on CUDA) and, for Adam, AdamW, SGD and Adagrad, one fused kernel per device and
dtype (``fused=True``, on the devices of
``torch.utils._foreach_utils._get_fused_kernels_supported_devices``, CPU and
CUDA included). They compute the same update with different rounding, and the
fused kernel makes no temporaries the size of a parameter.
"""

from __future__ import annotations

from typing import Iterable

import torch

FOR_LOOP, FOREACH, FUSED = "for-loop", "foreach", "fused"

# the optimizers whose step has a fused kernel (their constructors take fused=)
FUSED_OPTIMIZERS: tuple[type, ...] = tuple(
    cls for cls in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad)
    if "fused" in cls.__init__.__code__.co_varnames
)


def _fused_devices() -> list[str]:
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return _get_fused_kernels_supported_devices()


def params_of(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every parameter of every group."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def fused_supports(cls: type, params: Iterable[torch.Tensor]) -> bool:
    """Whether ``cls(params, fused=True)`` can step these parameters: a fused class, floating point, supported devices."""
    if not issubclass(cls, FUSED_OPTIMIZERS):
        return False
    devices = _fused_devices()
    return all(torch.is_floating_point(p) and p.device.type in devices for p in params)


def kernel_of(optimizer: torch.optim.Optimizer, group: dict | None = None) -> str:
    """``fused``, ``foreach`` or ``for-loop``: what ``step()`` runs for ``group`` (default: the first group).

    ``foreach=None`` is resolved as torch resolves it at step time.
    """
    from torch.optim.optimizer import _default_to_fused_or_foreach

    group = group if group is not None else optimizer.param_groups[0]
    if group.get("fused"):
        return FUSED
    foreach = group.get("foreach")
    if foreach is None:
        _, foreach = _default_to_fused_or_foreach(list(group["params"]), bool(group.get("differentiable")), False)
    return FOREACH if foreach else FOR_LOOP


def fused_candidate(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer could step with ``fused=True`` on its parameters' devices and does not."""
    if any(group.get("differentiable") for group in optimizer.param_groups):
        return False
    if all(group.get("fused") for group in optimizer.param_groups):
        return False
    return fused_supports(type(optimizer), params_of(optimizer))
