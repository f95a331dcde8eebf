"""Run a training script on fake tensors: shapes, dtypes and storages without the memory.

Under ``FakeTensorMode`` every factory function and op returns a tensor with
metadata only, so the memory meter counts the bytes a real run would allocate
while nothing is allocated. Values do not exist: ``item()``, ``float()`` and
``int()`` on a fake tensor whose value is unknown return 0 (a script that logs its loss keeps
running; a script whose control flow depends on tensor values is not
supported).

Every fake tensor follows one device story, chosen once per run:

- ``cuda`` where a GPU is visible: fake tensors keep their CUDA device, and
  what the real run would choose from the device (CUDA's autocast lists,
  attention kernels) is chosen from it;
- ``cpu`` everywhere else (a torch built without CUDA, or with CUDA but no
  visible GPU): every CUDA device a call names becomes the CPU, and
  ``autocast("cuda")`` becomes ``autocast("cpu")``. Fake CUDA tensors cannot
  carry a training step there: a CPU-only build refuses device moves to CUDA
  even on fake tensors ("not linked with support for cuda devices"), and
  without a GPU the kernels that read the device's properties cannot run.

In both, a module converted with ``to``, ``cuda``, ``half`` or ``bfloat16``
moves each parameter object itself, so parameters and inputs never end up on
two devices, and torch offers fake tensors the multi-tensor kernels it would
offer the real ones (:func:`gradlint.runtime.kernels.fake_tensors_take_foreach_kernels`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode

from gradlint.runtime._patching import Patcher
from gradlint.runtime.kernels import fake_tensors_take_foreach_kernels


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
                # ``.data`` swaps the tensor's metadata but not the device a FakeTensor reports
                if isinstance(applied, FakeTensor) and isinstance(param, FakeTensor):
                    param.fake_device = applied.fake_device
            if param.grad is not None:
                with torch.no_grad():
                    grad = fn(param.grad)
                if grad is not param.grad:
                    param.grad = grad.requires_grad_(param.grad.requires_grad)
                    if isinstance(grad, FakeTensor) and isinstance(param.grad, FakeTensor):
                        param.grad.fake_device = grad.fake_device
        for key, buf in module._buffers.items():
            if buf is not None:
                module._buffers[key] = fn(buf)
        return module

    return _apply


def _is_cuda(device: Any) -> bool:
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, torch.device) and device.type == "cuda"


CUDA, CPU = "cuda", "cpu"
STORIES = {
    CUDA: "fake CUDA tensors on the visible GPU (its autocast lists and kernel choices)",
    CPU: "CUDA devices mapped to the CPU (no GPU visible): CPU kernel choices and CPU autocast lists",
}


def device_story() -> str:
    """``cuda`` where a GPU is visible, else ``cpu``: see the module's docstring."""
    return CUDA if torch.cuda.is_available() else CPU


class CudaAsCpu(TorchFunctionMode):
    """Every CUDA device a torch call names becomes the CPU: the ``cpu`` device story.

    Factory functions (``device="cuda"``, also through ``torch.device("cuda")``
    as a default device), ``.to("cuda")`` in any spelling and ``.cuda()``
    stay on the CPU, so every tensor of the run is a CPU tensor. The estimate
    is of bytes, which do not depend on the device.
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
    # every optimizer step asks (torch.optim.optimizer._cuda_graph_capture_health_check) once CUDA is "available";
    # a real answer initialises CUDA, which a CUDA build without a GPU cannot
    "is_current_stream_capturing": lambda: False,
    "get_device_name": lambda device=None: "fake CUDA device (gradlint measure --fake)",
}


class _FakeMode(FakeTensorMode):
    """``FakeTensorMode`` that decides once, before ``torch.cuda`` is patched to report a GPU, whether one exists.

    torch reads ``torch.cuda.is_available()`` at every entry and device move
    to decide whether it may initialise the device (``avoid_device_init``);
    the patched answer would make it try on a machine without a GPU.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._no_device = super().avoid_device_init

    @property
    def avoid_device_init(self) -> bool:  # type: ignore[override]
        return self._no_device


@contextlib.contextmanager
def fake_tensors(story: str | None = None) -> Iterator[FakeTensorMode]:
    """Enter ``FakeTensorMode`` with value reads (``item``, ``float``, ``int``) answered by 0.

    Module and tensor conversions (``to``, ``cuda``, ``half``, ``bfloat16``)
    work on fake tensors, and a CUDA device is reported available, so the
    lines every large-model script has run as they would on a GPU. ``story``:
    ``cuda`` or ``cpu`` (default: :func:`device_story`); the mode yielded
    names it in ``device_story``.
    """
    story = story or device_story()
    mode = _FakeMode(allow_non_fake_inputs=True)
    mode.device_story = STORIES[story]  # type: ignore[attr-defined]
    patcher = Patcher()
    for name in ("item", "__float__", "__int__"):
        patcher.set(torch.Tensor, name, _placeholder(getattr(torch.Tensor, name)))
    patcher.set(torch.nn.Module, "_apply", _module_apply(torch.nn.Module._apply))
    if story == CPU:
        patcher.set(torch.autocast, "__init__", _cpu_autocast(torch.autocast.__init__))
    for name, answer in _FAKE_CUDA.items():
        patcher.set(torch.cuda, name, answer)
    try:
        with fake_tensors_take_foreach_kernels(), mode, (CudaAsCpu() if story == CPU else contextlib.nullcontext()):
            yield mode
    finally:
        patcher.restore()
