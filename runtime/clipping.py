"""Every way a script can reach torch's gradient clipping, intercepted at one place.

``clip_grad_norm_``, ``clip_grad_value_``, ``clip_grads_with_norm_``,
``get_total_norm`` and the deprecated ``clip_grad_norm`` live in
``torch.nn.utils.clip_grad``; a script may call them through
``torch.nn.utils``, through ``clip_grad``, or through a name it imported
before anything was patched (``from torch.nn.utils import clip_grad_norm_``).
Patching module attributes misses the last case, so each function object is
intercepted in place: torch wraps every one of them in a ``_no_grad`` closure
whose cell holds the real function, and replacing that cell changes the
function behind every reference at once. Where a function has no such cell
(another torch version), the module attributes are patched instead.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from gradlint.runtime._patching import Patcher

# public name -> attribute of torch.nn.utils.clip_grad
CLIPPING_FUNCTIONS = {
    "clip_grad_norm_": "clip_grad_norm_",
    "clip_grad_value_": "clip_grad_value_",
    "clip_grads_with_norm_": "_clip_grads_with_norm_",
    "get_total_norm": "_get_total_norm",
    "clip_grad_norm": "clip_grad_norm",
}

Wrap = Callable[[str, Callable], Callable]


def _inner_cell(function: Any) -> Any:
    """The closure cell of a ``_no_grad`` wrapper that holds the wrapped function, or ``None``."""
    wrapped = getattr(function, "__wrapped__", None)
    if wrapped is None:
        return None
    for cell in getattr(function, "__closure__", None) or ():
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        while held is not None:  # the real function, or an interceptor's replacement of it
            if held is wrapped:
                return cell
            held = getattr(held, "__wrapped__", None)
    return None


class ClipInterceptor:
    """Replace every clipping function ``f`` named ``name`` by ``wrap(name, f)`` until :meth:`restore`.

    Interceptors nest when restored in the reverse order of their creation.
    """

    def __init__(self, wrap: Wrap) -> None:
        import torch.nn.utils
        from torch.nn.utils import clip_grad

        self._undo: list[Callable[[], None]] = []
        self._patcher = Patcher()
        for public, attribute in CLIPPING_FUNCTIONS.items():
            function = getattr(clip_grad, attribute, None)
            if function is None:
                continue
            cell = _inner_cell(function)
            if cell is not None:
                original = cell.cell_contents
                cell.cell_contents = _named(wrap(public, original), original)
                self._undo.append(functools.partial(_set_cell, cell, original))
            else:
                replacement = _named(wrap(public, function), function)
                for owner in (clip_grad, torch.nn.utils):
                    for name in (attribute, public):
                        if getattr(owner, name, None) is function:
                            self._patcher.set(owner, name, replacement)

    def restore(self) -> None:
        """Put every function back as it was."""
        while self._undo:
            self._undo.pop()()
        self._patcher.restore()


def _set_cell(cell: Any, value: Any) -> None:
    cell.cell_contents = value


def _named(replacement: Callable, original: Callable) -> Callable:
    functools.update_wrapper(replacement, original)
    return replacement
