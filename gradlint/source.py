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
        # Raised for undecodable first lines too: say where, as for the rest of the file.
        _decode_or_explain(data, "utf-8")
        raise SourceError(f"cannot decode: {error.msg}") from error
    text = _decode_or_explain(data, encoding)
    if encoding == "utf-8-sig":
        text = text.removeprefix("\ufeff")
    newline = "\r\n" if "\r\n" in text[:10000] else "\n"
    return Source(text, encoding, newline)


def _decode_or_explain(data: bytes, encoding: str) -> str:
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as error:
        raise SourceError(
            f"cannot decode as {encoding} at byte {error.start}: {error.reason} "
            f"(add a PEP 263 coding line if the file is not UTF-8)"
        ) from error
    except LookupError as error:
        raise SourceError(f"cannot decode: unknown encoding {encoding!r}") from error


def read_source(path: str) -> Source:
    """Read and decode a file, turning every OS error into a one-line :class:`SourceError`."""
    return decode(read_bytes(path))


def read_bytes(path: str) -> bytes:
    """A file's bytes, every OS error turned into a one-line :class:`SourceError`."""
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
    return data
