"""Limits across the whole pool: two workers share one tool's slots; a dead worker's slot frees itself."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from bus.protocol import ErrorCode
from bus.streams import Bus
from hands.config import HandsSettings
from hands.registry import Category, ToolDefinition
from tests.conftest import async_wait_until
from tests.integration.conftest import gated


def shared_tool(state: dict[str, Any]) -> ToolDefinition:
    """Sleeps a little, recording how many of its calls run at once across every worker."""

    async def handle(_args: dict[str, Any], ctx: Any) -> str:
        state["now"] += 1
        state["most"] = max(state["most"], state["now"])
        state["workers"].add(ctx.worker_id)
        try:
            await asyncio.sleep(0.15)
        finally:
            state["now"] -= 1
        return "ok"

    return ToolDefinition(name="scarce", description="uses a scarce licence", handler=handle,
                          category=Category.SKILL, parameters={"type": "object"})


async def _both_reading(bus: Bus) -> bool:
    """Both workers read the entrance and the skill lane (a consumer is made by its first XREADGROUP)."""
    for stream in (bus.keys.hands_requests, bus.keys.hands_lane("category:skill")):
        if not await bus.redis.exists(stream):
            return False
        names = {c["name"] for c in await bus.redis.xinfo_consumers(stream, "hands")}
        if not {b"w0", b"w1"} <= {n if isinstance(n, bytes) else n.encode() for n in names}:
            return False
    return True


async def test_two_workers_never_run_more_than_the_pool_limit(bus: Bus, engine, call) -> None:
    state: dict[str, Any] = {"now": 0, "most": 0, "workers": set()}
    for _ in range(2):  # room for 4 calls each: a burst of 8 is shared (a worker reads what it can start)
        await engine(extra_tools=[shared_tool(state)], pool_limits={"tool:scarce": 2}, concurrency={"global": 4})
    # A worker is alive (heartbeat) a moment before it reads: calls sent then all go to the other.
    await async_wait_until(lambda: _both_reading(bus), what="both workers waiting for calls")
    results = await asyncio.gather(*(call("scarce") for _ in range(8)))
    assert all(r.success for r in results)
    assert state["most"] == 2  # each worker alone would have run 4 (its global limit)
    assert len(state["workers"]) == 2  # and both workers took part


async def test_calls_past_a_pool_wide_limit_wait_in_the_pool_not_in_a_worker(bus: Bus, engine, call) -> None:
    gate = asyncio.Event()
    worker = await engine(extra_tools=[gated("scarce", gate)], pool_limits={"tool:scarce": 1},
                          concurrency={"global": 10})
    calls = [asyncio.create_task(call("scarce", timeout=60)) for _ in range(5)]
    lane = bus.keys.hands_lane("tool:scarce")  # a pool-limited tool has a lane of its own

    async def four_in_the_lane() -> bool:
        groups = await bus.redis.xinfo_groups(lane) if await bus.redis.exists(lane) else []
        return int(await bus.redis.get(f"{lane}:waiting") or 0) + (groups[0]["lag"] if groups else 0) == 4

    await async_wait_until(four_in_the_lane, what="four calls waiting in the lane")
    assert worker.consumer.in_flight == 1  # the worker holds the one that can run, not five
    assert (await call("read_file", {"path": "a.txt"})).success  # and the rest of its room is free
    gate.set()
    assert all(r.success for r in await asyncio.gather(*calls))


async def test_a_dead_workers_lapsed_slot_is_free_and_a_live_one_is_waited_for(bus: Bus, engine, call) -> None:
    state: dict[str, Any] = {"now": 0, "most": 0, "workers": set()}
    await engine(extra_tools=[shared_tool(state)], pool_limits={"tool:scarce": 1}, queue={"wait_s": 0.5})
    key = bus.keys.pool_limit("tool:scarce")
    now_ms = int(time.time() * 1000)
    await bus.redis.zadd(key, {"dead-worker-token": now_ms - 1000})  # its lease ran out
    assert (await call("scarce")).success
    await bus.redis.zadd(key, {"stuck-token": now_ms + 60_000})  # a live holder that keeps its slot
    started = time.monotonic()
    blocked = await call("scarce")
    assert blocked.error.code is ErrorCode.QUEUE_TIMEOUT and time.monotonic() - started >= 0.5
    assert "pool-wide limit 'tool:scarce' (1 at once across all workers" in blocked.error.message
    assert blocked.error.recoverable


@pytest.mark.parametrize(("limits", "expected"), [
    ({"tools:exec": 2}, "'tools:exec' is not a gate"),
    ({"tool:": 2}, "'tool:' is not a gate"),
    ({"global": 0}, "the limit must be at least 1"),
])
def test_bad_pool_limits_are_refused_with_the_fix(limits, expected) -> None:
    with pytest.raises(ValueError, match=expected):
        HandsSettings(pool_limits=limits)
