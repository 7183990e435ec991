"""A message as a Redis stream entry: the only two doors in and out of the wire.

An entry has the fields ``type``, ``id``, ``data`` (a msgpack map of the model's
fields) and, where they apply, ``reply_to`` and ``traceparent``. Anything that
does not decode raises ``MalformedMessage`` with a reason a person can act on.
"""

from __future__ import annotations

from typing import Any

import msgpack
from pydantic import ValidationError

from bus.errors import PincerError
from bus.protocol import BaseMessage, Message, new_id

# Each type's own pydantic-core validator, picked by the entry's ``type`` field: cheaper per message than
# a union adapter's discriminator and Python wrapper (the figures: docs/bus.md, "the hot path's choices").
_VALIDATORS = {model.model_fields["type"].default: model.__pydantic_validator__
               for model in Message.__origin__.__args__}  # type: ignore[attr-defined]  # Annotated[Union] at run time
MESSAGE_TYPES: frozenset[str] = frozenset(_VALIDATORS)


# Bounds on what one entry may decode to: a 10 MB entry of empty arrays is 644 MB of Python lists.
MAX_DATA_BYTES = 16 * 2**20
MAX_ITEMS = 100_000  # elements of one array, or pairs of one map


# msgpack's Packer starts with a 256 KiB buffer; a long-lived process maps blocks that big afresh each time
# (bus/heap.py), so every packb paid an mmap, a munmap and a page fault (~11 µs against ~1). It grows as needed.
_FIRST_BUFFER = 1024


def pack(value: Any, *, bin_type: bool = True) -> bytes:
    """``value`` as msgpack (``bin_type=False`` for Redis' own cmsgpack, which reads raw strings only)."""
    return msgpack.packb(value, use_bin_type=bin_type, buf_size=_FIRST_BUFFER)  # type: ignore[no-any-return]


class MalformedMessage(PincerError, ValueError):
    """A stream entry that is not a Pincer message; the reason says why."""


def encode(
    message: BaseMessage, *, message_id: str | None = None, traceparent: str | None = None
) -> dict[bytes, bytes]:
    """The stream-entry fields for a message (with the W3C ``traceparent`` of the work it belongs to)."""
    # pydantic-core's serializer itself: model_dump's Python wrapper doubles the cost (docs/bus.md).
    data = message.__pydantic_serializer__.to_python(message, mode="json", exclude_none=True)
    del data["type"]  # it travels as its own field
    fields = {
        b"type": message.type.encode(),  # type: ignore[attr-defined]  # every member has a Literal type
        b"id": (message_id or new_id()).encode(),
        b"data": pack(data),
    }
    # A model's fields live in its __dict__; getattr on a model without the field is slow (pydantic raises).
    reply_to = message.__dict__.get("reply_to")
    if reply_to:
        fields[b"reply_to"] = reply_to.encode()
    if traceparent:
        fields[b"traceparent"] = traceparent.encode()
    return fields


def decode(fields: dict[bytes, bytes]) -> Message:
    """A stream entry's fields back into a message, or ``MalformedMessage``."""
    try:
        kind = fields[b"type"].decode()
        raw = fields[b"data"]
    except KeyError as missing:
        raise MalformedMessage(f"entry has no {missing.args[0].decode()!r} field") from None
    except UnicodeDecodeError:
        raise MalformedMessage("field 'type' is not UTF-8 text") from None
    validator = _VALIDATORS.get(kind)
    if validator is None:
        raise MalformedMessage(f"unknown message type {kind!r}")
    if len(raw) > MAX_DATA_BYTES:
        raise MalformedMessage(f"field 'data' is {len(raw):,} bytes; the most an entry may carry is {MAX_DATA_BYTES:,}")
    try:  # msgpack's own C unpacker also refuses nesting past its stack (StackError)
        data = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_array_len=MAX_ITEMS, max_map_len=MAX_ITEMS)
    except Exception as exc:  # msgpack raises several unrelated types
        raise MalformedMessage(f"field 'data' is not msgpack: {exc}") from None
    if not isinstance(data, dict):
        raise MalformedMessage(f"field 'data' must be a map, got {type(data).__name__}")
    try:
        data["type"] = kind  # a fresh dict from msgpack: no copy needed
        return validator.validate_python(data)  # type: ignore[no-any-return]  # pydantic-core is untyped here
    except ValidationError as exc:
        raise MalformedMessage(f"{kind}: {_describe(exc)}") from None


def _describe(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
        for err in exc.errors()
    )
