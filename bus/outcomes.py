"""What a consumer writes when it is done with an entry: a round of answers (the replies, then
the acks once Redis has them) or a dead letter."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.asyncio.client import Pipeline

from bus.log import kv

if TYPE_CHECKING:
    from bus.streams import Bus, GroupConsumer, Reply

log = logging.getLogger("bus")


class Answers:
    """One round of answered entries as one batcher item: first every reply, then (a new item,
    sent once Redis has the replies) one XACK per stream. An ack never lands before its reply:
    a crash in between means a redelivery, never a lost answer, and a reply Redis refuses
    leaves its entry pending for the reaper."""

    __slots__ = ("consumer", "attempt", "entries", "acking")

    def __init__(self, consumer: GroupConsumer, attempt: int = 0,
                 entries: list[tuple[str, str, Sequence[Reply], bool]] | None = None, *, acking: bool = False) -> None:
        self.consumer, self.attempt, self.acking = consumer, attempt, acking
        self.entries = entries if entries is not None else []  # (stream, entry id, replies, set aside)

    def __call__(self, pipe: Pipeline) -> None:
        if self.acking:
            for stream, ids in self._ids_by_stream().items():
                pipe.xack(stream, self.consumer.group, *ids)
            return
        bus = self.consumer.bus
        for _stream, _entry_id, replies, _aside in self.entries:
            for target, reply in replies:
                bus.add(pipe, target, reply)

    def send(self) -> None:
        self.consumer.bus.batcher.send(self, done=self.written)

    def written(self, outcome: list[Any] | Exception) -> None:
        self.consumer._written(self, outcome)  # noqa: SLF001 - the consumer's own callback

    def _ids_by_stream(self) -> dict[str, list[str]]:
        by_stream: dict[str, list[str]] = {}
        for stream, entry_id, _replies, _aside in self.entries:
            by_stream.setdefault(stream, []).append(entry_id)
        return by_stream

    def errors(self, outcome: list[Any] | Exception) -> dict[str, Exception]:
        """Entry id -> what kept its replies (or its ack) out of Redis, from the write's results."""
        if isinstance(outcome, Exception):
            return {entry_id: outcome for _, entry_id, _, _ in self.entries}
        errors, results = {}, iter(outcome)
        if self.acking:
            for ids, acked in zip(self._ids_by_stream().values(), results):
                if isinstance(acked, Exception):
                    errors.update(dict.fromkeys(ids, acked))
            return errors
        for _, entry_id, replies, _ in self.entries:
            error = next((r for r in [next(results) for _ in replies] if isinstance(r, Exception)), None)
            if error is not None:
                errors[entry_id] = error
        return errors


async def dead_letter(
    bus: Bus, stream: str, group: str, entry_id: str, fields: dict[bytes, bytes], reason: str
) -> None:
    """Acknowledge an entry that cannot be handled and keep a copy in ``dead``."""
    log.error("dead-lettered %s reason=%r", kv(stream=stream, entry=entry_id), reason)
    copy = {b"dead:source": stream.encode(), b"dead:group": group.encode(), b"dead:entry": entry_id.encode(),
            b"dead:reason": reason.encode()}
    copy.update({k: v for k, v in fields.items() if not k.startswith(b"dead:")})

    def build(pipe: Pipeline) -> None:
        pipe.xadd(bus.keys.dead, copy, maxlen=bus.settings.dead_maxlen, approximate=True)
        pipe.xack(stream, group, entry_id)

    await bus.batcher.run(build)
