"""Concurrency limits that hold for the whole pool of Hands workers, not per worker.

``hands.pool_limits`` maps a gate (``global``, ``category:<name>``,
``tool:<name>``: the same gates as the worker's own limits) to the number of
calls that may pass it at once across every worker. Each gate is a sorted set
of holder tokens scored by lease expiry; a worker takes the slots of all its
call's gates in one Lua script (Redis' clock, so workers' clocks may differ),
renews its leases while the calls run, and removes its tokens when they end.
A worker that dies stops renewing: its slots free themselves when the lease
runs out. All gate keys share one hash tag, so the script works on a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from bus.loops import every, finish
from bus.protocol import ErrorCode, new_id
from bus.scripts import lua
from bus.streams import Bus
from hands.errors import ToolFailure

log = logging.getLogger("hands.pool_limits")

# KEYS: the gates' sorted sets. ARGV: token, lease ms, then each gate's capacity.
# Returns 0 when every slot was taken, else the 1-based index of the first full gate.
ACQUIRE = lua("hands.pool_limits.acquire", """
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now_ms)
  if redis.call('ZCARD', key) >= tonumber(ARGV[2 + i]) then return i end
end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now_ms + tonumber(ARGV[2]), ARGV[1])
  redis.call('PEXPIRE', key, tonumber(ARGV[2]) * 2)
end
return 0
""")
# KEYS: gates. ARGV: lease ms, then the tokens to renew (only those still held).
RENEW = lua("hands.pool_limits.renew", """
local now = redis.call('TIME')
local until_ms = now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[1])
for _, key in ipairs(KEYS) do
  for i = 2, #ARGV do redis.call('ZADD', key, 'XX', until_ms, ARGV[i]) end
  redis.call('PEXPIRE', key, tonumber(ARGV[1]) * 2)
end
return 1
""")


class PoolLimits:
    def __init__(self, bus: Bus, limits: dict[str, int], *, lease_s: float, wait_s: float) -> None:
        self.bus, self.limits = bus, limits
        self.lease_ms, self.wait_s = int(lease_s * 1000), wait_s
        self._acquire = bus.redis.register_script(ACQUIRE)
        self._renew = bus.redis.register_script(RENEW)
        self._held: dict[str, tuple[str, ...]] = {}  # token -> the gate keys it holds
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def gates(self, names: list[str]) -> list[tuple[str, int]]:
        return [(name, self.limits[name]) for name in names if name in self.limits]

    @contextlib.asynccontextmanager
    async def slot(self, gate_names: list[str]) -> AsyncIterator[None]:
        gates = self.gates(gate_names)
        if not gates:
            yield
            return
        keys = tuple(self.bus.keys.pool_limit(name) for name, _ in gates)
        token = new_id()
        await self._take(token, keys, gates)
        self._held[token] = keys
        try:
            yield
        finally:
            del self._held[token]
            await self.bus.batcher.run(lambda pipe: [pipe.zrem(key, token) for key in keys])

    async def _take(self, token: str, keys: tuple[str, ...], gates: list[tuple[str, int]]) -> None:
        deadline, delay = time.monotonic() + self.wait_s, 0.005
        while True:
            full = await self._acquire(keys=list(keys), args=[token, self.lease_ms, *[c for _, c in gates]])
            if full == 0:
                return
            if time.monotonic() >= deadline:
                name, capacity = gates[int(full) - 1]
                raise ToolFailure(
                    ErrorCode.QUEUE_TIMEOUT,
                    f"waited {self.wait_s:g}s for a slot of the pool-wide limit {name!r} ({capacity} at once across "
                    "all workers, hands.pool_limits) and none came free",
                    suggestions=["try again later, or with fewer calls at once"], recoverable=True)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)

    async def start(self) -> None:
        if self.limits:
            self._task = asyncio.create_task(self._keep(), name="pool-limits")

    async def close(self) -> None:
        await finish(self._task, self._stop, grace_s=5)

    async def _keep(self) -> None:
        async for _ in every(self.lease_ms / 3000, self._stop):
            by_keys: dict[tuple[str, ...], list[str]] = {}
            for token, keys in list(self._held.items()):
                by_keys.setdefault(keys, []).append(token)
            for keys, tokens in by_keys.items():
                try:
                    await self._renew(keys=list(keys), args=[self.lease_ms, *tokens])
                except Exception as exc:  # Redis away: the next tick tries again
                    log.warning("pool limit lease renewal failed: %s", exc)
