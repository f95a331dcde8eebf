"""Reading a file as Python source: bytes to text, honouring BOMs and PEP 263 coding lines."""

from __future__ import annotations

import dataclasses
import io
import tokenize


class SourceError(Exception):
    """The file cannot be read as Python source; the message says why, in one line."""


@dataclasses.dataclass(frozen=True)
class Source:
    """A file's text and how to write it back: its encoding and its line ending."""

    text: str
    encoding: str
    newline: str


def decode(data: bytes) -> Source:
    """Decode a file's bytes as Python would, or raise :class:`SourceError`."""
    if b"\x00" in data:
        raise SourceError("not a Python source file (binary content)")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as error:
        raise SourceError(f"cannot decode: {error.msg}") from error
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as error:
        reason = getattr(error, "reason", str(error))
        start = getattr(error, "start", None)
        where = f" at byte {start}" if start is not None else ""
        raise SourceError(f"cannot decode as {encoding}{where}: {reason} (add a PEP 263 coding line if the file is not UTF-8)") from error
    if encoding == "utf-8-sig":
        text = text.removeprefix("\ufeff")
    newline = "\r\n" if "\r\n" in text[:10000] else "\n"
    return Source(text, encoding, newline)


def read_source(path: str) -> Source:
    """Read and decode a file, turning every OS error into a one-line :class:`SourceError`."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except IsADirectoryError as error:
        raise SourceError("is a directory") from error
    except PermissionError as error:
        raise SourceError("cannot read: permission denied") from error
    except FileNotFoundError as error:
        raise SourceError("no such file or directory") from error
    except OSError as error:
        raise SourceError(f"cannot read: {error.strerror or error}") from error
    return decode(data)
