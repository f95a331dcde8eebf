"""torchtune: optimizer-in-backward.

What it does to gradients. ``register_optim_in_bwd_hooks(model, optim_dict)``
registers on every trainable parameter a ``register_post_accumulate_grad_hook``
hook that steps that parameter's own optimizer (``optim_dict[param]``) and
clears its gradient as soon as the gradient is complete:
nothing accumulates across backwards and no whole-model gradient exists to
clip or unscale. ``create_optim_in_bwd_wrapper(model, optim_dict)`` and
``OptimizerInBackwardWrapper`` wrap those optimizers for checkpoints and
schedulers; ``OptimizerInBackward(params, optimizer_cls, **kwargs)``, an
``Optimizer`` of its own, builds one optimizer per parameter and steps it in
backward the same way.

Where it was read: torchtune v0.6.1, ``torchtune/training/memory.py``
(``OptimizerInBackwardWrapper``, ``create_optim_in_bwd_wrapper``,
``register_optim_in_bwd_hooks``: ``optim_dict[param].step()`` then
``optim_dict[param].zero_grad()``); ``OptimizerInBackward`` in
``torchtune/modules/optim.py`` on torchtune's main branch after v0.6.1.
"""

from __future__ import annotations

from gradlint.frameworks.framework import Framework, ReleaseCall, ReleaseStyle


def _describe(callee: str | None, line: int) -> str:
    return f"optimizer-in-backward (`{callee}`) at line {line}"


FRAMEWORK = Framework(
    name="torchtune",
    release_calls=(
        ReleaseCall(
            frozenset({"register_optim_in_bwd_hooks", "create_optim_in_bwd_wrapper", "OptimizerInBackwardWrapper"}),
            "torchtune", optimizer=((1, "optim_dict"), (1, "optim_map")), model=(0, "model"),
        ),
        ReleaseCall(frozenset({"OptimizerInBackward"}), "torchtune", optimizer="assigned", model="parameters"),
    ),
    release_styles=(ReleaseStyle("torchtune", _describe),),
    release_tokens=("in_bwd", "InBackward"),
)
