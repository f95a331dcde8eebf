"""higher: differentiable optimizers for meta-learning, which take gradients themselves and never read ``.grad``.

What it does to gradients. ``with higher.innerloop_ctx(model, opt) as (fmodel,
diffopt):`` hands back a patched copy of the model and a
``DifferentiableOptimizer`` built from ``opt``'s settings and state. Its
``step(loss)`` computes the gradients with ``torch.autograd.grad(loss,
params, create_graph=...)`` and returns the updated fast weights: it reads no
``.grad`` and writes none, so nothing piles up between its steps and there is
nothing to clear. ``higher.optim.get_diff_optim(opt, params, fmodel)`` builds
the same object. It is no optimizer in the sense the rules mean.

Where it was read: ``higher/optim.py`` (``DifferentiableOptimizer.step``,
``get_diff_optim``) and ``higher/__init__.py`` (``innerloop_ctx`` yields
``(fmodel, diffopt)``).
"""

from __future__ import annotations

from gradlint.frameworks.framework import Framework
from gradlint.kinds import ObjKind

FRAMEWORK = Framework(
    name="higher",
    builds={"higher.optim.get_diff_optim": ObjKind.OTHER, "higher.get_diff_optim": ObjKind.OTHER},
    returns_by_position={"higher.innerloop_ctx": {1: ObjKind.OTHER}},
)
