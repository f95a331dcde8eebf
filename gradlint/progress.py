"""A status line for long commands: rewritten in place on a terminal, absent everywhere else.

A carriage return redraws a line on a terminal but leaves a mess in a CI log
or a file, so the line is drawn only when the stream is a terminal, and never
under ``--quiet``.
"""

from __future__ import annotations

import sys
from typing import TextIO


class StatusLine:
    """One line of progress on ``stream`` (stderr by default), drawn only where it is a terminal."""

    def __init__(self, prefix: str = "", stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self.prefix = prefix
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = not quiet and _is_terminal(self.stream)
        self._drawn = False

    def update(self, text: str) -> None:
        """Replace the line with ``prefix + text``."""
        if self.enabled:
            self.stream.write(f"\r\033[K{self.prefix}{text}")
            self.stream.flush()
            self._drawn = True

    def close(self) -> None:
        """Erase the line, so that what is printed next starts on a clean line."""
        if self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._drawn = False


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False
