"""Reversible monkey-patching: every attribute set through a :class:`Patcher` is put back by ``restore``."""

from __future__ import annotations

from typing import Any, Callable

_MISSING = object()


class Patcher:
    """Set attributes on modules and classes, remembering the originals.

    ``restore`` undoes the patches in reverse order, so patching the same
    attribute twice still ends with the very first original in place. Handles
    (anything with ``remove()``) can be registered too and are removed first.
    """

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []
        self._handles: list[Any] = []

    def set(self, owner: Any, name: str, value: Any) -> Any:
        """Replace ``owner.name`` by ``value`` and return the original."""
        original = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name, _MISSING)
        self._saved.append((owner, name, original))
        setattr(owner, name, value)
        return getattr(owner, name) if original is _MISSING else original

    def wrap(self, owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        """Replace ``owner.name`` by ``make(original)``, keeping the original's metadata."""
        import functools

        original = getattr(owner, name)
        wrapper = make(original)
        functools.update_wrapper(wrapper, original)
        self.set(owner, name, wrapper)

    def keep(self, handle: Any) -> Any:
        """Remember a removable handle (a hook registration) to remove on ``restore``."""
        self._handles.append(handle)
        return handle

    def restore(self) -> None:
        """Undo everything, newest first."""
        while self._handles:
            self._handles.pop().remove()
        while self._saved:
            owner, name, original = self._saved.pop()
            if original is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
