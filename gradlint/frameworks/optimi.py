"""torch-optimi: gradient release and optimizer accumulation.

What it does to gradients. An optimi optimizer built with
``gradient_release=True`` and handed to
``prepare_for_gradient_release(model, optimizer)`` steps each parameter
from a ``register_post_accumulate_grad_hook`` hook as soon as its gradient
is complete, and frees the gradient: nothing accumulates across backwards
and no whole-model gradient exists to clip or unscale. Setting
``optimizer.optimizer_accumulation = True`` for the micro-batches that do
not step makes the hooks accumulate into the optimizer's state instead of
updating (``update_parameters=not optimizer_accumulation``). Its
optimizers live under ``optimi`` (``StableAdamW`` clips its updates, not
the gradients).

Where it was read: torch-optimi 0.3.3 (installed with this project's
runtime extra), ``optimi/gradientrelease.py``
(``prepare_for_gradient_release(model, optimizer, ignore_existing_hooks=False)``
registers the hooks), ``optimi/optimizer.py`` (``OptimiOptimizer``,
``gradient_release``, ``optimizer_accumulation``), ``optimi/adamw.py``
(``optimizer_accumulation``: "Accumulate gradients into state during
gradient release step"), ``optimi/stableadamw.py``. Versions: read at
0.3.3; earlier releases were not read.
"""

from __future__ import annotations

from gradlint.frameworks.framework import Framework, ReleaseCall, ReleaseStyle


def _describe(callee: str | None, line: int) -> str:
    return f"optimi's gradient release (`{callee}`) at line {line}"


FRAMEWORK = Framework(
    name="torch-optimi",
    optimizer_modules=("optimi.",),
    release_calls=(ReleaseCall(frozenset({"prepare_for_gradient_release"}), "optimi", optimizer=((1, "optimizer"),), model=(0, "model")),),
    release_keyword=("gradient_release", "optimi"),
    release_styles=(ReleaseStyle("optimi", _describe, names_its_optimizer=True),),
    release_tokens=("gradient_release",),
    release_accumulation_fix="use optimi's optimizer accumulation (`optimizer_accumulation`)",
    release_accumulates_into="optimizer_accumulation",
    release_clipping_fix="use an optimizer with update clipping such as StableAdamW",
)
