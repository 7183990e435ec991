"""Read a GGUF file's metadata (its chat template, its name) without loading the model.

GGUF (llama.cpp's format, version 2 and 3): the magic ``GGUF``, a version,
the tensor and key-value counts, then typed key-value pairs, little-endian.
Only the metadata is read; arrays (the tokenizer's vocabulary) are skipped.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import IO, Any

from bus.errors import PincerError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class NotGGUF(PincerError):
    """The file is not a GGUF model this reader understands."""


def metadata(path: Path, wanted: set[str] | None = None) -> dict[str, Any]:
    """The file's key-value metadata (only ``wanted`` keys when given; arrays as their length)."""
    with path.open("rb") as file:
        if file.read(4) != b"GGUF":
            raise NotGGUF(f"{path} is not a GGUF file (no GGUF magic at its start)")
        version, _tensors, count = struct.unpack("<IQQ", _exactly(file, 20))
        if version not in (2, 3):
            raise NotGGUF(f"{path} is GGUF version {version}; versions 2 and 3 are read")
        found: dict[str, Any] = {}
        for _ in range(count):
            key = _string(file)
            kind = struct.unpack("<I", _exactly(file, 4))[0]
            value = _value(file, kind, keep=wanted is None or key in wanted)
            if wanted is None or key in wanted:
                found[key] = value
                if wanted is not None and len(found) == len(wanted):
                    break
        return found


def _value(file: IO[bytes], kind: int, *, keep: bool) -> Any:
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, _exactly(file, struct.calcsize(fmt)))[0]
    if kind == STRING:
        return _string(file) if keep else _skip_string(file)
    if kind == ARRAY:
        item, length = struct.unpack("<IQ", _exactly(file, 12))
        if item in _SCALARS:
            file.seek(struct.calcsize(_SCALARS[item]) * length, 1)
        else:
            for _ in range(length):
                _value(file, item, keep=False)
        return length
    raise NotGGUF(f"unknown GGUF value type {kind}")


def _string(file: IO[bytes]) -> str:
    length = struct.unpack("<Q", _exactly(file, 8))[0]
    return _exactly(file, length).decode("utf-8", errors="replace")


def _skip_string(file: IO[bytes]) -> None:
    length = struct.unpack("<Q", _exactly(file, 8))[0]
    file.seek(length, 1)


def _exactly(file: IO[bytes], size: int) -> bytes:
    data = file.read(size)
    if len(data) != size:
        raise NotGGUF("the file ends inside its metadata")
    return data
