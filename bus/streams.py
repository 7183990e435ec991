"""The Redis Streams transport: the ``Bus`` (publish, connections, the batcher) and what every reader shares.

- ``Bus.publish`` appends one message to a stream (approximately capped);
  ``publish_until_sent`` sends it again while Redis is away.
- Consuming through a group (a handler per message, replies and XACK in one
  transaction) is ``bus/consumer.py``; reading streams outside a group (a
  process's reply inbox, broadcasts) is ``bus/replies.py``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from bus import trace
from bus.batching import Batcher
from bus.codec import encode
from bus.keys import Keys
from bus.protocol import Message
from bus.redis_client import CONNECTION_ERRORS as CONNECTION_ERRORS  # re-exported: the bus names what "Redis away" is
from bus.redis_client import HeldConnection, connect, connect_sentinel
from bus.settings import RedisSettings
from bus.text import text

RECONNECT_DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0)

log = logging.getLogger("bus")


def while_redis_away(within_s: float, **options: Any) -> AsyncRetrying:
    """Attempts of one write, again on a lost connection with backoff (0.1 s doubling to 2 s) for up to
    ``within_s``, then its last error: ``async for attempt in while_redis_away(20): with attempt: ...``."""
    return AsyncRetrying(retry=retry_if_exception_type(CONNECTION_ERRORS), stop=stop_after_delay(within_s),
                         wait=wait_exponential(multiplier=0.1, max=2.0), reraise=True, **options)


@dataclass
class Bus:
    redis: Redis
    keys: Keys
    settings: RedisSettings
    batcher: Batcher = field(init=False)
    _maxlens: dict[str, int | None] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        replicas = (self.settings.min_replicas, self.settings.replica_timeout_ms) if self.settings.min_replicas \
            else None
        self.batcher = Batcher(self.redis, replicas=replicas)

    @classmethod
    def from_settings(cls, settings: RedisSettings, url: str) -> Bus:
        if settings.sentinels:
            redis = connect_sentinel(settings.sentinels, settings.sentinel_master,
                                     password=_secret(settings.password),
                                     sentinel_password=_secret(settings.sentinel_password),
                                     max_connections=settings.max_connections)
        else:
            redis = connect(url, max_connections=settings.max_connections)
        return cls(redis=redis, keys=Keys(settings.prefix), settings=settings)

    async def publish(self, stream: str, message: Message) -> str:
        traceparent = trace.current.get()  # now, in the caller's task: the flush runs in the batcher's
        entry_id = (await self.batcher.run(lambda pipe: self.add(pipe, stream, message, traceparent)))[0]
        return str(entry_id.decode())

    async def publish_until_sent(self, stream: str, message: Message, *, within_s: float = 20.0) -> str:
        """``publish``, sent again while Redis is away (a restart, a failover) for up to ``within_s``, then the
        last error. Only for messages whose receiver knows a second copy by its id: a copy may land twice
        when Redis took it but its answer was lost (a chat message's second copy resumes its turn)."""
        retrying = while_redis_away(
            within_s,
            before_sleep=lambda state: log.warning(
                "Redis away while sending to %s, sending again: %s",
                stream,
                state.outcome.exception() if state.outcome else "",
            ),
        )
        async for attempt in retrying:
            with attempt:
                return await self.publish(stream, message)
        raise AssertionError("unreachable: tenacity either returns or raises")

    def send(self, stream: str, message: Message) -> None:
        """Publish without waiting: for events (text deltas, tool progress) whose order matters but
        whose round trip should not hold up the sender. They ride with the next write."""
        traceparent = trace.current.get()
        self.batcher.send(lambda pipe: self.add(pipe, stream, message, traceparent))

    def add(self, pipe: Pipeline, stream: str, message: Message, traceparent: str | None = None, *,
            lapse: bool = True) -> int:
        """Queue an XADD of ``message`` on a pipeline, capped as its stream's kind wants: a reply stream by age
        (what a turn said must not outlive ``redis.reply_max_age_s`` there, read or not), the others by length.
        Returns how many commands it queued (each has a result). ``lapse=False``: a reply stream's lapse is
        not set again, as an earlier write of the same transaction sets it."""
        fields: dict[Any, Any] = encode(message, traceparent=traceparent)  # redis-py's field type is invariant
        if stream.startswith(self.keys.reply("")):
            age_ms = int(self.settings.reply_max_age_s * 1000)
            pipe.xadd(stream, fields, minid=f"{int(time.time() * 1000) - age_ms}-0", approximate=False)
            if not lapse:
                return 1
            pipe.pexpire(stream, age_ms)  # and a stream no one writes to any more (its reader gone) lapses whole
            return 2
        maxlen = self._maxlen(stream)
        pipe.xadd(stream, fields, maxlen=maxlen, approximate=maxlen is not None)
        return 1

    def reader(self) -> HeldConnection:
        """One connection of the bus's pool, for one loop of blocking reads (``aclose`` gives it back)."""
        return HeldConnection(self.redis)

    async def ensure_group(self, stream: str, group: str) -> None:
        """Create the group at id 0 so nothing published before any consumer started is lost."""
        try:
            await self.redis.xgroup_create(stream, group, id="0", mkstream=True)
        except redis_errors.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def pending_to(self, stream: str, group: str, entry_id: str) -> tuple[str, int] | None:
        """Which consumer holds a pending entry, and how many times it was delivered; None if it is not pending."""
        rows = await self.redis.xpending_range(stream, group, min=entry_id, max=entry_id, count=1)
        if not rows:
            return None
        name, times = rows[0]["consumer"], int(rows[0]["times_delivered"])
        return text(name), times

    async def close(self) -> None:
        await self.batcher.close()
        await self.redis.aclose()

    def _maxlen(self, stream: str) -> int | None:
        """None for request streams: they are trimmed by MINID below what is still needed (bus/reaper.py)."""
        if stream not in self._maxlens:
            if len(self._maxlens) > 10_000:  # reply streams come and go with instances
                self._maxlens.clear()
            self._maxlens[stream] = self._cap(stream)
        return self._maxlens[stream]

    def _cap(self, stream: str) -> int | None:
        if stream == self.keys.dead:
            return self.settings.dead_maxlen
        if stream in (self.keys.hands_requests, self.keys.brain_inbox) or \
                stream.startswith((self.keys.hands_worker(""), self.keys.hands_lane_prefix)):
            return None
        return self.settings.reply_maxlen  # replies and the broadcast control streams


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None
