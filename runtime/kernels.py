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

import contextlib
import importlib
from typing import Iterable, Iterator

import torch

FOR_LOOP, FOREACH, FUSED = "for-loop", "foreach", "fused"
TRITON = "triton"  # torch-optimi's own kernels, where a group asks for them (triton=True)

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


# The lists torch reads to decide whether its foreach kernels may take a tensor, by its exact type
# (torch.distributed.tensor adds DTensor to the same two lists the same way).
_FOREACH_TYPE_LISTS = ("torch.optim.optimizer", "torch.utils._foreach_utils")


@contextlib.contextmanager
def fake_tensors_take_foreach_kernels() -> Iterator[None]:
    """Within: torch offers its foreach kernels to fake tensors as to the real tensors they stand for.

    torch picks foreach only for tensors whose type is exactly ``Tensor`` or
    ``Parameter``; a fake parameter's type is ``FakeTensor``. On CUDA, where
    foreach is the default, a fake run would otherwise step with the
    per-parameter loop and leave out the foreach kernels' temporaries (1.1 GiB
    of ViT-L's 5.7 GiB peak with Adam, measured on an H100). Nests.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    lists = [importlib.import_module(name)._foreach_supported_types for name in _FOREACH_TYPE_LISTS]
    added = [types for types in lists if FakeTensor not in types]
    for types in added:
        types.append(FakeTensor)
    try:
        yield
    finally:
        for types in added:
            types.remove(FakeTensor)


def fused_supports(cls: type, params: Iterable[torch.Tensor]) -> bool:
    """Whether ``cls(params, fused=True)`` can step these parameters: a fused class, floating point, supported devices."""
    if not issubclass(cls, FUSED_OPTIMIZERS):
        return False
    devices = _fused_devices()
    return all(torch.is_floating_point(p) and p.device.type in devices for p in params)


def kernel_of(optimizer: torch.optim.Optimizer, group: dict | None = None) -> str:
    """``fused``, ``triton``, ``foreach`` or ``for-loop``: what ``step()`` runs for ``group`` (default: the first).

    ``foreach=None`` is resolved as torch resolves it at step time, for fake
    parameters as for the real ones they stand for.
    """
    from torch.optim.optimizer import _default_to_fused_or_foreach

    group = group if group is not None else optimizer.param_groups[0]
    if group.get("fused"):
        return FUSED
    if group.get("triton"):
        return TRITON
    foreach = group.get("foreach")
    if foreach is None:
        with fake_tensors_take_foreach_kernels():
            _, foreach = _default_to_fused_or_foreach(list(group["params"]), bool(group.get("differentiable")), False)
    return FOREACH if foreach else FOR_LOOP


def fused_candidate(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer could step with ``fused=True`` on its parameters' devices and does not."""
    if any(group.get("differentiable") for group in optimizer.param_groups):
        return False
    if all(group.get("fused") for group in optimizer.param_groups):
        return False
    return fused_supports(type(optimizer), params_of(optimizer))
