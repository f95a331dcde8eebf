"""Which names in a training script hold an optimizer, a grad scaler, a scheduler or a model.

An object is known by where it came from (the qualified name of the
constructor it was built with, resolved through the module's imports) and,
failing that, by what it is called: ``optimizer_d``, ``self.scaler`` and
``lr_scheduler`` mean what they say in practically every training script.
"""

from __future__ import annotations

import dataclasses
import enum
import re


class ObjKind(str, enum.Enum):
    """The kinds of object the loop model tracks."""

    OPTIMIZER = "optimizer"
    SCALER = "scaler"
    SCHEDULER = "scheduler"
    MODEL = "model"
    DDP_MODEL = "ddp_model"
    ACCELERATOR = "accelerator"
    ENGINE = "engine"  # what ``deepspeed.initialize`` returns first: its backward scales and syncs for accumulation
    TENSOR = "tensor"  # one named tensor whose .grad the code handles by hand (``delta.grad``)
    UNKNOWN = "unknown"


@dataclasses.dataclass(frozen=True)
class ObjInfo:
    """What the model knows about one name: its kind and, for optimizers, whose parameters it holds."""

    kind: ObjKind
    # For an optimizer: the models whose ``.parameters()`` it was built from
    # (last attribute name only: ``self.netD`` and ``netD`` are the same model).
    param_sources: frozenset[str] = frozenset()
    # For a DDP model: the module it wraps.
    wraps: str | None = None


# Qualified-name prefixes of modules whose capitalised callables build optimizers.
_OPTIMIZER_MODULES = (
    "torch.optim.",
    "optimi.",
    "bitsandbytes.optim.",
    "apex.optimizers.",
    "apex.contrib.optimizers.",
    "timm.optim.",
    "torch_optimizer.",
    "deepspeed.ops.adam.",
    "deepspeed.ops.lamb.",
    "lion_pytorch.",
    "schedulefree.",
    "heavyball.",
    "transformers.optimization.",
    "torch.distributed.optim.",
)
_OPTIMIZER_EXACT = {
    "transformers.AdamW",
    "transformers.Adafactor",
    "timm.optim.create_optimizer",
    "timm.optim.create_optimizer_v2",
    "timm.optim.optim_factory.create_optimizer_v2",
}
_NOT_OPTIMIZERS = {"Optimizer", "lr_scheduler", "swa_utils"}

_SCALER_QUALIFIED = {
    "torch.cuda.amp.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler",
    "torch.amp.GradScaler",
    "torch.amp.grad_scaler.GradScaler",
    "torch.GradScaler",
    "torch.cpu.amp.GradScaler",
    "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler",
}

_SCHEDULER_PREFIXES = ("torch.optim.lr_scheduler.", "timm.scheduler.")
_SCHEDULER_FACTORY = re.compile(r"^(transformers|transformers\.optimization|diffusers\.optimization)\.get_\w*schedule\w*$")

_DDP_QUALIFIED = {
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
}


def kind_of_constructor(qualified_name: str) -> ObjKind | None:
    """The kind of object a call to ``qualified_name`` builds, or None if it builds nothing we track."""
    if qualified_name in _SCALER_QUALIFIED:
        return ObjKind.SCALER
    if qualified_name in _DDP_QUALIFIED:
        return ObjKind.DDP_MODEL
    if qualified_name.startswith(_SCHEDULER_PREFIXES) or _SCHEDULER_FACTORY.match(qualified_name):
        last = qualified_name.rsplit(".", 1)[-1]
        return ObjKind.SCHEDULER if last[:1].isupper() or last.startswith("get_") else None
    if qualified_name in _OPTIMIZER_EXACT:
        return ObjKind.OPTIMIZER
    if qualified_name.startswith(_OPTIMIZER_MODULES):
        parts = qualified_name.split(".")
        last = parts[-1]
        if any(p in _NOT_OPTIMIZERS for p in parts) or not last[:1].isupper():
            return None
        if "Scheduler" in last or last.endswith("LR"):
            return ObjKind.SCHEDULER
        return ObjKind.OPTIMIZER
    if qualified_name in ("accelerate.Accelerator", "accelerate.accelerator.Accelerator"):
        return ObjKind.ACCELERATOR
    return None


_OPTIMIZER_NAME = re.compile(
    r"^(optimi[sz]ers?\w*|optim|opt|opt(im)?_?[a-z0-9]|opt(im)?_[a-z0-9_]+|\w+_(opt|optim|optimi[sz]er))$"
)
_SCHEDULER_NAME = re.compile(r"(^|_)(lr_)?sched(uler)?s?($|_)|^scheduler\w*|\w*_scheduler$")
_ACCELERATOR_NAME = re.compile(r"^(accelerator|fabric)$")


def kind_from_name(dotted: str) -> ObjKind:
    """Guess an object's kind from its spelling alone (``self.opt_g`` → optimizer)."""
    last = dotted.rsplit(".", 1)[-1].lower()
    if "scaler" in last:
        return ObjKind.SCALER
    if _SCHEDULER_NAME.search(last):
        return ObjKind.SCHEDULER
    if _OPTIMIZER_NAME.match(last) and last not in ("opts", "options", "optional"):
        return ObjKind.OPTIMIZER
    if _ACCELERATOR_NAME.match(last):
        return ObjKind.ACCELERATOR
    return ObjKind.UNKNOWN


def last_name(dotted: str) -> str:
    """``self.model.netD`` → ``netD``: how models are compared across spellings."""
    return dotted.rsplit(".", 1)[-1]
