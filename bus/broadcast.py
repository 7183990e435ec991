"""Broadcast streams: every instance reads every new entry (no consumer group), e.g. cancellations.

A cancel must reach whichever process holds the work, and only that process
knows it does; so each one reads the whole control stream from the moment it
starts and acts on what concerns it. Entries are small and capped (MAXLEN ~).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from redis import exceptions as redis_errors

from bus.protocol import MalformedMessage, Message, decode
from bus.streams import RECONNECT_DELAYS, Bus

log = logging.getLogger("bus.broadcast")


class BroadcastReader:
    def __init__(self, bus: Bus, stream: str, handler: Callable[[Message], Awaitable[None]],
                 *, block_ms: int = 1000) -> None:
        self.bus, self.stream, self.handler, self.block_ms = bus, stream, handler, block_ms
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    async def start(self) -> None:
        # Only what is sent from now on concerns us; remember where "now" is before returning.
        info = await self.bus.redis.xinfo_stream(self.stream) if await self.bus.redis.exists(self.stream) else None
        last = info["last-generated-id"].decode() if info else "0-0"
        self._task = asyncio.create_task(self._loop(last), name=f"broadcast:{self.stream}")

    async def close(self) -> None:
        self._closing = True  # the blocking XREAD runs out (see ReplyInbox.close)
        if self._task:
            done, _ = await asyncio.wait({self._task}, timeout=self.block_ms / 1000 + 2)
            if not done:
                self._task.cancel()

    async def _loop(self, last: str) -> None:
        failures = 0
        while not self._closing:
            try:
                response = await self.bus.redis.xread({self.stream: last}, count=100, block=self.block_ms)
                failures = 0
            except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
                delay = RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS) - 1)]
                failures += 1
                log.warning("control stream unreachable, retrying in %.2fs: %s", delay, exc)
                await asyncio.sleep(delay)
                continue
            for _stream, entries in response or []:
                for raw_id, fields in entries:
                    last = raw_id.decode()
                    try:
                        message = decode(fields)
                    except MalformedMessage as exc:
                        log.error("ignored malformed control entry %s: %s", last, exc)
                        continue
                    try:
                        await self.handler(message)
                    except Exception:  # one bad control message must not stop the reader
                        log.exception("control handler failed for %s", message.type)
