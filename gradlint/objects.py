"""Which names in a training script hold an optimizer, a grad scaler, a scheduler or a model.

An object is known by where it came from (the qualified name of the
constructor it was built with, resolved through the module's imports) and,
failing that, by what it is called: ``optimizer_d``, ``self.scaler`` and
``lr_scheduler`` mean what they say in practically every training script.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from gradlint.kinds import ObjKind

__all__ = ["ObjInfo", "ObjKind", "kind_from_name", "kind_of_constructor", "last_name"]


@dataclasses.dataclass(frozen=True)
class ObjInfo:
    """What the model knows about one name: its kind and, for optimizers, whose parameters it holds."""

    kind: ObjKind
    # For an optimizer: the models whose ``.parameters()`` it was built from
    # (last attribute name only: ``self.netD`` and ``netD`` are the same model).
    param_sources: frozenset[str] = frozenset()
    # For a data-parallel model: the module it wraps, and the wrap that built it (a key of the frameworks' wraps).
    wraps: str | None = None
    wrapped_by: str | None = None


# Qualified-name prefixes of modules whose capitalised callables build optimizers (the frameworks add theirs).
_OPTIMIZER_MODULES = (
    "torch.optim.",
    "bitsandbytes.optim.",
    "timm.optim.",
    "torch_optimizer.",
    "lion_pytorch.",
    "schedulefree.",
    "heavyball.",
    "torch.distributed.optim.",
)
_NOT_OPTIMIZERS = {"Optimizer", "lr_scheduler", "swa_utils"}

# Constructors known by their exact qualified name: torch's scalers, timm's optimizer factories (the frameworks add theirs).
_EXACT: dict[str, ObjKind] = {
    **dict.fromkeys(
        (
            "torch.cuda.amp.GradScaler",
            "torch.cuda.amp.grad_scaler.GradScaler",
            "torch.amp.GradScaler",
            "torch.amp.grad_scaler.GradScaler",
            "torch.GradScaler",
            "torch.cpu.amp.GradScaler",
        ),
        ObjKind.SCALER,
    ),
    **dict.fromkeys(
        ("timm.optim.create_optimizer", "timm.optim.create_optimizer_v2", "timm.optim.optim_factory.create_optimizer_v2"),
        ObjKind.OPTIMIZER,
    ),
}

_SCHEDULER_PREFIXES = ("torch.optim.lr_scheduler.", "timm.scheduler.")


@dataclasses.dataclass(frozen=True)
class _Constructors:
    """The tables above with what the framework modules add, joined on first use.

    :mod:`gradlint.frameworks` loads LibCST (its declarations judge LibCST
    nodes); the prefilter and the project index ask this module about names
    before any file is parsed, and the command line's start-up stays free of
    LibCST by importing the frameworks only then.
    """

    optimizer_modules: tuple[str, ...]
    exact: dict[str, ObjKind]
    scheduler_factory: re.Pattern[str]  # ``get_*schedule*`` functions of these modules build schedulers
    named: dict[str, ObjKind]  # a framework's object known by its name alone (``accelerator``)


@functools.cache
def _constructors() -> _Constructors:
    from gradlint import frameworks

    factory_modules = (*frameworks.SCHEDULE_FACTORY_MODULES, "diffusers.optimization")
    return _Constructors(
        optimizer_modules=(*_OPTIMIZER_MODULES, *frameworks.OPTIMIZER_MODULES),
        exact={**_EXACT, **frameworks.BUILDS},
        scheduler_factory=re.compile(rf"^({'|'.join(map(re.escape, factory_modules))})\.get_\w*schedule\w*$"),
        named=dict(frameworks.NAMED),
    )


def kind_of_constructor(qualified_name: str) -> ObjKind | None:
    """The kind of object a call to ``qualified_name`` builds, or None if it builds nothing we track."""
    tables = _constructors()
    exact = tables.exact.get(qualified_name)
    if exact is not None:
        return exact
    if qualified_name.startswith(_SCHEDULER_PREFIXES) or tables.scheduler_factory.match(qualified_name):
        last = qualified_name.rsplit(".", 1)[-1]
        return ObjKind.SCHEDULER if last[:1].isupper() or last.startswith("get_") else None
    if qualified_name.startswith(tables.optimizer_modules):
        parts = qualified_name.split(".")
        last = parts[-1]
        if any(p in _NOT_OPTIMIZERS for p in parts) or not last[:1].isupper():
            return None
        if "Scheduler" in last or last.endswith("LR"):
            return ObjKind.SCHEDULER
        return ObjKind.OPTIMIZER
    return None


_OPTIMIZER_NAME = re.compile(
    r"^(optimi[sz]ers?\w*|optim|opt|opt(im)?_?[a-z0-9]|opt(im)?_[a-z0-9_]+|\w+_(opt|optim|optimi[sz]er)(_[a-z0-9]|[0-9])?)$"
)
# What an optimizer is given or keeps, not the optimizer: ``opt_params``, ``optimizer_state``, ``optim_kwargs``
_OPTIMIZER_PART = re.compile(
    r"_(params|parameters|param_groups|state|states|state_dict|config|cfg|args|kwargs|lr)$"
)
_SCHEDULER_NAME = re.compile(r"(^|_)(lr_)?sched(uler)?s?($|_)|^scheduler\w*|\w*_scheduler$")


def kind_from_name(dotted: str) -> ObjKind:
    """Guess an object's kind from its spelling alone (``self.opt_g`` → optimizer)."""
    last = dotted.rsplit(".", 1)[-1].lower().lstrip("_")  # a private ``self._optimizer`` too
    if "scaler" in last:
        return ObjKind.SCALER
    if _SCHEDULER_NAME.search(last):
        return ObjKind.SCHEDULER
    if _OPTIMIZER_NAME.match(last) and last not in ("opts", "options", "optional") and not _OPTIMIZER_PART.search(last):
        return ObjKind.OPTIMIZER
    return _constructors().named.get(last, ObjKind.UNKNOWN)  # ``accelerator``: a framework's object


def last_name(dotted: str) -> str:
    """``self.model.netD`` → ``netD``: how models are compared across spellings."""
    return dotted.rsplit(".", 1)[-1]
