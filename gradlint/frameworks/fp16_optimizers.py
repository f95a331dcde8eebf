"""fp16 optimizers with a ``backward(loss)`` of their own: fairseq's, Megatron-LM's and apex's ``FP16_Optimizer``.

What they do to gradients. ``optimizer.backward(loss)`` backpropagates the
loss it is handed, multiplied by the optimizer's loss scale at most (the
scale is undone on the master gradients before the step): it divides by
nothing, so a loss accumulated over micro-batches must be divided on its
way there, and one divided stays divided. fairseq's
``optimizer.multiply_grads(1 / n)`` divides every gradient at once: the
event builder reads any call whose name says it handles gradients and
that is handed a division (``multiply_grads``, ``scale_grads_``) that way,
whoever defines it.

Where it was read: fairseq v0.12.3, ``fairseq/optim/fairseq_optimizer.py``
(``FairseqOptimizer.backward``: ``loss.backward()``; ``multiply_grads``),
``fairseq/optim/fp16_optimizer.py`` (``_FP16OptimizerMixin.backward``:
``loss = self.scaler.scale(loss)`` then ``loss.backward()``); Megatron-LM
v1.0, ``megatron/fp16/fp16.py`` (``FP16_Optimizer.backward``: "scaled_loss
= fp32_loss*loss_scale"); apex 23.10, ``apex/fp16_utils/fp16_optimizer.py``
(``FP16_Optimizer.backward``: ``scaled_loss = loss.float()*self.loss_scaler.loss_scale()``).
Megatron-LM's current optimizers (``megatron/core/optimizer``) have
``scale_loss`` instead, and no ``backward``.
"""

from __future__ import annotations

from gradlint.frameworks.framework import Backward, Framework
from gradlint.kinds import ObjKind

FRAMEWORK = Framework(
    name="fp16 optimizers (fairseq, Megatron-LM, apex)",
    # Nobody's bookkeeping: the loss goes through as it is, scaled by a loss scale at most.
    backwards=(Backward(None, owner_kinds=frozenset({ObjKind.OPTIMIZER})),),
)
