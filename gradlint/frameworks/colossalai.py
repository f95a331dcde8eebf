"""ColossalAI: ``GeminiOptimizer`` (once ``ZeroOptimizer``), whose ``step()`` clears the gradients itself.

What it does to gradients. ``GeminiOptimizer.step()`` unscales (by the loss
scale and the clipping norm together), steps the wrapped optimizer and then
calls its own ``zero_grad()``; when the mixed-precision mixin finds an
overflow it skips the step and clears all the same. A loop that steps it
needs no clear of its own: nothing piles up from one step to the next.

Its older name, ``ZeroOptimizer`` (``colossalai.zero`` and
``colossalai.nn.optimizer`` before 0.3), clears as well, one way or the
other: it must be used with ``ZeroDDP``, whose ``forward`` begins with
``self.module.zero_grad(set_to_none=True)`` and whose gradient hook copies
each gradient into its chunk rather than adding to it; and from 0.1.10 its
``step`` ends with ``self.zero_grad()`` as ``GeminiOptimizer``'s does. A loop
that steps it applies no gradient twice.

Where it was read: ColossalAI, ``colossalai/zero/gemini/gemini_optimizer.py``
(``GeminiOptimizer.step``: ``self.zero_grad()  # reset all gradients`` on
the skipped path, ``ret = self.optim.step(div_scale=combined_scale)`` then
``self.zero_grad()`` on the other), exported as
``colossalai.zero.GeminiOptimizer``; ``colossalai/nn/parallel/data_parallel.py``
(``ZeroDDP.forward``, ``ZeroDDP.grad_handle``: ``chunk.copy_tensor_to_chunk_slice(p,
grad)``) and ``colossalai/nn/optimizer/zero_optimizer.py`` (``ZeroOptimizer``:
"You must use ``ZeroDDP`` with ``ZeroOptimizer``").
"""

from __future__ import annotations

from gradlint.frameworks.framework import Framework
from gradlint.kinds import ObjKind

_GEMINI = ("colossalai.zero.GeminiOptimizer", "colossalai.zero.gemini.GeminiOptimizer",
           "colossalai.zero.gemini.gemini_optimizer.GeminiOptimizer",
           # the same optimizer by its name before 0.3
           "colossalai.zero.ZeroOptimizer", "colossalai.zero.zero_optimizer.ZeroOptimizer",
           "colossalai.nn.optimizer.ZeroOptimizer", "colossalai.nn.optimizer.zero_optimizer.ZeroOptimizer")

FRAMEWORK = Framework(
    name="ColossalAI",
    builds={name: ObjKind.OPTIMIZER for name in _GEMINI},
    clearing_steps=frozenset(_GEMINI),
)
