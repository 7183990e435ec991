"""The reaper: work a dead consumer held is taken over; work that keeps killing consumers is set aside.

Each consumer runs one. Every ``reap_interval_s`` it
1. renews the lease on what it is handling itself (``XCLAIM … 0 … JUSTID``
   resets the idle time without counting a delivery), so only a consumer
   that stopped renewing (a dead one) lets its entries go idle. Only what is
   still pending to it: one another consumer took over meanwhile (this one
   was too slow to renew) stays with the taker, and is no longer renewed here. A consumer
   whose handler met Redis away keeps the entry and runs it again itself
   (``GroupConsumer._handle``): an outage is not a delivery.
Then one consumer of the pool per interval (the one that sets the stream's
``reaper_turn`` key, ``SET NX PX``) does the rest for everyone:
2. takes over entries idle longer than ``claim_idle_s`` (``XAUTOCLAIM``,
   following its cursor, which counts a delivery) and handles them, telling
   the handler it is a redelivery (``bus.consumer.delivery``);
3. moves an entry delivered more than ``max_deliveries`` times to ``dead``
   instead, after letting ``on_poison`` answer whoever waits for it;
4. removes from the group the consumers that are gone (no heartbeat, idle past
   ``claim_idle_s``) and hold nothing: checked and deleted in one Lua script,
   so pending work is claimed first and never dropped;
5. trims the stream below the oldest entry any group still needs (its oldest
   pending entry, or the first it has not been given): ``XTRIM MINID ~``.
After a pass that found Redis away, a reaper only renews for ``claim_idle_s``
from the pass that reaches it again: what live consumers held while nobody
could renew it went idle meanwhile, and they renew it before anyone claims it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis import exceptions as redis_errors

from bus.answers import Reply, dead_letter
from bus.codec import MalformedMessage, decode
from bus.consumer import GroupConsumer
from bus.log import kv
from bus.loops import every, finish
from bus.presence import alive
from bus.protocol import Message
from bus.scripts import lua
from bus.settings import RedisSettings
from bus.streams import CONNECTION_ERRORS, Bus
from bus.text import text

log = logging.getLogger("bus.reaper")

OnPoison = Callable[[Message], Awaitable[Sequence[Reply]]]

# KEYS: stream. ARGV: group, consumer. Deleted only when it holds no pending entry.
FORGET_CONSUMER = lua("bus.reaper.forget_consumer", """
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) == 0 then
  return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
end
return -1
""")


# KEYS: stream. ARGV: group, consumer, entry ids. Renews those still pending to the consumer; returns
# those pending to another (one no longer pending is being acknowledged: nothing to renew).
RENEW_OWN = lua("bus.reaper.renew_own", """
local taken = {}
for i = 3, #ARGV do
  local row = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)[1]
  if row and row[2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  elseif row then
    taken[#taken + 1] = ARGV[i]
  end
end
return taken
""")


class Reaper:
    def __init__(self, bus: Bus, consumer: GroupConsumer, settings: RedisSettings,
                 *, on_poison: OnPoison | None = None) -> None:
        self.bus, self.consumer, self.settings, self.on_poison = bus, consumer, settings, on_poison
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._forget = bus.redis.register_script(FORGET_CONSUMER)
        self._renew_own = bus.redis.register_script(RENEW_OWN)
        self._away = False  # the last pass found Redis away
        self._claims_from = 0.0  # monotonic: no taking over before this (Redis was away until lately)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"reaper:{self.consumer.consumer}")

    async def close(self) -> None:
        await finish(self._task, self._stop, grace_s=10)

    async def _loop(self) -> None:
        async for _ in every(self.settings.reap_interval_s, self._stop):
            try:
                await self.reap_once()
            except (redis_errors.RedisError, OSError) as exc:
                if isinstance(exc, CONNECTION_ERRORS):  # live consumers renew what they hold before any claim
                    self._away = True
                log.warning("reaper pass failed: %s", exc)
            except Exception:  # a reaper that ended would leave dead workers' calls unanswered, silently
                log.exception("reaper pass failed unexpectedly; the next pass tries again")

    async def reap_once(self) -> None:
        if self._away:  # once Redis answers again, everyone's holders get claim_idle_s to renew what went idle
            await self.bus.redis.ping()  # a reaper holding nothing sends no other command before a claim
            self._away, self._claims_from = False, time.monotonic() + self.settings.claim_idle_s
        for stream in self.consumer.streams:
            await self._renew(stream)
            if not self.consumer.stopping and time.monotonic() >= self._claims_from and await self._my_turn(stream):
                await self._claim(stream)
                await self._forget_gone(stream)
                await trim_delivered(self.bus.redis, stream)

    async def _my_turn(self, stream: str) -> bool:
        key = self.bus.keys.reaper_turn(stream, self.consumer.group)
        interval_ms = max(int(self.settings.reap_interval_s * 1000) - 50, 50)
        return bool(await self.bus.redis.set(key, self.consumer.consumer, nx=True, px=interval_ms))

    async def _forget_gone(self, stream: str) -> None:
        """Drop consumers that died holding nothing (their work was claimed first)."""
        idle_ms = int(self.settings.claim_idle_s * 1000)
        living = set(await alive(self.bus, self.consumer.group))
        for info in await self.bus.redis.xinfo_consumers(stream, self.consumer.group):
            name = text(info["name"])
            if name == self.consumer.consumer or name in living or info["idle"] < idle_ms:
                continue
            if await self._forget(keys=[stream], args=[self.consumer.group, name]) != -1:
                log.info("forgot consumer %s", kv(stream=stream, consumer=name))

    async def _renew(self, stream: str) -> None:
        held = self.consumer.holding.get(stream, set())
        if not held:
            return
        taken = await self._renew_own(keys=[stream], args=[self.consumer.group, self.consumer.consumer, *sorted(held)])
        for raw in taken:  # we were too slow to renew it: the taker runs it; our handler's run is not stopped
            entry_id = text(raw)
            held.discard(entry_id)  # nor handed back on a drain
            log.warning("taken over while still running here %s", kv(stream=stream, entry=entry_id))

    async def _claim(self, stream: str) -> None:
        idle_ms, cursor = int(self.settings.claim_idle_s * 1000), "0-0"
        for _ in range(20):  # at most 1,000 entries a pass: the next pass goes on
            # Redis 7 answers [cursor, entries, deleted ids]; 6.2 has no third part.
            cursor, claimed = (await self.bus.redis.xautoclaim(
                stream, self.consumer.group, self.consumer.consumer, min_idle_time=idle_ms, start_id=cursor,
                count=50))[:2]
            await self._take_over(stream, claimed)
            cursor = text(cursor)
            if cursor == "0-0":
                return

    async def _take_over(self, stream: str, claimed: list[Any]) -> None:
        for raw_id, fields in claimed:
            entry_id = raw_id.decode()
            if entry_id in self.consumer.holding.get(stream, ()):
                continue  # ours, and still being handled
            held = await self.bus.pending_to(stream, self.consumer.group, entry_id)
            times = held[1] if held is not None else 2
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


async def trim_delivered(redis: Any, stream: str, *, approximate: bool = True) -> int:
    """Trim entries every group has been given and acknowledged; nothing undelivered or pending goes."""
    groups = await redis.xinfo_groups(stream)
    if not groups:
        return 0
    floor: tuple[int, int] | None = None
    for group in groups:
        name = group["name"]
        needed = _entry_id(group["last-delivered-id"])
        needed = (needed[0], needed[1] + 1)  # the first entry this group has not been given
        summary = await redis.xpending(stream, name)
        if summary["pending"]:
            needed = min(needed, _entry_id(summary["min"]))
        floor = needed if floor is None else min(floor, needed)
    assert floor is not None
    return int(await redis.xtrim(stream, minid=f"{floor[0]}-{floor[1]}", approximate=approximate))


def _entry_id(raw: bytes | str) -> tuple[int, int]:
    ms, _, seq = text(raw).partition("-")
    return int(ms), int(seq or 0)
