"""Modules written for another autodiff library: no torch training loop is in them.

Warp, JAX, TensorFlow, Paddle, MindSpore and MXNet have a ``backward``, a
``step`` or a ``zero_`` of their own, with other meanings (Warp's
``Tape.backward`` and ``Adam.step(grads)``, which applies the gradients it is
handed; Paddle's ``clear_grad``; Gluon's ``trainer.step(batch_size)``). A
module that imports one of them, does not import torch and reads no attribute
of it (``torch.nn``) is read as theirs, and no rule looks at it. Libraries that
copy torch's semantics call by call (OneFlow, Jittor) are not among them: what
the rules say holds there too.
"""

from __future__ import annotations

import re

_LIBRARIES = ("warp", "jax", "tensorflow", "paddle", "mindspore", "mxnet")
_USES_TORCH = re.compile(r"^[ \t]*(?:import|from)[ \t]+torch\b|\btorch\.[A-Za-z_]", re.MULTILINE)
_IMPORTS_ANOTHER = re.compile(rf"^[ \t]*(?:import|from)[ \t]+(?:{'|'.join(_LIBRARIES)})\b", re.MULTILINE)


def written_for_another_library(text: str) -> bool:
    """Whether ``text`` imports another autodiff library and neither imports torch nor reads an attribute of it."""
    # Asked of every file the prefilter reads: a plain substring test first spares the regex almost all of them.
    if not any(library in text for library in _LIBRARIES):
        return False
    return _IMPORTS_ANOTHER.search(text) is not None and _USES_TORCH.search(text) is None
