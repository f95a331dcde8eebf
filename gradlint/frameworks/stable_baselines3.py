"""Stable-Baselines3: its actor-critic policies build their optimizer in ``_build``, over ``self.parameters()``.

What it does to gradients. ``ActorCriticPolicy.__init__`` ends with
``self._build(lr_schedule)``, and ``_build`` builds the networks
(``mlp_extractor``, ``action_net``, ``value_net``, ``log_std``) and then
``self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1),
**self.optimizer_kwargs)``. PPO and A2C step ``policy.optimizer``. A subclass
that calls ``super()._build(lr_schedule)`` (or ``super().__init__(...)``)
and then assigns new layers to ``self`` leaves their parameters out of that
optimizer unless it builds the optimizer again, as many subclasses do.

Where it was read: ``stable_baselines3/common/policies.py``
(``ActorCriticPolicy.__init__``, ``_build``; ``ActorCriticCnnPolicy`` and
``MultiInputActorCriticPolicy`` derive from it and keep its ``_build``).
"""

from __future__ import annotations

from gradlint.frameworks.framework import Framework, OptimizerBuiltBySuper

_POLICIES = "stable_baselines3.common.policies."

FRAMEWORK = Framework(
    name="Stable-Baselines3",
    optimizer_built_by_super=(
        OptimizerBuiltBySuper(
            bases=frozenset({
                _POLICIES + "ActorCriticPolicy", _POLICIES + "ActorCriticCnnPolicy", _POLICIES + "MultiInputActorCriticPolicy",
            }),
            methods=frozenset({"__init__", "_build"}),
            optimizer="self.optimizer",
            rebuild="self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)",
            tokens=("ActorCriticPolicy",),
        ),
    ),
)
