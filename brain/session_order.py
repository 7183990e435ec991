"""One turn of a session at a time across every Brain, in the order the Gateway numbered the messages.

A message with ``seq`` n waits until the session's ``done`` counter reaches n-1
and then takes the session's lease (``SET NX PX``), which its Brain renews while
the turn runs. A Brain that dies stops renewing: the lease expires and the
redelivered message (the reaper's) takes it. Both checks are one Lua script, so a
Brain sees the counter and takes the lease in one step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from bus.consumer import HandedOver
from bus.log import kv
from bus.loops import every, finish
from bus.outage import WRITE_RETRY_DELAYS, retry_delay
from bus.outcome import failure
from bus.protocol import ChatMessage
from bus.redis_client import RedisAway
from bus.scripts import ScriptCall, lua
from bus.streams import Bus

log = logging.getLogger("brain.session_order")

# KEYS: done, lease. ARGV: seq (0: none), owner, lease ms.  1: taken, 0: leased to another turn, -1: earlier turn due
# The owner names the Brain and the message: a turn this Brain left when Redis went away is its own to resume.
ACQUIRE = lua("brain.session_order.acquire", """
local seq = tonumber(ARGV[1])
if seq > 0 and tonumber(redis.call('GET', KEYS[1]) or '0') < seq - 1 then return -1 end
if redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then return 1 end
if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('PEXPIRE', KEYS[2], ARGV[3]) return 1 end
return 0
""")
# KEYS: lease. ARGV: owner, lease ms. A lease that lapsed while nobody took it is still ours.
RENEW = lua("brain.session_order.renew", """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if not holder then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
""")
# KEYS: done, lease. ARGV: owner, seq (0: none). KEEPTTL: a session that lapses takes its count with it.
RELEASE = lua("brain.session_order.release", """
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
local seq = tonumber(ARGV[2])
if seq > 0 and tonumber(redis.call('GET', KEYS[1]) or '0') < seq then redis.call('SET', KEYS[1], seq, 'KEEPTTL') end
return 1
""")


class LeaseLost(HandedOver):
    """Another Brain holds the session now (this one stalled past its lease): this turn must stop."""


@dataclass
class Lease:
    session_id: str
    lost: bool = False
    carried: list[Any] | None = None  # the results of the commands sent with the taking (None: not sent)

    def check(self) -> None:
        if self.lost:
            raise LeaseLost(f"session {self.session_id}: another Brain took over this turn")


class SessionOrder:
    def __init__(self, bus: Bus, instance_id: str, *, lease_s: float, wait_s: float) -> None:
        self.bus, self.keys, self.instance_id = bus, bus.keys, instance_id
        self.lease_ms, self.wait_s = int(lease_s * 1000), wait_s
        self._renew = bus.redis.register_script(RENEW)

    async def _run(self, script: str, keys: tuple[str, ...], args: tuple[Any, ...]) -> Any:
        """A script with the Brain's other writes (a turn's start and end share their round trips)."""
        return (await self.bus.batcher.run(ScriptCall(script, keys, args).add))[0]

    def _release_soon(self, keys: tuple[str, ...], owner: str, seq: int, attempt: int = 0) -> None:
        """Give the session back with the Brain's next write, not waited for: the turn's reply is queued
        next, so both share a round trip and the release lands first. Sent again while Redis is away, as
        the reply is; a release that never lands leaves the lease to lapse."""
        def done(outcome: list[Any] | Exception) -> None:
            error = failure(outcome)
            if error is None:
                return
            if isinstance(error, RedisAway) and attempt < len(WRITE_RETRY_DELAYS):
                asyncio.get_running_loop().call_later(retry_delay(attempt), self._release_soon,
                                                      keys, owner, seq, attempt + 1)
                return
            log.warning("session not given back; its lease lapses %s: %s",
                        kv(lease=keys[1], lapses_in_s=self.lease_ms / 1000), error)

        self.bus.batcher.send(ScriptCall(RELEASE, keys, (owner, seq)).add, done=done)

    @contextlib.asynccontextmanager
    async def turn(self, message: ChatMessage, *, on_wait: Callable[[], object] = lambda: None,
                   carry: Callable[[Any], object] | None = None) -> AsyncIterator[Lease]:
        """Hold the session for this message's turn (waiting for its earlier messages first;
        ``on_wait`` is called once if it has to wait). ``carry`` adds commands sent in the same step as
        the taking (the turn's first reads); their results are the lease's ``carried``. They go with the
        first try only: a turn that had to wait reads for itself once it holds the session."""
        owner = f"{self.instance_id}:{message.message_id}"
        sid, seq = message.session_id, message.seq or 0
        keys = (self.keys.session_done(sid), self.keys.session_lease(sid))
        carried = await self._wait_for_turn(message, owner, keys, seq, on_wait, carry)
        stop, lease = asyncio.Event(), Lease(sid, carried=carried)
        renewing = asyncio.create_task(self._keep(lease, owner, stop))
        try:
            yield lease
        except RedisAway:
            # Redis went away mid-turn: the consumer runs the message again once Redis is back, resuming the
            # turn, so the session is freed for it but not counted done (its later messages keep waiting).
            await finish(renewing, stop, grace_s=5)
            with contextlib.suppress(RedisAway):
                await self._run(RELEASE, keys, (owner, 0))
            raise
        except BaseException:
            await finish(renewing, stop, grace_s=5)
            await self._run(RELEASE, keys, (owner, seq))
            raise
        await finish(renewing, stop, grace_s=5)
        self._release_soon(keys, owner, seq)

    async def _wait_for_turn(self, message: ChatMessage, owner: str, keys: tuple[str, ...], seq: int,
                             on_wait: Callable[[], object], carry: Callable[[Any], object] | None
                             ) -> list[Any] | None:
        started, delay, warned, waiting = time.monotonic(), 0.005, False, False
        while True:
            acquire = ScriptCall(ACQUIRE, keys, (seq, owner, self.lease_ms))

            def build(pipe: Any, acquire: ScriptCall = acquire, carry: Callable[[Any], object] | None = carry) -> None:
                acquire.add(pipe)
                if carry is not None:
                    carry(pipe)

            got, *carried = await self.bus.batcher.run(build)
            if got == 1:
                return carried if carry is not None else None
            carry = None  # not read again at every try while the session is busy
            if not waiting:
                waiting = True
                on_wait()
            waited = time.monotonic() - started
            if got == -1 and waited > self.wait_s:
                # The earlier message never finished (lost before it reached a Brain?): go on, still one at a time.
                log.warning("earlier message never finished; going on %s",
                            kv(session=message.session_id, seq=seq, waited_s=round(waited)))
                seq = 0
                continue
            if not warned and waited > 5:
                warned = True
                log.info("waiting for the session's earlier turn %s",
                         kv(session=message.session_id, seq=seq, reason="order" if got == -1 else "lease"))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    async def _keep(self, lease: Lease, owner: str, stop: asyncio.Event) -> None:
        async for _ in every(self.lease_ms / 3000, stop):
            try:
                if not await self._renew(keys=[self.keys.session_lease(lease.session_id)],
                                         args=[owner, self.lease_ms]):
                    log.warning("session lease taken by another Brain; this turn stops %s",
                                kv(session=lease.session_id))
                    lease.lost = True
                    return
            except Exception as exc:  # Redis away: the next tick tries again
                log.warning("session lease renewal failed %s: %s", kv(session=lease.session_id), exc)
