"""torchtune: optimizer-in-backward.

What it does to gradients. ``register_optim_in_bwd_hooks(model, optim_dict)``
registers on every trainable parameter a ``register_post_accumulate_grad_hook``
hook that steps that parameter's own optimizer (``optim_dict[param]``) and
clears its gradient as soon as the gradient is complete:
nothing accumulates across backwards and no whole-model gradient exists to
clip or unscale. ``create_optim_in_bwd_wrapper(model, optim_dict)`` and
``OptimizerInBackwardWrapper`` register nothing themselves: they wrap the
optimizers of a model whose optimizer runs in backward, for checkpoints and
schedulers (the class's docstring: "for optimizers running in backward"),
and torchtune's recipes build the wrapper right after
``register_optim_in_bwd_hooks`` on the same ``optim_dict``: either call is
taken as the set-up. ``OptimizerInBackward(params, optimizer_cls,
**kwargs)``, an ``Optimizer`` of its own, builds one optimizer per parameter
and steps it in backward the same way (its ``__init__`` registers
``lambda param=p: self._step_and_clear(param)``; its ``step()`` does
nothing).

The recipes set it up far from the loop: ``_setup_optimizer(cfg_optimizer,
optimizer_in_bwd)`` registers the hooks and returns no optimizer, ``train``
runs the loop and steps only ``if not self._optimizer_in_bwd``; their
``__init__`` raises ``RuntimeError`` when ``optimizer_in_bwd`` meets
``clip_grad_norm`` or ``gradient_accumulation_steps > 1``. A project that
moves the set-up into a helper of another module is read through the
project index (:mod:`gradlint.scaler_release_facts`), not through these
names.

Where it was read: torchtune v0.6.1, ``torchtune/training/memory.py``
(``OptimizerInBackwardWrapper``, ``create_optim_in_bwd_wrapper``: returns
``OptimizerInBackwardWrapper({n: optim_dict[p] for n, p in
model.named_parameters()})``; ``register_optim_in_bwd_hooks``:
``optim_dict[param].step()`` then ``optim_dict[param].zero_grad()`` in a
``register_post_accumulate_grad_hook`` hook on every parameter that requires
grad); ``recipes/full_finetune_single_device.py`` and
``recipes/full_finetune_distributed.py`` (``_setup_optimizer``, the
``RuntimeError`` checks in ``__init__``); ``OptimizerInBackward`` in
``torchtune/modules/optim.py`` on torchtune's main branch after v0.6.1 (not
in v0.6.1).
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
