"""A memo of values computed once per module, for rules that would otherwise re-walk it per event."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import libcst as cst

T = TypeVar("T")


class PerModule(Generic[T]):
    """Values keyed by the module they were computed from (and a key within it), kept until another module asks.

    The module is held while it is the current one, so ids of its nodes used
    as keys cannot be reused by other objects in the meantime.
    """

    def __init__(self) -> None:
        self._module: cst.Module | None = None
        self._values: dict[Hashable, T] = {}

    def get(self, module: cst.Module, key: Hashable, compute: Callable[[], T]) -> T:
        """The value for ``key`` in ``module``, computed by ``compute()`` the first time it is asked."""
        if self._module is not module:
            self._module, self._values = module, {}
        if key not in self._values:
            self._values[key] = compute()
        return self._values[key]
