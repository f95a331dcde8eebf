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

sb3-contrib, read in ``sb3_contrib/common/maskable/policies.py`` and
``sb3_contrib/common/recurrent/policies.py``: ``MaskableActorCriticPolicy``
(and its Cnn and MultiInput subclasses) does the same as
``ActorCriticPolicy``, its ``__init__`` ending with ``self._build(lr_schedule)``.
``RecurrentActorCriticPolicy`` derives from ``ActorCriticPolicy``, adds its
LSTMs after ``super().__init__(...)`` and then builds the optimizer again over
``self.parameters()`` at the end of its own ``__init__``: layers a subclass's
``_build`` adds are in that optimizer, only those added after
``super().__init__(...)`` are not.
"""

from __future__ import annotations

from gradlint.frameworks.framework import Framework, OptimizerBuiltBySuper

_POLICIES = "stable_baselines3.common.policies."
_MASKABLE = "sb3_contrib.common.maskable.policies."
_RECURRENT = "sb3_contrib.common.recurrent.policies."
_REBUILD = "self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)"

FRAMEWORK = Framework(
    name="Stable-Baselines3",
    optimizer_built_by_super=(
        OptimizerBuiltBySuper(
            bases=frozenset({
                _POLICIES + "ActorCriticPolicy", _POLICIES + "ActorCriticCnnPolicy", _POLICIES + "MultiInputActorCriticPolicy",
                _MASKABLE + "MaskableActorCriticPolicy", _MASKABLE + "MaskableActorCriticCnnPolicy",
                _MASKABLE + "MaskableMultiInputActorCriticPolicy",
            }),
            methods=frozenset({"__init__", "_build"}),
            optimizer="self.optimizer",
            rebuild=_REBUILD,
            tokens=("ActorCritic",),
        ),
        OptimizerBuiltBySuper(  # its ``__init__`` builds the optimizer again after ``_build``: only ``__init__`` counts
            bases=frozenset({
                _RECURRENT + "RecurrentActorCriticPolicy", _RECURRENT + "RecurrentActorCriticCnnPolicy",
                _RECURRENT + "RecurrentMultiInputActorCriticPolicy",
            }),
            methods=frozenset({"__init__"}),
            optimizer="self.optimizer",
            rebuild=_REBUILD,
            tokens=("ActorCritic",),
        ),
    ),
)
