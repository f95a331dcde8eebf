"""What a module shows about the frameworks around its training loop.

accelerate's ``Accelerator(gradient_accumulation_steps=N)``, Lightning's
``Trainer(accumulate_grad_batches=N)`` and a DeepSpeed config with
``"gradient_accumulation_steps": N`` each divide the loss by N inside the
framework. The rules about accumulation need to know which of these
settings a module makes, and which classes subclass ``LightningModule`` or
transformers' ``Trainer``, and where ``DistributedDataParallel`` wraps a
model. One walk of the module answers, skipped when the text names none of
the classes and functions that make such a setting.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from gradlint.imports import ImportMap
from gradlint.model import LoopModel
from gradlint.syntax import TRIVIA, ChildrenOf, children, dotted_name, keyword_arg, number

_ACCELERATOR = {"accelerate.Accelerator", "accelerate.accelerator.Accelerator"}
_LIGHTNING_TRAINER = {
    "lightning.Trainer",
    "lightning.pytorch.Trainer",
    "lightning.pytorch.trainer.Trainer",
    "lightning.pytorch.trainer.trainer.Trainer",
    "pytorch_lightning.Trainer",
    "pytorch_lightning.trainer.Trainer",
    "pytorch_lightning.trainer.trainer.Trainer",
}
_LIGHTNING_MODULE = {
    "lightning.LightningModule",
    "lightning.pytorch.LightningModule",
    "lightning.pytorch.core.LightningModule",
    "lightning.pytorch.core.module.LightningModule",
    "pytorch_lightning.LightningModule",
    "pytorch_lightning.core.LightningModule",
    "pytorch_lightning.core.module.LightningModule",
}
_HF_TRAINER = {
    "transformers.Trainer",
    "transformers.trainer.Trainer",
    "transformers.Seq2SeqTrainer",
    "transformers.trainer_seq2seq.Seq2SeqTrainer",
}
# trl's SFTTrainer derives from transformers.Trainer and trains language models (causal LMs, and
# image-text-to-text models in later versions); it leaves ``model_accepts_loss_kwargs`` as the Trainer sets it.
_TRL_SFT_TRAINER = {"trl.SFTTrainer", "trl.trainer.SFTTrainer", "trl.trainer.sft_trainer.SFTTrainer"}
_DEEPSPEED_INITIALIZE = {"deepspeed.initialize"}
_DDP = {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
# The last part of every name above: a module names one of them (in the call, the base class or its
# import) wherever a setting, subclass or wrap can be read.
_LAST_NAMES = ("Accelerator", "Trainer", "LightningModule", "initialize", "DistributedDataParallel", "fully_shard")


@dataclasses.dataclass
class FrameworkSettings:
    """The accumulation settings and framework subclasses one module shows."""

    # The value given as ``gradient_accumulation_steps=`` to each ``Accelerator(...)``.
    accelerator_counts: list[cst.BaseExpression] = dataclasses.field(default_factory=list)
    # Whether the module builds an ``Accelerator(...)``, and whether one of them may accumulate (a count that may
    # exceed 1, a ``gradient_accumulation_plugin``, ``**kwargs``); one that cannot syncs on every batch.
    accelerator_built: bool = False
    accelerators_without_count: int = 0  # ``Accelerator(...)`` calls given no ``gradient_accumulation_steps=``
    accelerator_may_accumulate: bool = False
    # The value given as ``accumulate_grad_batches=`` to each Lightning ``Trainer(...)``.
    lightning_counts: list[cst.BaseExpression] = dataclasses.field(default_factory=list)
    # The ``"gradient_accumulation_steps"`` of each DeepSpeed config the module passes to ``deepspeed.initialize``.
    deepspeed_counts: list[cst.BaseExpression] = dataclasses.field(default_factory=list)
    lightning_modules: list[cst.ClassDef] = dataclasses.field(default_factory=list)
    hf_trainers: list[cst.ClassDef] = dataclasses.field(default_factory=list)
    # The transformers Trainer subclasses above that derive from trl's ``SFTTrainer``.
    sft_trainers: list[cst.ClassDef] = dataclasses.field(default_factory=list)
    # Every ``DistributedDataParallel(...)`` construction.
    ddp_wraps: list[cst.Call] = dataclasses.field(default_factory=list)
    # Every FSDP2 ``fully_shard(...)`` call.
    fsdp2_shards: list[cst.Call] = dataclasses.field(default_factory=list)


def framework_settings(model: LoopModel) -> FrameworkSettings:
    """The framework settings of ``model``'s module (computed once per file)."""
    return model.file.once(framework_settings, lambda: _settings_of(model))


def _settings_of(model: LoopModel) -> FrameworkSettings:
    if model.text is not None and not any(name in model.text for name in _LAST_NAMES):
        return FrameworkSettings()  # nothing below can match: the walk is skipped
    return _read(model.module, model.file.children)


def counts_more_than_one(value: cst.BaseExpression) -> bool:
    """Whether an accumulation setting may be above 1: anything but a literal 0 or 1."""
    literal = number(value)
    return literal is None or literal > 1


def _read(module: cst.Module, children_of: ChildrenOf = children) -> FrameworkSettings:
    imports = ImportMap()
    calls: list[cst.Call] = []
    classes: list[cst.ClassDef] = []
    dicts: dict[str, list[cst.Dict]] = {}
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind in (cst.Import, cst.ImportFrom):
            imports.add(node)
            continue
        if kind is cst.Call:
            calls.append(node)
        elif kind is cst.ClassDef:
            classes.append(node)
        elif kind is cst.Assign and type(node.value) is cst.Dict:
            for target in node.targets:
                name = dotted_name(target.target)
                if name:
                    dicts.setdefault(name, []).append(node.value)
        if kind not in TRIVIA:
            stack.extend(children_of(node))
    settings = FrameworkSettings()
    for call in calls:
        names = imports.qualify(call.func)
        if names & _ACCELERATOR:
            settings.accelerator_built = True
            arg = keyword_arg(call, "gradient_accumulation_steps")
            if arg is not None:
                settings.accelerator_counts.append(arg.value)
            else:
                settings.accelerators_without_count += 1
            if (
                (arg is not None and counts_more_than_one(arg.value))
                or keyword_arg(call, "gradient_accumulation_plugin") is not None
                or any(a.star for a in call.args)
            ):
                settings.accelerator_may_accumulate = True
        elif names & _LIGHTNING_TRAINER:
            arg = keyword_arg(call, "accumulate_grad_batches")
            if arg is not None:
                settings.lightning_counts.append(arg.value)
        elif names & _DDP:
            settings.ddp_wraps.append(call)
        elif any(n.startswith("torch.distributed.") and n.endswith(".fully_shard") for n in names):
            settings.fsdp2_shards.append(call)
        elif names & _DEEPSPEED_INITIALIZE:
            for keyword in ("config", "config_params"):
                arg = keyword_arg(call, keyword)
                if arg is not None:
                    settings.deepspeed_counts.extend(_config_counts(arg.value, dicts))
    local = {c.name.value: c for c in classes}
    for cls in classes:
        if _subclasses(cls, _LIGHTNING_MODULE, imports, local, set()):
            settings.lightning_modules.append(cls)
        if _subclasses(cls, _HF_TRAINER | _TRL_SFT_TRAINER, imports, local, set()):
            settings.hf_trainers.append(cls)
        if _subclasses(cls, _TRL_SFT_TRAINER, imports, local, set()):
            settings.sft_trainers.append(cls)
    return settings


def _config_counts(value: cst.BaseExpression, dicts: dict[str, list[cst.Dict]]) -> list[cst.BaseExpression]:
    """``"gradient_accumulation_steps"`` of a config dict written inline or assigned to a name of the module."""
    name = dotted_name(value)
    candidates = [value] if type(value) is cst.Dict else dicts.get(name, []) if name else []
    found = []
    for config in candidates:
        for element in config.elements:
            if type(element) is cst.DictElement and type(element.key) is cst.SimpleString:
                if element.key.evaluated_value == "gradient_accumulation_steps":
                    found.append(element.value)
    return found


def _subclasses(cls: cst.ClassDef, bases: set[str], imports: ImportMap, local: dict[str, cst.ClassDef], seen: set[str]) -> bool:
    """Whether ``cls`` derives from one of ``bases``, directly or through classes of the same module."""
    if cls.name.value in seen:
        return False
    seen.add(cls.name.value)
    for arg in cls.bases:
        if imports.qualify(arg.value) & bases:
            return True
        name = dotted_name(arg.value)
        parent = local.get(name) if name else None
        if parent is not None and _subclasses(parent, bases, imports, local, seen):
            return True
    return False
