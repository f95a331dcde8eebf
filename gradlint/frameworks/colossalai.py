"""ColossalAI: ``GeminiOptimizer``, whose ``step()`` clears the gradients itself.

What it does to gradients. ``GeminiOptimizer.step()`` unscales (by the loss
scale and the clipping norm together), steps the wrapped optimizer and then
calls its own ``zero_grad()``; when the mixed-precision mixin finds an
overflow it skips the step and clears all the same. A loop that steps it
needs no clear of its own: nothing piles up from one step to the next.

Where it was read: ColossalAI, ``colossalai/zero/gemini/gemini_optimizer.py``
(``GeminiOptimizer.step``: ``self.zero_grad()  # reset all gradients`` on
the skipped path, ``ret = self.optim.step(div_scale=combined_scale)`` then
``self.zero_grad()`` on the other), exported as
``colossalai.zero.GeminiOptimizer``.
"""

from __future__ import annotations

from gradlint.frameworks.framework import Framework
from gradlint.kinds import ObjKind

_GEMINI = ("colossalai.zero.GeminiOptimizer", "colossalai.zero.gemini.GeminiOptimizer",
           "colossalai.zero.gemini.gemini_optimizer.GeminiOptimizer")

FRAMEWORK = Framework(
    name="ColossalAI",
    builds={name: ObjKind.OPTIMIZER for name in _GEMINI},
    clearing_steps=frozenset(_GEMINI),
)
