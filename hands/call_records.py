"""Calls to tools that are not idempotent run at most once per call id.

Before such a call runs, its worker writes a record ``running:<worker>`` with
``SET NX``; when it finishes, the record becomes the result. A second delivery of
the same call id (a worker died and the reaper took the entry over, or a Brain
resuming a turn sent it again) reads the record instead of running the tool:
- a result: that result, again;
- running on a live worker: wait for its result (up to the call's deadline);
- running on a worker that is gone: ``WORKER_LOST``, since the side effect may or
  may not have happened;
- no record: the call never started, so it runs now.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack

from bus.keys import Keys
from bus.presence import alive
from bus.protocol import ErrorCode, ToolExecute, ToolResult, now_ms
from hands.errors import ToolFailure

RUNNING = b"running:"


class CallRecords:
    def __init__(self, bus: Any, worker_id: str, *, keep_s: float) -> None:
        self.bus, self.worker_id, self.keep_ms = bus, worker_id, int(keep_s * 1000)
        self.keys: Keys = bus.keys

    async def claim(self, call: ToolExecute) -> ToolResult | ToolFailure | None:
        """None: this worker runs the call now. Otherwise the earlier run's result, or why it cannot be known."""
        key = self.keys.call_record(call.call_id)
        while True:
            if await self.bus.redis.set(key, RUNNING + self.worker_id.encode(), nx=True, px=self.keep_ms):
                return None
            record = await self.bus.redis.get(key)
            if record is None:
                continue  # expired between the two commands: try again
            if not record.startswith(RUNNING):
                return ToolResult.model_validate(msgpack.unpackb(record, raw=False))
            owner = record[len(RUNNING):].decode()
            if owner != self.worker_id and owner not in await alive(self.bus, "hands"):
                return ToolFailure(
                    ErrorCode.WORKER_LOST,
                    f"the worker running {call.tool} ({owner}) stopped before answering; the call may or may not "
                    "have taken effect, and it is not run again because it is not idempotent",
                    suggestions=["check whether it took effect before calling it again"], recoverable=True, retryable=False)
            if call.deadline <= now_ms():
                return ToolFailure(ErrorCode.TIMEOUT, f"{call.tool} is still running on {owner} (the same call, "
                                   "sent again) and the call's deadline passed", recoverable=True)
            await asyncio.sleep(0.05)  # the same call is running elsewhere: its result will be ours

    async def done(self, call: ToolExecute, result: ToolResult) -> None:
        packed = msgpack.packb(result.model_dump(mode="json", exclude_none=True), use_bin_type=True)
        await self.bus.redis.set(self.keys.call_record(call.call_id), packed, px=self.keep_ms)
