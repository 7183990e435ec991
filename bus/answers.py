"""What a consumer writes when it is done with an entry: a round of answers (its replies and
their acks, in the batcher's one transaction) or a dead letter."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from bus import trace
from bus.batching import Build
from bus.log import kv
from bus.protocol import Message
from bus.records import DeadLetter

if TYPE_CHECKING:
    from bus.streams import Bus

log = logging.getLogger("bus")

Reply = tuple[str, Message]
"""What a handler answers: the stream to write to, and the message."""

Entry = tuple[str, str, dict[bytes, bytes], Sequence[Reply], bool]
"""An answered entry: (stream, entry id, its fields, its replies, whether it was set aside)."""
Key = tuple[str, str]  # (stream, entry id)
Written = Callable[["Answers", "list[Any] | Exception"], None]
"""Told when a round came back from Redis (the consumer releases its entries, or retries)."""


class Answers:
    """One round of answered entries as one batcher item: every reply, then one XACK per stream,
    in the flush's transaction (a flush of more than one command is one, ``Batcher._write``;
    a round has at least a reply and an ack, or only acks). Redis applies it as a whole, so an
    ack never lands without the reply written before it, and a crash cannot fall between them.
    A round Redis refuses while queueing it (out of memory, an ACL, a read-only replica) is not
    applied at all: its entries stay pending and the reaper hands them out again. A reply
    refused as it runs (WRONGTYPE: its stream's key holds something else, so no answer can ever
    be read there) is acknowledged with its round; the consumer copies its entry to ``dead``
    with the reason."""

    __slots__ = ("attempt", "bus", "done", "entries", "group", "sizes")

    def __init__(self, bus: Bus, group: str, done: Written, attempt: int = 0,
                 entries: list[Entry] | None = None) -> None:
        self.bus, self.group, self.done, self.attempt = bus, group, done, attempt
        self.entries = entries if entries is not None else []
        self.sizes: list[int] = []  # commands queued for each entry's replies, in order

    def again(self) -> Answers:
        """The same round, as the next attempt (after Redis was away)."""
        return Answers(self.bus, self.group, self.done, self.attempt + 1, self.entries)

    def __call__(self, pipe: Pipeline) -> None:
        # A caller's replies of one round share its reply stream: its lapse is set once, after the first.
        sizes, targets = [], set()
        for _stream, _entry_id, fields, replies, _aside in self.entries:
            traceparent = trace.from_entry(fields)  # an answer goes on in its request's trace
            size = 0
            for target, reply in replies:
                size += self.bus.add(pipe, target, reply, traceparent, lapse=target not in targets)
                targets.add(target)
            sizes.append(size)
        self.sizes = sizes
        for stream, ids in self._ids_by_stream().items():
            pipe.xack(stream, self.group, *ids)

    def send(self) -> None:
        self.bus.batcher.send(self, done=self.written)

    def written(self, outcome: list[Any] | Exception) -> None:
        self.done(self, outcome)

    def _ids_by_stream(self) -> dict[str, list[str]]:
        by_stream: dict[str, list[str]] = {}
        for stream, entry_id, _fields, _replies, _aside in self.entries:
            by_stream.setdefault(stream, []).append(entry_id)
        return by_stream

    def failures(self, outcome: list[Any] | Exception) -> tuple[dict[Key, Exception], dict[Key, Exception]]:
        """From the write's outcome: (entries left pending, with why: the round was not applied,
        or their ack was refused; entries acknowledged whose reply was refused, with why)."""
        if isinstance(outcome, Exception):
            return {(stream, entry_id): outcome for stream, entry_id, *_ in self.entries}, {}
        results, refused = iter(outcome), {}
        for (stream, entry_id, *_), size in zip(self.entries, self.sizes, strict=True):
            written = [next(results) for _ in range(size)]
            error = next((r for r in written if isinstance(r, Exception)), None)
            if error is not None:
                refused[stream, entry_id] = error
        pending: dict[Key, Exception] = {}
        for (stream, ids), acked in zip(self._ids_by_stream().items(), results, strict=True):
            if isinstance(acked, Exception):
                pending.update({(stream, entry_id): acked for entry_id in ids})
        return pending, refused


def dead_letter_build(bus: Bus, stream: str, group: str, entry_id: str, fields: dict[bytes, bytes],
                      reason: str) -> Build:
    """The write that copies an entry to ``dead`` with why and acknowledges it (two commands: one
    transaction, so when Redis refuses it, out of memory say, neither happens and it stays pending)."""
    copy: dict[Any, Any] = DeadLetter.of(source=stream, group=group, entry=entry_id, reason=reason,
                                         fields=fields).encode()

    def build(pipe: Pipeline) -> None:
        pipe.xadd(bus.keys.dead, copy, maxlen=bus.settings.dead_maxlen, approximate=True)
        pipe.xack(stream, group, entry_id)

    return build


async def dead_letter(
    bus: Bus, stream: str, group: str, entry_id: str, fields: dict[bytes, bytes], reason: str
) -> None:
    """Acknowledge an entry that cannot be handled and keep a copy in ``dead``; if Redis refuses
    that, log it and leave the entry pending (its next delivery tries again)."""
    log.error("dead-lettered %s reason=%r", kv(stream=stream, entry=entry_id), reason)
    try:
        await bus.batcher.run(dead_letter_build(bus, stream, group, entry_id, fields, reason))
    except ResponseError as refused:
        log.error("dead letter not written %s: %s", kv(stream=stream, entry=entry_id), refused)
