"""One reader per Gateway for every session its clients follow, and a bounded queue per client.

A blocking XREAD per client would hold a Redis connection each (a pool of
128 stalls at client 129). Here one task reads every followed session's log
in one XREAD and hands each event to the clients that are caught up. A
client that falls behind (its queue full) leaves the live feed and reads
the log from its own last id without blocking, then joins again: memory per
client stays bounded, and a client past the log's cap gets a resync.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from bus.loops import Background
from bus.redis_client import RedisAway
from bus.streams import Bus
from bus.text import text
from gateway.turns.events import Event, Resync, SessionEvents, entry_event, event_order

log = logging.getLogger("gateway.fanout")

QUEUE = 256  # events waiting for one slow client before it is moved off the live feed
WAKE_KEEP_S = 3600  # a wake stream nobody woke for an hour lapses (the next wake makes it again)
_BEHIND = object()


class Subscription:
    def __init__(self, fanout: Fanout, session_id: str, after: str) -> None:
        self.fanout, self.session_id, self.cursor = fanout, session_id, after
        self.queue: asyncio.Queue[Any] = asyncio.Queue(QUEUE)
        self.live = False

    def offer(self, event: Event) -> None:
        """From the reader: take the event, or (queue full) leave the live feed and catch up later."""
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.fanout.leave(self)
            while not self.queue.empty():  # all of it is read again from the log, from the cursor on
                self.queue.get_nowait()
            self.queue.put_nowait(_BEHIND)

    async def events(self) -> AsyncIterator[Event | Resync]:
        """Every event after the cursor, in order, once; ``Resync`` when some are gone from the log."""
        try:
            while True:
                if not self.live:
                    self.fanout.join(self)  # first join, then read what came before: nothing falls between
                    async for item in self._catch_up():
                        yield item
                item = await self.queue.get()
                if item is _BEHIND:
                    continue  # off the live feed: catch up from the log
                if event_order(item.id) <= event_order(self.cursor):
                    continue  # read already while catching up
                self.cursor = item.id
                yield item
        finally:
            self.fanout.leave(self)

    async def _catch_up(self) -> AsyncIterator[Event | Resync]:
        while True:
            found = await self.fanout.log.read(self.session_id, self.cursor, block_ms=0)
            if isinstance(found, Resync):
                self.cursor = found.now
                yield found
                continue
            if not found:
                return
            for event in found:
                self.cursor = event.id
                yield event


class Fanout:
    def __init__(self, bus: Bus, log: SessionEvents, *, instance_id: str, block_ms: int = 5_000) -> None:
        self.bus, self.log, self.block_ms = bus, log, block_ms
        self.wake_key = bus.keys.gateway_wake(instance_id)
        self.members: dict[str, set[Subscription]] = {}
        self.cursors: dict[str, str] = {}  # where the reader is in each followed session's log
        self._task: asyncio.Task[None] | None = None
        self._wake_sent = Background()

    def subscribe(self, session_id: str, after: str) -> Subscription:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._read_loop(), name="events-fanout")
        return Subscription(self, session_id, after)

    def join(self, subscription: Subscription) -> None:
        subscription.live = True
        self.members.setdefault(subscription.session_id, set()).add(subscription)
        if subscription.session_id not in self.cursors:
            # Read it from where this client is: what the reader then sends twice, clients skip by id.
            self.cursors[subscription.session_id] = subscription.cursor
            self._wake_sent.start(self._wake())  # its XREAD lacks this session

    def leave(self, subscription: Subscription) -> None:
        subscription.live = False
        members = self.members.get(subscription.session_id)
        if members is not None:
            members.discard(subscription)
            if not members:
                del self.members[subscription.session_id]
                self.cursors.pop(subscription.session_id, None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        with contextlib.suppress(RedisAway):
            await self.bus.redis.delete(self.wake_key)

    async def _wake(self) -> None:
        with contextlib.suppress(RedisAway):
            async with self.bus.redis.pipeline(transaction=False) as pipe:
                pipe.xadd(self.wake_key, {"w": "1"}, maxlen=10, approximate=False)
                pipe.expire(self.wake_key, WAKE_KEEP_S)  # a Gateway killed -9 never deletes its own
                await pipe.execute()

    async def _read_loop(self) -> None:
        wake_cursor = "$"
        while True:
            try:
                streams: dict[Any, Any] = {self.bus.keys.session_events(s): c for s, c in self.cursors.items()}
                streams[self.wake_key] = wake_cursor
                found: Any = await self.bus.redis.xread(streams, count=500, block=self.block_ms)
            except RedisAway as exc:
                log.warning("reading session events failed: %s; again in 1s", exc)
                await asyncio.sleep(1)
                continue
            for key, entries in found or []:
                name = text(key)
                if name == self.wake_key:
                    wake_cursor = entries[-1][0].decode()
                    continue
                session_id = self._session_of(name)
                if session_id not in self.cursors:
                    continue  # everyone left while we read
                for entry_id, fields in entries:
                    event = entry_event(entry_id, fields)
                    self.cursors[session_id] = event.id
                    for member in list(self.members.get(session_id, ())):
                        member.offer(event)

    def _session_of(self, key: str) -> str:
        prefix, suffix = self.bus.keys.session_events("\0").split("\0")
        return key[len(prefix):len(key) - len(suffix)]
