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


@contextlib.contextmanager
def fake_tensors() -> Iterator[FakeTensorMode]:
    """Enter ``FakeTensorMode`` with value reads (``item``, ``float``, ``int``) answered by 0."""
    patcher = Patcher()
    for name in ("item", "__float__", "__int__"):
        patcher.set(torch.Tensor, name, _placeholder(getattr(torch.Tensor, name)))
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            yield mode
    finally:
        patcher.restore()
