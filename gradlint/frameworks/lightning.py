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
``no_backward_sync(model, enabled=...)`` skips that. Which strategy Fabric
runs: with ``strategy="auto"`` (the default), its connector picks DDP when
``num_nodes > 1`` or when there are several devices, and
``SingleDeviceStrategy`` (no wrap) for one device on one node, so
``Fabric(devices=1)`` on one node all-reduces nothing; the arguments may also
come from the environment the ``fabric run`` command line sets (``LT_DEVICES``,
refused when it contradicts a value the code gives).
``clip_gradients`` (of a LightningModule or of Fabric) is theirs.
``Trainer.is_last_batch`` is true on the last batch of an epoch only: a
branch that needs it runs once per epoch (Lightning's documentation steps an
epoch-wise scheduler under ``if self.trainer.is_last_batch:`` in manual
optimization). Under manual optimization ``self.optimizers()`` hands back
the optimizers ``configure_optimizers`` returned, in that order (a lone one
alone); ``toggle_optimizer(opt)`` sets ``requires_grad = False`` on every
parameter of the trainer's other optimizers until ``untoggle_optimizer``, so
a loss backpropagated in between leaves their parameters alone. Under
automatic optimization a module's or a callback's ``on_after_backward``
and ``on_before_optimizer_step`` run between the backward and the
optimizer step (``Precision.post_backward`` and ``_after_closure`` in
``src/lightning/pytorch/plugins/precision/precision.py`` call the
callbacks' and the module's hooks): gradients they change are what the
step applies. Under manual optimization Lightning steps no scheduler that
``configure_optimizers`` returns (``TrainingEpochLoop._update_learning_rates``
in ``src/lightning/pytorch/loops/training_epoch_loop.py`` returns at once
when ``automatic_optimization`` is off; ``self.lr_schedulers()`` hands them
back to be stepped by hand), and calls none of the module's
``optimizer_step``, ``optimizer_zero_grad`` and ``lr_scheduler_step`` hooks
(``loops/optimization/automatic.py`` calls them; under manual optimization
``LightningOptimizer.step`` goes to the strategy's ``optimizer_step``): a
warm-up written in an overridden ``optimizer_step`` never runs.
A ``configure_optimizers`` that returns ``None`` leaves the fit without an
optimizer: ``_init_optimizers_and_lr_schedulers`` (``core/optimizer.py``;
``TrainerOptimizersMixin.init_optimizers`` before 1.6) warns once that "this
fit will run with no optimizer" and steps a ``_MockOptimizer`` instead.

Where it was read: pytorch-lightning tag 2.6.1,
``src/lightning/pytorch/loops/optimization/automatic.py``
(``ClosureResult.from_training_step_output``, called with
``trainer.accumulate_grad_batches``), ``src/lightning/pytorch/core/module.py``
(``LightningModule.manual_backward``, ``automatic_optimization``,
``clip_gradients``, ``optimizers``, ``toggle_optimizer``), ``src/lightning/pytorch/trainer/configuration_validator.py``
("Automatic gradient accumulation is not supported for manual
optimization"), ``src/lightning/fabric/fabric.py`` (``Fabric.setup``,
``setup_module``, ``backward``, ``clip_gradients``, ``no_backward_sync``),
``src/lightning/fabric/connector.py`` (``_Connector.__init__``,
``_choose_strategy``, ``_argument_from_env``),
``src/lightning/pytorch/trainer/trainer.py`` (``Trainer.is_last_batch``:
``fit_loop.epoch_loop.batch_progress.is_last_batch``, which
``src/lightning/pytorch/loops/training_epoch_loop.py`` sets from the data
fetcher's ``done``).
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
    OptimizersReturned,
    ReturnedLoss,
    SchedulersLeftToModule,
    Subclasses,
    Wrap,
)
from gradlint.kinds import ObjKind
from gradlint.syntax import bool_literal, class_methods, dotted_name, walk

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


def _one_process(arguments: dict[str, object]) -> bool:
    """``Fabric(devices=1)`` on one node (``num_nodes`` left out or 1): one process, nothing to all-reduce.

    With ``strategy="auto"`` the connector then picks ``SingleDeviceStrategy`` (``_choose_strategy``: "ddp" only
    for ``num_nodes > 1`` or several devices), which wraps nothing; a strategy named outright (``"ddp"``) still
    runs one process, whose all-reduce has no other rank to wait for. ``devices=[0]`` is one device too.
    ``num_nodes=4`` with one device each is four processes: DDP.
    """
    devices = arguments.get("devices", arguments.get("2"))
    one_device = devices == 1 or (type(devices) is list and len(devices) == 1)
    nodes = arguments.get("num_nodes", arguments.get("3", 1))
    return one_device and nodes == 1 and "*" not in arguments and "**" not in arguments


def _fabric_message(name: str, where: str) -> str:
    return (
        f"`{name}` is set up by Fabric, whose multi-device strategies all-reduce the gradients of every backward, "
        f"but {where}: run the micro-batches that do not step inside "
        f"`fabric.no_backward_sync({name}, enabled=...)`"
    )




def _manual_optimization(cls: cst.ClassDef) -> bool:
    """Whether a LightningModule sets ``automatic_optimization`` to anything but True (or overrides the property), or
    calls ``self.manual_backward``, which raises under automatic optimization (``_verify_is_manual_optimization`` in
    ``core/module.py``): a base class whose subclass, in another file, turns it off. A class that overrides
    ``manual_backward`` drops that check and may call it under automatic optimization."""
    methods = class_methods(cls)
    own_manual_backward = any(f.name.value == "manual_backward" for f in methods)
    for function in methods:
        if function.name.value == "automatic_optimization":
            return True
        for node in walk(function):
            if type(node) is cst.Assign and any(dotted_name(t.target) == "self.automatic_optimization" for t in node.targets):
                if bool_literal(node.value) is not True:
                    return True
            if type(node) is cst.Call and _manual_backward_of_self(node) and not own_manual_backward:
                return True
    return False


def _tests_switching_to_manual(cls: cst.ClassDef) -> frozenset[str]:
    """The tests (as written) of the ``if`` statements that hold every ``self.automatic_optimization = False`` of a
    LightningModule, when each such assignment sits under one (``if optim_fn is None:``: manual optimization is a
    setting); empty when one is unconditional, or the class says manual otherwise (the property overridden)."""
    methods = class_methods(cls)
    if any(f.name.value == "automatic_optimization" for f in methods):
        return frozenset()
    module = cst.Module(body=[])
    tests: set[str] = set()
    for function in methods:
        pending: list[tuple[cst.CSTNode, str | None]] = [(function.body, None)]
        while pending:
            node, test = pending.pop()
            if type(node) is cst.If:
                pending.append((node.body, module.code_for_node(node.test)))
                if node.orelse is not None:
                    pending.append((node.orelse, None))  # an else (or elif) branch: not the test itself
                continue
            if type(node) is cst.Assign and any(dotted_name(t.target) == "self.automatic_optimization" for t in node.targets):
                if bool_literal(node.value) is not True:
                    if test is None:
                        return frozenset()
                    tests.add(test)
            pending.extend((child, test) for child in node.children)
    return frozenset(tests)


def _manual_backward_of_self(call: cst.Call) -> bool:
    """``self.manual_backward(loss)``."""
    return type(call.func) is cst.Attribute and call.func.attr.value == "manual_backward" and dotted_name(call.func.value) == "self"


def _manual_classes(index: ModuleIndex) -> frozenset[str]:
    """The names of the classes of the module that turn automatic optimization off, or call ``self.manual_backward`` (which
    raises under automatic optimization). Computed once per file."""

    def compute() -> frozenset[str]:
        manual = set()
        for function in index.functions:
            owner = index.class_of.get(function)
            if owner is None:
                continue
            values = index.assignments.get(function, {}).get("self.automatic_optimization", [])
            if any(bool_literal(v) is False for v in values):
                manual.add(owner)
            elif index.method_of(owner, "manual_backward") is None and any(
                type(n) is cst.Call and _manual_backward_of_self(n) for n in index.file.walk(function.body)
            ):
                # it raises under automatic optimization: the class runs under manual (unless the class overrides
                # ``manual_backward``, dropping that check, to backpropagate by hand under automatic optimization)
                manual.add(owner)
        return frozenset(manual)

    return index.file.once(_manual_classes, compute)


def _manual_training_steps(index: ModuleIndex) -> dict[cst.FunctionDef, str]:
    """The ``training_step`` of each class that runs under manual optimization (``_manual_classes``).

    Lightning calls ``training_step`` once per batch; under manual
    optimization it leaves backward, step and clearing to that method (its
    manual loop calls no ``zero_grad``, and ``manual_backward`` divides by
    nothing: ``accumulate_grad_batches`` other than 1 is refused).
    """
    steps = {}
    for owner in _manual_classes(index):
        step = index.class_methods.get(owner, {}).get("training_step")
        if step is not None:
            steps[step] = "Lightning calls `training_step` once per batch and, under manual optimization, leaves the gradient work to it"
    return steps


def _accumulation_count_of_manual_modules(index: ModuleIndex) -> dict[cst.FunctionDef, frozenset[str]]:
    """``self.trainer.accumulate_grad_batches`` in every method of a class under manual optimization: it is 1.

    Lightning's configuration validator refuses ``accumulate_grad_batches``
    other than 1 when ``automatic_optimization`` is off
    (``trainer/configuration_validator.py``: "Automatic gradient accumulation
    is not supported for manual optimization"), so a guard
    ``(step + 1) % self.trainer.accumulate_grad_batches == 0`` in such a
    module passes on every batch.
    """
    held = frozenset({"self.trainer.accumulate_grad_batches"})
    return {
        method: held
        for owner in _manual_classes(index)
        for method in index.class_methods.get(owner, {}).values()
    }


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
            owner_names=frozenset({"fabric"}), quiet_when_built=_one_process,
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
    counts_at_one=_accumulation_count_of_manual_modules,
    epoch_end_flags=frozenset({"is_last_batch"}),
    # ``training_step(self, batch, batch_idx)``: the fit loop hands the batch's index within the epoch, from 0 each
    # epoch (the epoch loop's ``on_run_start`` enumerates the epoch's data afresh: ``enumerate(iter(...))``)
    pass_index={"training_step": 2},
    optimizers_of_hook={"optimizers": "configure_optimizers"},
    grad_toggles=frozenset({"toggle_optimizer"}),
    keeps_gradients=frozenset({"toggle_optimizer", "untoggle_optimizer", "toggled_optimizer"}),
    hooks_before_step=frozenset({"on_after_backward", "on_before_optimizer_step"}),
    optimizers_returned=(
        OptimizersReturned(
            "lightning_module", "configure_optimizers",
            none_returned="Lightning then runs the fit with no optimizer (it steps a `_MockOptimizer` after one warning)",
        ),
    ),
    schedulers_left=(
        SchedulersLeftToModule(
            "lightning_module", "configure_optimizers", manual=_manual_optimization, fetch="lr_schedulers",
            manual_under=_tests_switching_to_manual,
            tokens=("automatic_optimization", "configure_optimizers"),
            words="under manual optimization (`self.automatic_optimization = False`) Lightning steps none of them",
            step_hook="training_step",
            uncalled_hooks=("optimizer_step", "optimizer_zero_grad", "lr_scheduler_step"),
        ),
    ),
)
