"""Calls to tools that are not idempotent run at most once per call id.

Before such a call runs, its worker writes a record ``running:<worker>#<claim>`` with
``SET NX``; when it finishes, the record becomes the result. A second delivery of
the same call id (a worker died and the reaper took the entry over, or a Brain
resuming a turn sent it again) reads the record instead of running the tool:
- a result: that result, again;
- running on a live worker: wait for its result (up to the call's deadline);
- running on a worker that is gone: ``WORKER_LOST``, since the side effect may or
  may not have happened;
- running on this worker, which is not running it: its claim was cut off by Redis
  going away before the call started, so it runs now;
- no record: the call never started, so it runs now.

Redis going away must not leave a record that says "running" for a call nobody runs
(every later delivery would wait for it until its deadline): a claim whose answer was
lost is dropped once Redis answers again, and a result whose record could not be
written is kept here and written then.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack

from bus.codec import pack
from bus.keys import Keys
from bus.log import kv
from bus.loops import Background
from bus.presence import alive
from bus.protocol import ErrorCode, ToolExecute, ToolResult, now_ms
from bus.redis_client import RedisAway
from bus.scripts import lua
from bus.streams import while_redis_away
from hands.errors import ToolFailure

log = logging.getLogger("hands.call_records")

RUNNING = b"running:"
# KEYS: the record. ARGV: the claim. A claim is dropped only while it is still that claim.
DROP_CLAIM = lua("hands.call_records.drop_claim", """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""")


class CallRecords:
    def __init__(self, bus: Any, worker_id: str, *, keep_s: float,
                 running_here: Callable[[str], bool] = lambda _call_id: False) -> None:
        self.bus, self.worker_id, self.keep_ms = bus, worker_id, int(keep_s * 1000)
        self.keys: Keys = bus.keys
        self.running_here = running_here  # whether this worker is running that call now
        self._drop = bus.redis.register_script(DROP_CLAIM)
        self._unwritten: dict[str, ToolResult] = {}  # results whose record Redis has not taken yet
        self._claiming: Counter[str] = Counter()  # deliveries of a call id in claim() here now
        self._settling = Background()

    async def claim(self, call: ToolExecute) -> ToolResult | ToolFailure | None:
        """None: this worker runs the call now. Otherwise the earlier run's result, or why it cannot be known."""
        kept = self._unwritten.get(call.call_id)
        if kept is not None:  # it ran here; its record is still on its way
            return kept
        mine = RUNNING + f"{self.worker_id}#{secrets.token_hex(4)}".encode()
        self._claiming[call.call_id] += 1
        try:
            return await self._claim(call, mine)
        except RedisAway:
            # The SET may have landed with its answer lost: once Redis answers, drop the claim if it is
            # still this one (the call did not start), so no later delivery waits for it.
            self._settle(f"drop the claim on {call.call_id}", self._drop, keys=[self.keys.call_record(call.call_id)],
                         args=[mine])
            raise
        finally:
            self._claiming[call.call_id] -= 1
            if not self._claiming[call.call_id]:
                del self._claiming[call.call_id]

    async def _claim(self, call: ToolExecute, mine: bytes) -> ToolResult | ToolFailure | None:
        key = self.keys.call_record(call.call_id)
        while True:
            kept = self._unwritten.get(call.call_id)
            if kept is not None:  # the run this one waited for ended here; its record is on its way
                return kept
            if await self.bus.redis.set(key, mine, nx=True, px=self.keep_ms):
                return None
            record = await self.bus.redis.get(key)
            if record is None:
                continue  # expired between the two commands: try again
            if not record.startswith(RUNNING):
                return ToolResult.model_validate(msgpack.unpackb(record, raw=False))
            owner = record[len(RUNNING):].partition(b"#")[0].decode()
            if owner == self.worker_id and not self.running_here(call.call_id) and self._claiming[call.call_id] == 1:
                # This worker's own claim, cut off before the call started (Redis went away): run it now.
                await self.bus.redis.set(key, mine, px=self.keep_ms)
                return None
            if owner != self.worker_id and owner not in await alive(self.bus, "hands"):
                return ToolFailure(
                    ErrorCode.WORKER_LOST,
                    f"the worker running {call.tool} ({owner}) stopped before answering; the call may or may not "
                    "have taken effect, and it is not run again because it is not idempotent",
                    suggestions=["check whether it took effect before calling it again"],
                    recoverable=True,
                    retryable=False,
                )
            if call.deadline <= now_ms():
                return ToolFailure(ErrorCode.TIMEOUT, f"{call.tool} is still running on {owner} (the same call, "
                                   "sent again) and the call's deadline passed", recoverable=True)
            await asyncio.sleep(0.05)  # the same call is running elsewhere: its result will be ours

    async def done(self, call: ToolExecute, result: ToolResult) -> None:
        """Keep the result as the call's record; while Redis is away, here, and in Redis once it answers.
        Called with no await since the run left ``running_here``: a second delivery waiting for that run
        (its record still says running here) must find the result here until Redis has it, or it would
        take the record for a claim cut off before the run started, and run the call again."""
        self._unwritten[call.call_id] = result
        packed = pack(result.model_dump(mode="json", exclude_none=True))
        key = self.keys.call_record(call.call_id)
        try:
            await self.bus.redis.set(key, packed, px=self.keep_ms)
        except RedisAway as exc:  # the answer goes on; a second delivery here gets the kept result
            log.warning("call record not written yet %s: %s", kv(call=call.call_id), exc)
            self._settle(f"the record of {call.call_id}", self.bus.redis.set, key, packed, px=self.keep_ms,
                         then=lambda: self._unwritten.pop(call.call_id, None))
        else:
            self._unwritten.pop(call.call_id, None)

    def _settle(self, what: str, command: Callable[..., Awaitable[Any]], *args: Any,
                then: Callable[[], object] = lambda: None, **kwargs: Any) -> None:
        """Run ``command`` in the background until Redis takes it (for as long as a record is kept)."""
        async def until_taken() -> None:
            try:
                async for attempt in while_redis_away(self.keep_ms / 1000):
                    with attempt:
                        await command(*args, **kwargs)
                then()
            except RedisAway as exc:
                log.error("gave up on %s: %s", what, exc)

        self._settling.start(until_taken())

    async def close(self) -> None:
        """Let what is still being settled finish briefly, then stop it."""
        await self._settling.finish(grace_s=2)
