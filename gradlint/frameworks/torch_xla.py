"""PyTorch/XLA: ``xm.optimizer_step(optimizer)``.

What it does to gradients. ``torch_xla.core.xla_model.optimizer_step(optimizer)``
all-reduces the gradients over the replicas and then calls
``optimizer.step()``: it is a step of the optimizer it is handed first.

Where it was read: pytorch/xla ``torch_xla/core/xla_model.py``,
``optimizer_step`` (the stored copy of the repository:
``reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)`` then
``loss = optimizer.step(**optimizer_args)``; the first releases summed the
gradients with ``_xla_cross_replica_sum(state.gradients, 1.0 / count, [])``
before ``optimizer.step()``): a step in both.
"""

from __future__ import annotations

from gradlint.frameworks.framework import Framework

FRAMEWORK = Framework(name="PyTorch/XLA", step_functions={"optimizer_step": "torch_xla"})
