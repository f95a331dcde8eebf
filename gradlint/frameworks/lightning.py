"""PyTorch Lightning and Lightning Fabric.

What they do to gradients. Under automatic optimization, Lightning calls a
``LightningModule``'s ``training_step`` once per batch and backpropagates the
loss it returns divided by ``Trainer(accumulate_grad_batches=N)``
(``ClosureResult.from_training_step_output(..., normalize=accumulate_grad_batches)``:
``closure_loss / normalize``). Under manual optimization
(``self.automatic_optimization = False``) it still calls ``training_step``
once per batch but leaves clearing, stepping and dividing to it:
``manual_backward(loss)`` hands the loss to the strategy's backward
undivided, and a Trainer with ``accumulate_grad_batches`` other than 1 is
refused. Fabric divides nothing: ``Fabric.backward(loss)`` hands the loss to
the strategy; ``setup``/``setup_module`` wrap the model for the strategy
(DDP or FSDP on several devices: every backward all-reduces), and
``no_backward_sync(model, enabled=...)`` skips that.
``clip_gradients`` (of a LightningModule or of Fabric) is theirs.

Where it was read: pytorch-lightning tag 2.6.1,
``src/lightning/pytorch/loops/optimization/automatic.py``
(``ClosureResult.from_training_step_output``, called with
``trainer.accumulate_grad_batches``), ``src/lightning/pytorch/core/module.py``
(``LightningModule.manual_backward``, ``automatic_optimization``,
``clip_gradients``), ``src/lightning/pytorch/trainer/configuration_validator.py``
("Automatic gradient accumulation is not supported for manual
optimization"), ``src/lightning/fabric/fabric.py`` (``Fabric.setup``,
``setup_module``, ``backward``, ``clip_gradients``, ``no_backward_sync``).
The same since Lightning 2.0 (Fabric's ``no_backward_sync`` since 1.9);
``pytorch_lightning`` is the package's older name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from gradlint.frameworks.framework import (
    AccumulationSetting,
    Backward,
    Framework,
    NoSyncContext,
    ReturnedLoss,
    Subclasses,
    Wrap,
)
from gradlint.kinds import ObjKind
from gradlint.syntax import bool_literal, dotted_name, keyword_arg, number, walk

if TYPE_CHECKING:
    from gradlint.module_index import ModuleIndex

_TRAINER = frozenset({
    "lightning.Trainer",
    "lightning.pytorch.Trainer",
    "lightning.pytorch.trainer.Trainer",
    "lightning.pytorch.trainer.trainer.Trainer",
    "pytorch_lightning.Trainer",
    "pytorch_lightning.trainer.Trainer",
    "pytorch_lightning.trainer.trainer.Trainer",
})
_MODULE = frozenset({
    "lightning.LightningModule",
    "lightning.pytorch.LightningModule",
    "lightning.pytorch.core.LightningModule",
    "lightning.pytorch.core.module.LightningModule",
    "pytorch_lightning.LightningModule",
    "pytorch_lightning.core.LightningModule",
    "pytorch_lightning.core.module.LightningModule",
})


def _one_device(call: cst.Call) -> bool:
    """``Fabric(devices=1)``: a single-device strategy, nothing to all-reduce."""
    arg = keyword_arg(call, "devices")
    return arg is not None and number(arg.value) == 1


def _fabric_message(name: str, where: str) -> str:
    return (
        f"`{name}` is set up by Fabric, whose multi-device strategies all-reduce the gradients of every backward, "
        f"but {where}: run the micro-batches that do not step inside "
        f"`fabric.no_backward_sync({name}, enabled=...)`"
    )


def _methods(cls: cst.ClassDef) -> list[cst.FunctionDef]:
    body = cls.body.body if type(cls.body) is cst.IndentedBlock else []
    return [s for s in body if type(s) is cst.FunctionDef]


def _manual_optimization(cls: cst.ClassDef) -> bool:
    """Whether a LightningModule sets ``automatic_optimization`` to anything but True (or overrides the property)."""
    for function in _methods(cls):
        if function.name.value == "automatic_optimization":
            return True
        for node in walk(function):
            if type(node) is cst.Assign and any(dotted_name(t.target) == "self.automatic_optimization" for t in node.targets):
                if bool_literal(node.value) is not True:
                    return True
    return False


def _manual_training_steps(index: ModuleIndex) -> dict[cst.FunctionDef, str]:
    """The ``training_step`` of each class that turns automatic optimization off.

    Lightning calls ``training_step`` once per batch; under manual
    optimization it leaves backward, step and clearing to that method (its
    manual loop calls no ``zero_grad``, and ``manual_backward`` divides by
    nothing: ``accumulate_grad_batches`` other than 1 is refused).
    """
    manual_classes = set()
    for function in index.functions:
        owner = index.class_of.get(function)
        if owner is None:
            continue
        values = index.assignments.get(function, {}).get("self.automatic_optimization", [])
        if any(bool_literal(v) is False for v in values):
            manual_classes.add(owner)
    steps = {}
    for owner in manual_classes:
        step = index.class_methods.get(owner, {}).get("training_step")
        if step is not None:
            steps[step] = "Lightning calls `training_step` once per batch and, under manual optimization, leaves the gradient work to it"
    return steps


FRAMEWORK = Framework(
    name="Lightning and Fabric",
    named={"fabric": ObjKind.PREPARER},
    returns_given=frozenset({"setup"}),
    backwards=(
        # Lightning's manual optimization: a plain backward (AMP scaling aside), nothing divided; the strategy syncs
        Backward("lightning", method="manual_backward", any_owner=True, decides_sync=True),
        Backward("fabric", owners=frozenset({"fabric"})),  # Fabric.backward divides by nothing: Fabric has no accumulation setting
    ),
    no_sync=(NoSyncContext("no_backward_sync", model_argument=0),),
    wraps=(
        Wrap(
            "fabric", _fabric_message, prepare_methods=frozenset({"setup", "setup_module"}),
            owner_names=frozenset({"fabric"}), quiet_when_built=_one_device,
        ),
    ),
    accumulation_settings={"lightning": AccumulationSetting(_TRAINER, "accumulate_grad_batches")},
    subclasses=(Subclasses("lightning_module", _MODULE),),
    returned_losses=(
        ReturnedLoss(
            "lightning_module", "training_step", tokens=("accumulate_grad_batches", "training_step", "LightningModule"),
            settings="lightning", own_count="self.trainer.accumulate_grad_batches",
            divides_again="Lightning's automatic optimization divides it again by `accumulate_grad_batches`",
            manual=_manual_optimization,
        ),
    ),
    clip_methods=frozenset({"clip_gradients"}),
    per_batch=_manual_training_steps,
)
