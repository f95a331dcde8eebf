"""Resolving names through a module's imports: ``optim.AdamW`` → ``torch.optim.AdamW``.

LibCST's ``QualifiedNameProvider`` does this with full scope analysis, at
many times the cost of parsing. The loop model only needs to know which
library a constructor or function comes from, so it reads the import
statements (wherever they are) and resolves the head of a dotted name through
them: the same answers for every import spelling, at a fraction of the cost.
"""

from __future__ import annotations

import libcst as cst

from gradlint.syntax import dotted_name


def _module_path(node: cst.BaseExpression | None) -> str:
    return dotted_name(node) or ""


class ImportMap:
    """Which qualified name each imported local name stands for."""

    def __init__(self) -> None:
        self._aliases: dict[str, str] = {}
        self._star_modules: list[str] = []

    def add(self, node: cst.Import | cst.ImportFrom) -> None:
        """Record the names an import statement binds."""
        if type(node) is cst.Import:
            for alias in node.names:
                full = _module_path(alias.name)
                if alias.asname is not None:
                    self._aliases[dotted_name(alias.asname.name) or full] = full
                else:  # ``import torch.optim`` binds ``torch``
                    head = full.split(".", 1)[0]
                    self._aliases.setdefault(head, head)
            return
        if node.relative:  # ``from .optim import X``: our own package, never a library we track
            return
        module = _module_path(node.module)
        if type(node.names) is cst.ImportStar:
            self._star_modules.append(module)
            return
        for alias in node.names:
            name = dotted_name(alias.name) or ""
            local = dotted_name(alias.asname.name) if alias.asname is not None else name
            self._aliases[local or name] = f"{module}.{name}"

    def imports(self, module: str) -> bool:
        """Whether the module imports ``module`` or anything from it."""
        return any(q == module or q.startswith(module + ".") for q in (*self._aliases.values(), *self._star_modules))

    def qualify(self, node: cst.BaseExpression) -> set[str]:
        """The qualified names a name or attribute chain may stand for; empty when it is not imported."""
        name = dotted_name(node)
        if name is None:
            return set()
        head, _, rest = name.partition(".")
        base = self._aliases.get(head)
        if base is not None:
            return {f"{base}.{rest}" if rest else base}
        if not rest and self._star_modules:
            return {f"{module}.{head}" for module in self._star_modules if head in _STAR_EXPORTS.get(module, (head,))}
        return set()


# What ``from M import *`` binds, for the library modules whose classes decide an object's kind: a name they do not
# export comes from another star import (``EarlyStopping`` beside ``from torch.optim import *`` is the project's own).
_STAR_EXPORTS: dict[str, frozenset[str]] = {
    "torch.optim": frozenset({  # torch.optim.__all__ (2.13), with the optimizers of earlier releases
        "ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "LBFGS", "Muon", "NAdam", "Optimizer",
        "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam", "lr_scheduler", "swa_utils",
    }),
    "torch.optim.lr_scheduler": frozenset({  # torch.optim.lr_scheduler.__all__ (2.13)
        "ChainedScheduler", "ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CyclicLR",
        "ExponentialLR", "LRScheduler", "LambdaLR", "LinearLR", "MultiStepLR", "MultiplicativeLR", "OneCycleLR",
        "PolynomialLR", "ReduceLROnPlateau", "SequentialLR", "StepLR",
    }),
}
