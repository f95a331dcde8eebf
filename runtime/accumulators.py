"""The autograd node that accumulates a parameter's gradient."""

from __future__ import annotations

from typing import Any

import torch


def grad_accumulator(p: torch.Tensor) -> Any:
    """The ``AccumulateGrad`` node of the leaf ``p`` (``None`` where there is none or it cannot be reached).

    Torch keeps this node only while something holds it (a graph, a hook);
    ``p.view_as(p)`` makes torch hand out the live one or create it. Works
    inside a backward too (grad mode is enabled for the view).
    """
    if not (p.requires_grad and p.is_leaf):
        return None
    try:
        with torch.enable_grad():
            node = p.view_as(p).grad_fn
    except RuntimeError:  # tensor subclasses and modes that refuse a view
        return None
    return node.next_functions[0][0] if node is not None and node.next_functions else None
