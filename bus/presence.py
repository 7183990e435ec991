"""Heartbeats: which Gateway, Brain and Hands instances are alive right now, and how they are doing.

Each instance scores itself in ``alive:<role>`` (a sorted set by heartbeat
expiry: one ZRANGEBYSCORE lists the live ones) and keeps a hash of details
(host, pid, version, start time, plus what the role reports: tools, in-flight
calls, capacity) that expires with the heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from redis import exceptions as redis_errors

from bus.loops import every, finish
from bus.release import VERSION
from bus.streams import Bus

log = logging.getLogger("bus.presence")

ROLES = ("gateway", "brain", "hands", "channel")

Details = Callable[[], dict[str, Any]]


def version() -> str:
    """The release this code is (bus/release.py), not what the installed package's metadata says."""
    return VERSION


class Presence:
    """Keeps one instance marked alive while it runs; an instance that dies drops out after its TTL."""

    def __init__(self, bus: Bus, role: str, instance_id: str, *, interval_s: float = 3.0,
                 details: Details | None = None) -> None:
        self.bus, self.role, self.instance_id = bus, role, instance_id
        self.interval_s = interval_s
        self.ttl_s = interval_s * 3
        self.details = details or dict
        self.started = time.time()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def start(self) -> None:
        await self.beat()
        self._task = asyncio.create_task(self._loop(), name=f"presence:{self.role}")

    async def beat(self) -> None:
        now = time.time()
        info = {"host": socket.gethostname(), "pid": os.getpid(), "version": version(), "started": self.started,
                "beat": now, **self.details()}
        key = self.bus.keys.instance(self.role, self.instance_id)
        async with self.bus.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(self.bus.keys.alive(self.role), {self.instance_id: now + self.ttl_s})
            pipe.hset(key, mapping={k: str(v) for k, v in info.items()})
            pipe.pexpire(key, int(self.ttl_s * 1000))
            await pipe.execute()

    async def stop(self) -> None:
        await finish(self._task, self._stop, grace_s=5)
        with contextlib.suppress(redis_errors.RedisError, OSError):
            await self.bus.redis.zrem(self.bus.keys.alive(self.role), self.instance_id)
            await self.bus.redis.delete(self.bus.keys.instance(self.role, self.instance_id))

    async def _loop(self) -> None:
        async for _ in every(self.interval_s, self._stop):
            try:
                await self.beat()
            except (redis_errors.RedisError, OSError) as exc:
                log.warning("heartbeat failed: %s", exc)
            except Exception:  # a heartbeat that ended would make a live instance look dead
                log.exception("heartbeat failed unexpectedly; the next one tries again")


async def alive(bus: Bus, role: str) -> list[str]:
    """Instances of ``role`` whose heartbeat has not expired."""
    key, now = bus.keys.alive(role), time.time()
    await bus.redis.zremrangebyscore(key, "-inf", now)
    members: list[bytes] = await bus.redis.zrangebyscore(key, now, "+inf")  # type: ignore[assignment]  # bytes
    return sorted(m.decode() for m in members)


async def instances(bus: Bus, role: str) -> list[dict[str, str]]:
    """The live instances of ``role`` with their details."""
    ids = await alive(bus, role)
    async with bus.redis.pipeline(transaction=False) as pipe:  # one round trip for all of them
        for instance_id in ids:
            pipe.hgetall(bus.keys.instance(role, instance_id))
        details = await pipe.execute()
    return [{"id": instance_id, **{k.decode(): v.decode() for k, v in raw.items()}}
            for instance_id, raw in zip(ids, details, strict=True)]
