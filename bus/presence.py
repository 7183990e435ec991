"""Heartbeats: which Gateway, Brain and Hands instances are alive right now."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from redis import exceptions as redis_errors

from bus.streams import Bus, every, finish

log = logging.getLogger("bus.presence")

ROLES = ("gateway", "brain", "hands")


class Presence:
    """Keeps one instance marked alive while it runs; an instance that dies drops out after its TTL."""

    def __init__(self, bus: Bus, role: str, instance_id: str, *, interval_s: float = 3.0) -> None:
        self.bus, self.role, self.instance_id = bus, role, instance_id
        self.interval_s = interval_s
        self.ttl_s = interval_s * 3
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def start(self) -> None:
        await self.beat()
        self._task = asyncio.create_task(self._loop(), name=f"presence:{self.role}")

    async def beat(self) -> None:
        expires = time.time() + self.ttl_s
        await self.bus.redis.zadd(self.bus.keys.alive(self.role), {self.instance_id: expires})

    async def stop(self) -> None:
        await finish(self._task, self._stop, grace_s=5)
        with contextlib.suppress(redis_errors.RedisError, OSError):
            await self.bus.redis.zrem(self.bus.keys.alive(self.role), self.instance_id)

    async def _loop(self) -> None:
        async for _ in every(self.interval_s, self._stop):
            try:
                await self.beat()
            except (redis_errors.RedisError, OSError) as exc:
                log.warning("heartbeat failed: %s", exc)


async def alive(bus: Bus, role: str) -> list[str]:
    """Instances of ``role`` whose heartbeat has not expired."""
    key, now = bus.keys.alive(role), time.time()
    await bus.redis.zremrangebyscore(key, "-inf", now)
    return sorted(m.decode() for m in await bus.redis.zrangebyscore(key, now, "+inf"))
