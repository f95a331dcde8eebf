"""Opacus (0.x): ``optimizer.virtual_step()``, the virtual batches of differentially private training.

What it does to gradients. Called after each mini-batch's backward in place
of ``step()``, ``virtual_step()`` clips the per-sample gradients and adds
them to a running sum; the next ``step()`` divides the sum by the number of
samples of every mini-batch since the last step (the whole virtual batch)
before it steps. The loss of the mini-batches needs no division by their
number: the optimizer averages the accumulated gradients itself.

Where it was read: opacus v0.15.0, ``opacus/privacy_engine.py``
(``PrivacyEngine.virtual_step``, attached to the optimizer as
``optimizer.virtual_step``), ``opacus/per_sample_gradient_clip.py``
(``PerSampleGradientClipper``: ``_aggr_batch_size`` grows with each
mini-batch, ``_scale_summed_grad(p.summed_grad, batch_size)``). Opacus 1.0
removed ``virtual_step`` (its ``BatchMemoryManager`` accumulates instead).
"""

from __future__ import annotations

from gradlint.frameworks.framework import Framework

FRAMEWORK = Framework(name="Opacus", averaging_steps=frozenset({"virtual_step"}))
