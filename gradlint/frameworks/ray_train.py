"""Ray Train: ``ray.train.torch.prepare_model(model)`` wraps the model for data parallelism.

What it does to gradients. Inside a Ray Train worker's training function,
``prepare_model(model)`` moves the model to the worker's device and, when the
run has more than one worker (``world_size > 1``), wraps it in torch's
``DistributedDataParallel`` (``parallel_strategy="ddp"``, the default) or in
FSDP (``parallel_strategy="fsdp"``), or in nothing (``parallel_strategy=None``;
before Ray 2.1, ``wrap_ddp=False``). The wrapped model's backward all-reduces
as DDP's or FSDP's does (see :mod:`gradlint.frameworks.torch_ddp`): every
micro-batch of an accumulation all-reduces unless it runs inside the
returned model's ``no_sync()``. A DDP model decides in its forward whether the
coming backward all-reduces; FSDP in the backward. How many workers run is
the trainer's ``ScalingConfig(num_workers=N)``: a training function is
written to run on any number of them, so the wrap counts unless the module
pins one worker.

Where it was read: ray, ``python/ray/train/torch/train_loop_utils.py``:
``prepare_model`` and ``_TorchAccelerator.prepare_model`` (``if
parallel_strategy and world_size > 1: ... DataParallel =
DistributedDataParallel`` or ``FullyShardedDataParallel``; ``model =
DataParallel(model, **parallel_strategy_kwargs)``), at commit 59ec1d2 (Ray
2.1's API, ``parallel_strategy`` defaulting to ``"ddp"``), and the Ray 2.0
form at commit 009ba15 (``if wrap_ddp and world_size > 1: model =
DistributedDataParallel(...)``, ``wrap_ddp=True`` by default). Those two
versions only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from gradlint.frameworks.framework import Framework, Wrap, literal_arguments
from gradlint.frameworks.torch_ddp import FORWARD_DECIDES
from gradlint.syntax import callee_name

if TYPE_CHECKING:
    from gradlint.model import LoopModel

_PREPARE_MODEL = frozenset({"ray.train.torch.prepare_model", "ray.train.torch.train_loop_utils.prepare_model"})
# ``prepare_model(model, move_to_device, parallel_strategy)`` (Ray 2.1) or ``(model, move_to_device, wrap_ddp)`` (2.0)
_THIRD = "2"


def _strategy(arguments: dict[str, object]) -> object:
    """The parallel strategy a call asks for: ``"ddp"`` unless given (``wrap_ddp=True`` of Ray 2.0 is DDP too)."""
    if "*" in arguments or "**" in arguments:
        return ...
    strategy = arguments.get("parallel_strategy", arguments.get(_THIRD, "ddp"))
    if strategy is True:
        strategy = "ddp"
    if arguments.get("wrap_ddp", True) is not True:
        return None
    return strategy


def _leaves_unwrapped(arguments: dict[str, object]) -> bool:
    """``parallel_strategy=None``, ``wrap_ddp=False``, or a strategy that cannot be read (a variable)."""
    return _strategy(arguments) not in ("ddp", "fsdp")


def _arms_in_forward(arguments: dict[str, object]) -> bool:
    """A DDP wrap (the default) decides in its forward whether the coming backward all-reduces; FSDP does not."""
    return _strategy(arguments) == "ddp"


def _one_worker(model: LoopModel) -> bool:
    """Every ``ScalingConfig(...)`` of the module asks for ``num_workers=1`` (and there is one): one worker, no wrap."""
    def read() -> bool:
        configs = [
            node for node in model.file.walk(model.module) if type(node) is cst.Call and callee_name(node) == "ScalingConfig"
        ]
        return bool(configs) and all(literal_arguments(call).get("num_workers") == 1 for call in configs)

    return model.file.once(_one_worker, read)


def _message(name: str, where: str) -> str:
    return (
        f"`{name}` is prepared by Ray Train's `prepare_model`, which wraps it in DDP (or FSDP) when the run has more "
        f"than one worker, so every backward all-reduces the gradients, but {where}: run the micro-batches that do not "
        f"step inside `{name}.no_sync()`"
    )


FRAMEWORK = Framework(
    name="Ray Train",
    wraps=(
        Wrap(
            "ray_train", _message, constructors=_PREPARE_MODEL, wrapper_object=True, short="Ray Train's DDP",
            leaves_unwrapped=_leaves_unwrapped, reduces_nothing=_one_worker, arms_in_forward=_arms_in_forward,
            forward_decides=FORWARD_DECIDES,
            tokens=("prepare_model",),
        ),
    ),
)
