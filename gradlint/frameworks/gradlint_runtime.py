"""gradlint's own runtime: ``GradientRelease``, gradient release for any ``torch.optim`` optimizer.

What it does to gradients. ``GradientRelease(optimizer)`` (or
``enable_gradient_release(optimizer)``) registers a
``register_post_accumulate_grad_hook`` hook on every parameter of the
optimizer's groups. The first backward steps each parameter alone as its
gradient completes; from then on parameters are stepped in buckets, each
once its last gradient is in, through the optimizer's fused kernel where it
has one, and every gradient is freed right after its step. The optimizer's
own ``step()`` and ``zero_grad()`` become no-ops that mark the end of a loop
iteration: nothing accumulates across backwards and no whole-model gradient
exists to clip or unscale. It raises ``ReleaseUnsupported`` at run time when
a ``GradScaler``, a clip or a second backward before ``step()`` meets it.
This is what GL204's fix writes.

Where it was read: this project's ``runtime/release.py`` (``GradientRelease.__init__``,
``_on_gradient``, ``_step``, ``_released_step``, ``_install_guards``).
"""

from __future__ import annotations

from gradlint.frameworks.framework import Framework, ReleaseCall, ReleaseStyle


def _describe(callee: str | None, line: int) -> str:
    return f"gradlint's gradient release (`{callee}`) at line {line}"


FRAMEWORK = Framework(
    name="gradlint runtime",
    release_calls=(
        ReleaseCall(frozenset({"GradientRelease", "enable_gradient_release"}), "gradlint", optimizer=((0, "optimizer"),)),
    ),
    release_styles=(ReleaseStyle("gradlint", _describe, names_its_optimizer=True),),
    release_tokens=("GradientRelease",),
)
