"""Run a training script on fake tensors: shapes, dtypes and storages without the memory.

Under ``FakeTensorMode`` every factory function and op returns a tensor with
metadata only, so the memory meter counts the bytes a real run would allocate
while nothing is allocated. Values do not exist: ``item()``, ``float()`` and
``int()`` on a fake tensor whose value is unknown return 0 (a script that logs its loss keeps
running; a script whose control flow depends on tensor values is not
supported).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode

from gradlint.runtime._patching import Patcher


def _placeholder(original: Any) -> Any:
    def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        try:
            # fake tensors built from Python constants (an optimizer's step count) still know their value
            return original(self, *args, **kwargs)
        except DataDependentOutputException:
            if not isinstance(self, FakeTensor):
                raise
            return False if self.dtype is torch.bool else (0.0 if self.dtype.is_floating_point else 0)

    return read


def _module_apply(original: Any) -> Any:
    """``Module._apply`` (behind ``to``, ``cuda``, ``half``, ``bfloat16``...) for modules of fake tensors.

    torch's own version swaps each parameter for its converted copy, which
    fails on fake tensors (the fake mode holds weak references to them). A
    fake parameter takes the converted fake tensor as its ``.data`` instead:
    same object, new device and dtype, as the real conversion leaves it.
    """

    def _apply(module: torch.nn.Module, fn: Any, recurse: bool = True) -> torch.nn.Module:
        if not any(isinstance(p, FakeTensor) for p in module._parameters.values()):
            return original(module, fn, recurse)
        if recurse:
            for child in module.children():
                child._apply(fn)
        for key, param in module._parameters.items():
            if param is None:
                continue
            with torch.no_grad():
                applied = fn(param)
            if applied is not param:
                param.data = applied
            if param.grad is not None:
                with torch.no_grad():
                    grad = fn(param.grad)
                if grad is not param.grad:
                    param.grad = grad.requires_grad_(param.grad.requires_grad)
        for key, buf in module._buffers.items():
            if buf is not None:
                module._buffers[key] = fn(buf)
        return module

    return _apply


def _is_cuda(device: Any) -> bool:
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, torch.device) and device.type == "cuda"


class CudaAsCpu(TorchFunctionMode):
    """Every CUDA device a torch call names becomes the CPU, in a torch built without CUDA.

    Fake CUDA tensors can be created there, but autograd on them aborts the
    process (it asks the missing CUDA runtime for a stream). The estimate is
    of bytes, which do not depend on the device, so ``device="cuda"``,
    ``.to("cuda")`` and ``.cuda()`` simply stay on the CPU.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        name = getattr(func, "__name__", "")
        if name == "cuda":  # Tensor.cuda(device=None, non_blocking=False)
            return args[0]
        if name == "to":
            args = tuple("cpu" if _is_cuda(a) else a for a in args)
        return func(*args, **kwargs)


def _cpu_autocast(original_init: Any) -> Any:
    """``autocast("cuda", ...)`` as ``autocast("cpu", ...)``: the CUDA lines run on the CPU in the estimate."""

    def __init__(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        original_init(self, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    return __init__


# What a script asks of the CUDA runtime, answered as one device with nothing allocated:
# the estimate is of what the script would allocate, on any device.
_FAKE_CUDA = {
    "is_available": lambda: True,
    "device_count": lambda: 1,
    "current_device": lambda: 0,
    "set_device": lambda device: None,
    "synchronize": lambda device=None: None,
    "empty_cache": lambda: None,
    "reset_peak_memory_stats": lambda device=None: None,
    "memory_allocated": lambda device=None: 0,
    "max_memory_allocated": lambda device=None: 0,
    "is_bf16_supported": lambda *args, **kwargs: True,
    "get_device_name": lambda device=None: "fake CUDA device (gradlint measure --fake)",
}


@contextlib.contextmanager
def fake_tensors() -> Iterator[FakeTensorMode]:
    """Enter ``FakeTensorMode`` with value reads (``item``, ``float``, ``int``) answered by 0.

    Module and tensor conversions (``to``, ``cuda``, ``half``, ``bfloat16``)
    work on fake tensors, and a CUDA device is reported available, so the
    lines every large-model script has run as they would on a GPU.
    """
    patcher = Patcher()
    for name in ("item", "__float__", "__int__"):
        patcher.set(torch.Tensor, name, _placeholder(getattr(torch.Tensor, name)))
    patcher.set(torch.nn.Module, "_apply", _module_apply(torch.nn.Module._apply))
    cuda_as_cpu = not torch.backends.cuda.is_built()
    if cuda_as_cpu:
        patcher.set(torch.autocast, "__init__", _cpu_autocast(torch.autocast.__init__))
    for name, answer in _FAKE_CUDA.items():
        patcher.set(torch.cuda, name, answer)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode, (CudaAsCpu() if cuda_as_cpu else contextlib.nullcontext()):
            yield mode
    finally:
        patcher.restore()
