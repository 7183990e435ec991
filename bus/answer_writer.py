"""``AnswerWriter``: a consumer's answers on their way to Redis, until each entry can let its slot go.

Entries answered in one round share one write (``Answers``: their replies and acks in one
transaction). A round that met Redis away is sent again, paced, while the consumer runs; one the
primary applied but too few replicas confirmed is confirmed, not sent again (``bus/outage.py``).
When Redis has a round, or gave a final no, each of its entries is released to the consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from bus.answers import Answers, Reply, dead_letter_build
from bus.log import kv
from bus.loops import Background
from bus.outage import WRITE_RETRY_DELAYS, Outage, retry_delay
from bus.redis_client import NotReplicated
from bus.streams import CONNECTION_ERRORS, Bus

log = logging.getLogger("bus")

Release = Callable[[str, str, bool], None]
"""Told that an entry (stream, entry id, whether it was set aside) is done with: its slot goes."""


class AnswerWriter:
    """Writes one consumer's answers, and counts those not yet in Redis."""

    def __init__(self, bus: Bus, group: str, outage: Outage, release: Release,
                 stopping: Callable[[], bool]) -> None:
        self.bus, self.group, self.outage, self.release, self.stopping = bus, group, outage, release, stopping
        self.writing = 0  # entries answered whose replies and ack are not yet in Redis
        self._open: Answers | None = None  # the round still open to more
        self._all_written: asyncio.Future[None] | None = None
        self._confirming = Background()  # rounds the primary applied that replicas have not confirmed

    def send(self, stream: str, entry_id: str, fields: dict[bytes, bytes], replies: Sequence[Reply],
             aside: bool) -> None:
        """Queue an entry's replies and its ack for the next write; it stays held (its slot taken)
        until Redis has them. Entries answered in one round share one write as long as nothing else
        was queued after it, so nothing overtakes what was sent before."""
        self.writing += 1
        answers = self._open
        if answers is None or self.bus.batcher.last_queued is not answers:
            answers = self._open = Answers(self.bus, self.group, self._written)
            answers.send()
        answers.entries.append((stream, entry_id, fields, replies, aside))

    async def all_written(self, timeout_s: float | None) -> None:
        """Wait until every answer sent is in Redis (or given up on), at most ``timeout_s``."""
        if not self.writing:
            return
        if self._all_written is None or self._all_written.done():
            self._all_written = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._all_written), timeout_s)

    async def finish(self) -> None:
        """At shutdown: rounds still waiting for replicas end; their entries stay pending."""
        await self._confirming.finish()

    def _written(self, answers: Answers, outcome: list[Any] | Exception) -> None:
        """A round came back from Redis: release its entries, or try again while Redis is away."""
        if isinstance(outcome, NotReplicated) and outcome.applied is not None:
            if not self.stopping():
                self._confirming.start(self._settle_unconfirmed(answers, outcome.applied))
                return
            outcome = outcome.applied  # stopping: it stands as the primary applied it, unconfirmed
        # While running, answers are retried until Redis takes them: the entries stay held (renewed, never
        # claimed or counted); a stopping consumer gives up after ~10 s and leaves them pending.
        retrying = answers.attempt < len(WRITE_RETRY_DELAYS) or not self.stopping()
        if isinstance(outcome, CONNECTION_ERRORS) and retrying:
            if answers.attempt == 0:
                log.warning("Redis away while answering %d entr%s; retrying", len(answers.entries),
                            "y" if len(answers.entries) == 1 else "ies")
            self._again(answers)
            return
        pending, refused = answers.failures(outcome)
        for stream, entry_id, fields, _replies, aside in answers.entries:
            error = pending.get((stream, entry_id))
            if error is not None:  # still pending: the reaper hands it out again
                log.error("reply not written %s: %s", kv(stream=stream, entry=entry_id), error)
            error = refused.get((stream, entry_id))
            if error is not None:  # acknowledged with its round; no answer can reach its caller
                self.bus.batcher.send(dead_letter_build(self.bus, stream, self.group, entry_id, fields,
                                                        f"reply refused by Redis: {error}"))
                log.error("reply refused %s: %s; the entry is copied to dead", kv(stream=stream, entry=entry_id),
                          error)
            self.writing -= 1
            self.release(stream, entry_id, aside)
        if not self.writing and self._all_written is not None and not self._all_written.done():
            self._all_written.set_result(None)

    async def _settle_unconfirmed(self, answers: Answers, applied: list[Any]) -> None:
        try:
            stands = await self.outage.confirmed(answers)
        except Exception:  # its entries must be let go whatever happens, or their slots leak
            log.exception("confirming a round of answers failed; it stands as the primary applied it")
            stands = True
        if stands:
            self._written(answers, applied)
        else:  # paced as the away path is: a round lost again and again is not sent in a tight loop
            self._again(answers)

    @staticmethod
    def _again(answers: Answers) -> None:
        asyncio.get_running_loop().call_later(retry_delay(answers.attempt), answers.again().send)
