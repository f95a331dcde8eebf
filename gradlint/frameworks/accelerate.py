"""accelerate: ``Accelerator.backward``, ``accumulate()``, ``prepare`` and the prepared optimizers and schedulers.

What it does to gradients. ``Accelerator.backward(loss)`` divides the loss
by ``gradient_accumulation_steps`` (the ``Accelerator``'s setting, 1 by
default) before backpropagating it, except under DeepSpeed, whose engine
divides instead (accelerate then hands the engine the undivided loss). It
does not skip the all-reduce: ``prepare`` (``prepare_model``) wraps the
model in ``DistributedDataParallel`` when the script runs on several
processes, unless an FSDP, DeepSpeed or Megatron-LM plugin is configured.
``accumulate(model)`` counts micro-batches: it sets ``sync_gradients`` on
the one that completes the accumulation and runs the others under the
model's ``no_sync()``; the optimizer ``prepare`` returns
(``AcceleratedOptimizer``) steps and clears only when ``sync_gradients`` is
set, and so does the prepared scheduler (``AcceleratedScheduler.step``
returns early otherwise). Only ``accumulate()`` (``_do_sync``) ever sets
``sync_gradients`` to False: a loop that calls ``accelerator.backward``
under a guard of its own steps the prepared optimizer and scheduler on
every call, and ``backward`` still divides the loss by
``gradient_accumulation_steps``. ``no_sync(model)`` enters the model's own.
``clip_grad_norm_`` (and ``clip_grad_value_``) unscales the gradients first:
under ``mixed_precision="fp16"`` (``native_amp``, a ``GradScaler``)
``unscale_gradients`` calls ``self.scaler.unscale_(opt)`` for every prepared
optimizer on each call, whether or not the micro-batch syncs, while the
prepared optimizer's ``step`` runs ``scaler.step`` and ``scaler.update()``
only when ``sync_gradients`` is set. A clip on a micro-batch that does not
sync leaves the scaler's state UNSCALED, and the next micro-batch's clip
raises ``unscale_() has already been called on this optimizer since the
last update()``.

Where it was read: accelerate v1.14.0, ``src/accelerate/accelerator.py``:
``Accelerator.__init__`` (``gradient_accumulation_steps``,
``gradient_accumulation_plugin``, ``deepspeed_plugin``, ``fsdp_plugin``,
``megatron_lm_plugin``, ``mixed_precision``: ``native_amp`` and
``self.scaler = get_grad_scaler(...)`` for fp16), ``backward``,
``accumulate``, ``_do_sync``, ``no_sync``, ``prepare``, ``prepare_model``
(``DistributedDataParallel(model, **kwargs)``), ``clip_grad_norm_``
(``self.unscale_gradients()``), ``unscale_gradients`` (``if self.native_amp
and self.mixed_precision == "fp16": ... self.scaler.unscale_(opt)``, no test
of ``sync_gradients``); ``src/accelerate/optimizer.py``:
``AcceleratedOptimizer.zero_grad`` and ``step`` (``if
self.gradient_state.sync_gradients: ... self.scaler.step(self.optimizer,
closure); self.scaler.update()``); ``src/accelerate/scheduler.py``:
``AcceleratedScheduler.step``. The same since accelerate 0.16
(``accumulate``, ``sync_gradients``); ``unscale_gradients`` tests
``self.native_amp and self.mixed_precision == "fp16"`` from v0.20.0 (v0.16.0:
``self.use_fp16 and self.native_amp``), the same condition.

``accelerator.no_sync(model)`` is read through torch's ``no_sync`` (the
same method name, :mod:`gradlint.frameworks.torch_ddp`); a clip through any
object of kind PREPARER is read as this framework's (one that unscales).
Whether a scheduler stepped inside ``accumulate()`` is certainly not a
prepared one is read off the whole module by names (``lr_scheduler`` and
``self.lr_scheduler`` are one name here); any sign that the scheduler might
be prepared elsewhere keeps the answer "no".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

import libcst as cst

from gradlint.frameworks.framework import (
    AccumulateContext,
    AccumulationSetting,
    Backward,
    CountSetting,
    Framework,
    UnscalingClip,
    Wrap,
)
from gradlint.frameworks.torch_ddp import AROUND_FORWARD
from gradlint.kinds import ObjKind
from gradlint.syntax import dotted_name, keyword_arg, number, terminal

if TYPE_CHECKING:
    from gradlint.model import LoopModel
    from gradlint.module_index import ModuleIndex
    from gradlint.parsed_file import ParsedFile

_ACCELERATOR = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})
# Accelerator settings under which a prepared model is sharded or handed to another engine, not wrapped in DDP.
_NOT_DDP_PLUGINS = ("fsdp_plugin", "deepspeed_plugin", "deepspeed_plugins", "megatron_lm_plugin")


def _not_ddp_plugin(arguments: dict[str, object]) -> bool:
    """``Accelerator(fsdp_plugin=...)`` and the like (the constructor's arguments)."""
    return any(keyword in arguments for keyword in _NOT_DDP_PLUGINS)


def _requires_deepspeed(model: LoopModel) -> bool:
    """The module reads a setting of the DeepSpeed plugin outside any test of it
    (``accelerator.state.deepspeed_plugin.deepspeed_config["train_batch_size"] = ...``): without the plugin
    ``deepspeed_plugin`` is None and that line raises, so every run that trains has one, and ``prepare`` hands the model
    to a DeepSpeed engine, which reduces at its own accumulation boundary (no DDP wrap)."""
    def read() -> bool:
        parents = model.parents or {}
        for node in model.file.every_node(model.module):
            if type(node) is not cst.Attribute or type(node.value) is not cst.Attribute:
                continue
            if node.value.attr.value != "deepspeed_plugin" or dotted_name(node.value) is None:
                continue
            if not _under_deepspeed_test(model, parents, node):
                return True
        return False

    return model.file.once(_requires_deepspeed, read)


def _under_deepspeed_test(model: LoopModel, parents: dict, node: cst.CSTNode) -> bool:
    """Whether an ``if``/``while`` test, a conditional expression or a ``try`` around ``node`` may keep it from running
    without DeepSpeed."""
    child, current = node, parents.get(node)
    while current is not None:
        if type(current) in (cst.If, cst.While, cst.IfExp) and child is not current.test:
            if "deepspeed" in model.code(current.test).lower() or "distributed_type" in model.code(current.test):
                return True
        if type(current) in (cst.Try, cst.BooleanOperation):
            return True
        child, current = current, parents.get(current)
    return False


def _count_from_deepspeed(model: LoopModel, count: cst.BaseExpression | None) -> bool:
    """Whether the accumulation count is 1 unless read from a DeepSpeed config
    (``steps = plugin.deepspeed_config["gradient_accumulation_steps"]`` / ``else: steps = 1``): above 1 only under
    DeepSpeed, whose engine reduces at its own boundary."""
    from gradlint.module_index import Unpacked

    name = dotted_name(count) if count is not None else None
    if name is None or model.index is None:
        return False
    values = list(model.index.assigned_anywhere(name))
    return any("deepspeed" in model.code(v) for v in values if not isinstance(v, Unpacked)) and all(
        not isinstance(v, Unpacked) and (number(v) == 1 or "deepspeed" in model.code(v)) for v in values
    )


def _read_from_deepspeed_config(model: LoopModel, divisor: cst.BaseExpression) -> cst.CSTNode | None:
    """Where the module sets the divisor from a DeepSpeed config's count:
    ``args.gradient_accumulation_steps = accelerator.state.deepspeed_plugin.deepspeed_config["gradient_accumulation_steps"]``.

    That count is what a DeepSpeed engine divides the loss by; accelerate's ``backward`` hands the loss to it.
    """
    name = dotted_name(divisor)
    if name is None or model.index is None:
        return None
    for table in model.index.assignments.values():
        for value in table.get(name, ()):
            if type(value) is not cst.Subscript or len(value.slice) != 1 or type(value.slice[0].slice) is not cst.Index:
                continue
            key = value.slice[0].slice.value
            if _is_key(key, "gradient_accumulation_steps") and "deepspeed" in model.code(value.value).lower():
                return value
    return None


def _is_key(node: cst.BaseExpression, key: str) -> bool:
    return type(node) is cst.SimpleString and node.evaluated_value == key


def _entered_around_message(step: str, context_line: int, loop_line: int, count: str, count_line: int) -> str:
    return (
        f"`{step}` runs on every pass of the loop at line {loop_line}, but `accumulate()` is entered once around that "
        f"loop (line {context_line}): accelerate decides on entering whether the gradients sync, and its prepared "
        f"optimizer skips every step and clear until they do, so on all but one in `{count}` (line {count_line}) "
        f"entries nothing steps and the micro-batches pile up, and on that one every micro-batch steps; enter "
        f"`accumulate()` once per micro-batch, inside the loop"
    )


def _unheld_message(step: str, backward: str, backward_line: int, count: str, line: int) -> str:
    return (
        f"`{step}` steps on every batch, but `{backward}` at line {backward_line} divides the loss by the Accelerator's "
        f"`gradient_accumulation_steps` (`{count}`, line {line}) and the loop never enters `accumulate()`, the only "
        f"place accelerate holds the prepared optimizer's step back: nothing accumulates, and each step is that many "
        f"times too small; run the batch in `with accelerator.accumulate(model):`, or build the Accelerator without the count"
    )


def _read_elsewhere_message(divisor: str, line: int, call: str) -> str:
    # No fix: without DeepSpeed the hand division is the only one, and dropping it would be wrong there.
    return (
        f"the loss is divided by `{divisor}` here and, under DeepSpeed, where "
        f"`{divisor}` is read from its config (line {line}), "
        f"`{call}` hands it to the engine's `backward`, which divides it again: each "
        f"step is that many times too small; build the `Accelerator` with `gradient_accumulation_steps`, "
        f"accumulate in `accelerator.accumulate(model)` and hand it the undivided loss"
    )


def _wrap_message(name: str, where: str) -> str:
    return (
        f"`{name}` is prepared by accelerate, which wraps it in DistributedDataParallel when the script runs on "
        f"several processes, and `accelerator.backward` does not skip the all-reduce: every micro-batch all-reduces, "
        f"but {where}: run the micro-batches that do not step inside `accelerator.no_sync({name})`, or set "
        f"`gradient_accumulation_steps` and use `accelerator.accumulate({name})`"
    )


def _clip_message(clip: str, block_line: int) -> str:
    return (
        f"`{clip}` runs on every micro-batch inside `accumulate()` at line "
        f"{block_line}, also on those that do not step: it clips partial (and, under DDP, "
        f"not yet all-reduced) gradients; clip under `if accelerator.sync_gradients:`"
    )


def _plain_backward_message(backward: str, block_line: int) -> str:
    # Accelerator.backward divides by gradient_accumulation_steps (but under DeepSpeed, whose engine does);
    # accumulate() only skips the sync and the prepared optimizer's step and zero_grad (accelerate 1.x source).
    return (
        f"`{backward}` inside `accumulate()` at line {block_line} backpropagates the undivided loss: accelerate divides "
        f"by `gradient_accumulation_steps` only in `accelerator.backward`, and `accumulate()` only skips the sync, "
        f"step and clear until the micro-batch that syncs, so the step applies the sum of the micro-batches' "
        f"gradients; call `accelerator.backward(loss)`"
    )


def _clear_message(zero: str, block_line: int, optimizer: str) -> str:
    return (
        f"`{zero}` runs on every micro-batch inside `accumulate()` at line "
        f"{block_line}, which skips only the prepared optimizer's `step()` and `zero_grad()` "
        f"until the micro-batch that syncs: only the last micro-batch's gradients reach `{optimizer}`'s step; "
        f"clear with `{optimizer}.zero_grad()`"
    )


def _early_clear_message(zero: str, backward_line: int, block_line: int, step: str) -> str:
    return (
        f"`{zero}` comes before the backward at line {backward_line} inside "
        f"`accumulate()` at line {block_line}: accelerate lets the prepared optimizer's `zero_grad()` "
        f"run only on the micro-batch that syncs, so there it clears the gradients the earlier micro-batches "
        f"accumulated before the last backward; clear after `{step}` instead"
    )


def _unscaling_clip_message(clip: str, block_line: int, fp16_line: int) -> str:
    return (
        f"`{clip}` runs on every micro-batch inside `accumulate()` at line {block_line}, and with "
        f"`mixed_precision=\"fp16\"` (line {fp16_line}) accelerate's clip calls its GradScaler's `unscale_` each time, "
        f"while the prepared optimizer steps and calls `update()` only on the micro-batch that syncs: the second "
        f"micro-batch raises `unscale_() has already been called on this optimizer since the last update()`; clip "
        f"under `if accelerator.sync_gradients:`"
    )


def _fp16_accumulating(model: LoopModel) -> cst.Call | None:
    """The ``Accelerator(...)`` the module builds with ``mixed_precision="fp16"`` and an accumulation count that may
    exceed 1 (or a plugin, or ``**kwargs``), if any: its clips unscale through a GradScaler on micro-batches that
    do not sync. A precision or count read from elsewhere is not known here."""
    if model.index is None:
        return None
    for call in _facts(model.index).calls:
        if not model.index.qualified_names(call.func) & _ACCELERATOR:
            continue
        precision = keyword_arg(call, "mixed_precision")
        if precision is None or type(precision.value) is not cst.SimpleString or precision.value.evaluated_value != "fp16":
            continue
        count = keyword_arg(call, "gradient_accumulation_steps")
        may_accumulate = count is not None and (number(count.value) is None or number(count.value) > 1)
        if may_accumulate or keyword_arg(call, "gradient_accumulation_plugin") or any(a.star == "**" for a in call.args):
            return call
    return None


def _scheduler_message(scheduler: str, optimizer: str) -> str:
    return (
        f"`{scheduler}.step()` runs on every micro-batch inside `accumulate()`, but "
        f"`{scheduler}` never goes through `accelerator.prepare`: unlike the prepared "
        f"`{optimizer}`, it does not skip the micro-batches that do not step, so the "
        f"schedule runs that many times too fast; prepare it with the optimizer"
    )


# -- which schedulers ``prepare`` certainly never saw

_TORCH_SCHEDULERS = frozenset({
    "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR",
    "SequentialLR", "CosineAnnealingLR", "ChainedScheduler", "CyclicLR", "CosineAnnealingWarmRestarts",
    "OneCycleLR", "PolynomialLR",
})
_SCHEDULE_FACTORY_MODULES = ("transformers", "diffusers")
_SCHEDULE_FACTORY = re.compile(r"get_(\w*_)?schedul")
_PREPARE_CALLS = frozenset({"prepare", "prepare_scheduler"})


class _ModuleFacts:
    """What one module does with its schedulers and its ``prepare`` calls, by name.

    Fed every node of the module (:meth:`read`), in any order: each fact is a set or an any-of.
    """

    def __init__(self) -> None:
        self.classes: set[str] = set()
        self.functions: set[str] = set()
        self.factories: set[str] = set()  # names imported as schedule factories or torch scheduler classes
        self.built: set[str] = set()  # names assigned a new scheduler
        self.assigned_otherwise: set[str] = set()  # names assigned something that is not certainly a new scheduler
        self.calls: list[cst.Call] = []
        self.prepared: set[str] = set()  # names handed to prepare()
        self.prepare_unclear = False  # a prepare() call with *args or **kwargs
        self.unpacked: list[tuple[str, str | None]] = []  # (name, helper function) of ``a, b = helper(...)``
        self._assignments: list[cst.Assign | cst.AnnAssign | cst.AugAssign] = []  # judged once the imports are read

    def read(self, nodes: Iterable[cst.CSTNode]) -> _ModuleFacts:
        """Note what each node says; the node types that say nothing are skipped on one dictionary lookup.

        Assignments are judged last, once every import has named the module's scheduler factories.
        """
        readers = _READERS
        for node in nodes:
            reader = readers.get(type(node))
            if reader is not None:
                reader(self, node)
        for node in self._assignments:
            self._read_assignment(node)
        self._assignments.clear()
        return self

    def _read_class(self, node: cst.ClassDef) -> None:
        self.classes.add(node.name.value)

    def _read_function(self, node: cst.FunctionDef) -> None:
        self.functions.add(node.name.value)

    def _read_import(self, node: cst.ImportFrom) -> None:
        module = _dotted(node.module) if node.module else ""
        if type(node.names) is cst.ImportStar:
            return
        for alias in node.names:
            name = terminal(alias.name)
            local = terminal(alias.asname.name) if alias.asname else name
            if module == "torch.optim.lr_scheduler" and name in _TORCH_SCHEDULERS:
                self.factories.add(local)
            elif module.split(".")[0] in _SCHEDULE_FACTORY_MODULES and name and _SCHEDULE_FACTORY.match(name):
                self.factories.add(local)

    def _read_call(self, node: cst.Call) -> None:
        self.calls.append(node)
        if terminal(node.func) in _PREPARE_CALLS:
            for arg in node.args:
                if arg.star:
                    self.prepare_unclear = True
                self.prepared |= _names_in(arg.value)

    def _defer_assignment(self, node: cst.Assign | cst.AnnAssign | cst.AugAssign) -> None:
        self._assignments.append(node)

    def _read_assignment(self, node: cst.Assign | cst.AnnAssign | cst.AugAssign) -> None:
        if type(node) is cst.Assign:
            for target in node.targets:
                self._assign(target.target, node.value)
        elif type(node) is cst.AnnAssign:
            if node.value is not None:
                self._assign(node.target, node.value)
        else:
            self._assign(node.target, None)

    def _assign(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        if type(target) in (cst.Tuple, cst.List):
            # ``opt, sched = setup(...)``: fine only from a helper of this module, whose body is read here too
            helper = value.func.value if type(value) is cst.Call and type(value.func) is cst.Name else None
            for element in target.elements:
                name = terminal(element.value)
                if name:
                    self.unpacked.append((name, helper))
            return
        name = terminal(target)
        if name is None:
            return
        if value is not None and self._builds_scheduler(value):
            self.built.add(name)
        elif value is not None and terminal(value) == name:
            pass  # self.lr_scheduler = lr_scheduler
        else:
            self.assigned_otherwise.add(name)

    def _builds_scheduler(self, value: cst.BaseExpression) -> bool:
        if type(value) is not cst.Call:
            return False
        func = value.func
        if type(func) is cst.Name:
            return func.value in self.factories
        if type(func) is cst.Attribute:
            return func.attr.value in _TORCH_SCHEDULERS and _dotted(func.value).endswith("lr_scheduler")
        return False


_READERS = {
    cst.ClassDef: _ModuleFacts._read_class,
    cst.FunctionDef: _ModuleFacts._read_function,
    cst.ImportFrom: _ModuleFacts._read_import,
    cst.Call: _ModuleFacts._read_call,
    cst.Assign: _ModuleFacts._defer_assignment,
    cst.AnnAssign: _ModuleFacts._defer_assignment,
    cst.AugAssign: _ModuleFacts._defer_assignment,
}


def _certainly_unprepared(index: ModuleIndex, scheduler: str, optimizer: str, accelerator: str) -> bool:
    """Whether ``scheduler`` is a plain scheduler built here that no ``prepare`` call can have wrapped,
    while ``optimizer`` is prepared (or handed to a helper together with ``accelerator``)."""
    facts = _facts(index)
    if facts.prepare_unclear or scheduler in facts.prepared or scheduler not in facts.built:
        return False
    if scheduler in facts.assigned_otherwise:
        return False
    if any(name == scheduler and helper not in facts.functions for name, helper in facts.unpacked):
        return False
    optimizer_prepared = optimizer in facts.prepared
    for call in facts.calls:
        names: set[str] = set()
        for arg in call.args:
            names |= _names_in(arg.value)
        if scheduler in names and not (type(call.func) is cst.Name and call.func.value in facts.classes):
            return False  # handed to a function that might prepare it
        if optimizer in names and accelerator in names:
            optimizer_prepared = True
    return optimizer_prepared


def _prepared_in(parsed: ParsedFile, function: cst.FunctionDef, name: str) -> bool:
    """Whether ``function`` hands an object of this last name to a ``prepare`` call (accelerate wraps it)."""
    return name in _ModuleFacts().read(parsed.every_node(function)).prepared


def _facts(index: ModuleIndex) -> _ModuleFacts:
    """The facts of the module ``index`` was built from, read from its parent map (which holds every node but the
    module); once per file: GL301 asks once per scheduler step."""
    return index.file.once(_facts, lambda: _ModuleFacts().read(index.parents))


def _names_in(node: cst.BaseExpression) -> set[str]:
    """The objects an argument hands over: ``x``, ``self.x`` (by last name), in tuples, lists, dicts, ``a if c else b``.

    ``x.get_last_lr()`` or ``f"{x}"`` use ``x`` without handing it over.
    """
    if type(node) in (cst.Name, cst.Attribute):
        return {terminal(node)}
    if type(node) in (cst.Tuple, cst.List, cst.Set):
        return set().union(*(_names_in(e.value) for e in node.elements))
    if type(node) is cst.Dict:
        return set().union(*(_names_in(e.value) for e in node.elements))
    if type(node) is cst.IfExp:
        return _names_in(node.body) | _names_in(node.orelse)
    if type(node) is cst.BooleanOperation:
        return _names_in(node.left) | _names_in(node.right)
    return set()


def _dotted(node: cst.BaseExpression) -> str:
    if type(node) is cst.Name:
        return node.value
    if type(node) is cst.Attribute:
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


FRAMEWORK = Framework(
    name="accelerate",
    builds=dict.fromkeys(_ACCELERATOR, ObjKind.PREPARER),
    named={"accelerator": ObjKind.PREPARER},
    returns_given=frozenset({"prepare"}),
    returns_given_alone=frozenset({"prepare", "prepare_model"}),
    backwards=(
        Backward(
            "accelerate", owners=frozenset({"accelerator"}), owner_kinds=frozenset({ObjKind.PREPARER}), divides_by_count=True,
            count=CountSetting(
                "accelerate",
                tokens=("gradient_accumulation_steps",),
                own_count=lambda divisor, owner: dotted_name(divisor) == f"{owner}.gradient_accumulation_steps",
                divides_again="`{call}` divides it again (`Accelerator(gradient_accumulation_steps=...)`)",
                read_elsewhere=_read_from_deepspeed_config,
                read_elsewhere_message=_read_elsewhere_message,
                held_back_only_in="accumulate",
                unheld_message=_unheld_message,
                entered_around_message=_entered_around_message,
            ),
        ),
    ),
    accumulate=(
        AccumulateContext(
            "accumulate", settings="accelerate", sync_flag="sync_gradients",
            prepared_in=_prepared_in, certainly_unprepared=_certainly_unprepared,
            clip_message=_clip_message, clear_message=_clear_message,
            early_clear_message=_early_clear_message, scheduler_message=_scheduler_message,
            plain_backward_message=_plain_backward_message,
            unscaling_clip=UnscalingClip(
                "accelerate", scaler_on=_fp16_accumulating, message=_unscaling_clip_message, tokens=("clip_grad", "fp16"),
            ),
        ),
    ),
    wraps=(
        Wrap(
            "accelerate", _wrap_message, prepare_methods=frozenset({"prepare", "prepare_model"}),
            owner_names=frozenset({"accelerator"}), quiet_when_built=_not_ddp_plugin, quiet_for_count=_count_from_deepspeed,
            reduces_nothing=_requires_deepspeed,
            around_forward=(
                "accelerate's `prepare` wrapped it in DistributedDataParallel (on several processes, with no FSDP, "
                f"DeepSpeed or Megatron-LM plugin): {AROUND_FORWARD}"
            ),
        ),
    ),
    accumulation_settings={
        "accelerate": AccumulationSetting(_ACCELERATOR, "gradient_accumulation_steps", ("gradient_accumulation_plugin",)),
    },
    clip_owner_kinds={ObjKind.PREPARER: "accelerate"},
)
