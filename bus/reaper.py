"""The reaper: work a dead consumer held is taken over; work that keeps killing consumers is set aside.

Each consumer runs one. Every ``reap_interval_s`` it
1. renews the lease on what it is handling itself (``XCLAIM … 0 … JUSTID``
   resets the idle time without counting a delivery), so only a consumer
   that stopped renewing (a dead one) lets its entries go idle;
2. takes over entries idle longer than ``claim_idle_s`` (``XAUTOCLAIM``,
   which counts a delivery) and handles them, telling the handler it is a
   redelivery (``bus.streams.delivery``);
3. moves an entry delivered more than ``max_deliveries`` times to ``dead``
   instead, after letting ``on_poison`` answer whoever waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from redis import exceptions as redis_errors

from bus.config import RedisSettings
from bus.log import kv
from bus.protocol import MalformedMessage, Message, decode
from bus.streams import Bus, GroupConsumer, Reply, dead_letter, every, finish

log = logging.getLogger("bus.reaper")

OnPoison = Callable[[Message], Awaitable[Sequence[Reply]]]


class Reaper:
    def __init__(self, bus: Bus, consumer: GroupConsumer, settings: RedisSettings,
                 *, on_poison: OnPoison | None = None) -> None:
        self.bus, self.consumer, self.settings, self.on_poison = bus, consumer, settings, on_poison
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"reaper:{self.consumer.consumer}")

    async def close(self) -> None:
        await finish(self._task, self._stop, grace_s=10)

    async def _loop(self) -> None:
        async for _ in every(self.settings.reap_interval_s, self._stop):
            try:
                await self.reap_once()
            except (redis_errors.RedisError, OSError) as exc:
                log.warning("reaper pass failed: %s", exc)

    async def reap_once(self) -> None:
        for stream in self.consumer.streams:
            await self._renew(stream)
            await self._claim(stream)

    async def _renew(self, stream: str) -> None:
        mine = sorted(self.consumer.holding.get(stream, ()))
        if mine:
            await self.bus.redis.xclaim(stream, self.consumer.group, self.consumer.consumer, min_idle_time=0,
                                        message_ids=mine, justid=True)

    async def _claim(self, stream: str) -> None:
        idle_ms = int(self.settings.claim_idle_s * 1000)
        _next, claimed, _deleted = await self.bus.redis.xautoclaim(
            stream, self.consumer.group, self.consumer.consumer, min_idle_time=idle_ms, start_id="0-0", count=50)
        for raw_id, fields in claimed:
            entry_id = raw_id.decode()
            if entry_id in self.consumer.holding.get(stream, ()):
                continue  # ours, and still being handled
            pending = await self.bus.redis.xpending_range(stream, self.consumer.group, min=entry_id, max=entry_id,
                                                          count=1)
            times = pending[0]["times_delivered"] if pending else 2
            log.warning("took over %s", kv(stream=stream, entry=entry_id, deliveries=times))
            if times > self.settings.max_deliveries:
                await self._poison(stream, entry_id, fields, times)
            else:
                await self.consumer.dispatch(stream, entry_id, fields, times=times)

    async def _poison(self, stream: str, entry_id: str, fields: dict[bytes, bytes], times: int) -> None:
        if self.on_poison is not None:
            with contextlib.suppress(MalformedMessage):
                for target, reply in await self.on_poison(decode(fields)):
                    await self.bus.publish(target, reply)
        await dead_letter(self.bus, stream, self.consumer.group, entry_id, fields,
                          f"delivered {times} times and never acknowledged (redis.max_deliveries = "
                          f"{self.settings.max_deliveries})")
