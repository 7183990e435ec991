"""Broadcast streams: every instance reads every new entry (no consumer group), e.g. cancellations.

A cancel must reach whichever process holds the work, and only that process
knows it does; so each one reads the whole control stream from the moment it
starts and acts on what concerns it. Entries are small and capped (MAXLEN ~).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from bus.codec import MalformedMessage, decode
from bus.protocol import Message
from bus.replies import tail
from bus.streams import Bus

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
        async with contextlib.aclosing(tail(self.bus, self.stream, start=last, block_ms=self.block_ms,
                                            closing=lambda: self._closing)) as entries_read:
            async for entries in entries_read:
                for entry_id, fields in entries:
                    try:
                        message = decode(fields)
                    except MalformedMessage as exc:
                        log.error("ignored malformed control entry %s: %s", entry_id.decode(), exc)
                        continue
                    try:
                        await self.handler(message)
                    except Exception:  # one bad control message must not stop the reader
                        log.exception("control handler failed for %s", message.type)
