"""The pool's backlog on a real Redis: calls no worker can start wait in Redis, in lanes, sessions taking turns."""

from __future__ import annotations

import asyncio
import json

from bus.protocol import ErrorCode, ToolResult
from bus.streams import Bus
from hands.registry import Category, ToolDefinition
from tests.conftest import async_wait_until, nothing_pending
from tests.integration.conftest import gated


def napper(name: str = "nap", *, category: Category = Category.SKILL, log: list[str] | None = None) -> ToolDefinition:
    """A tool that sleeps ``s`` seconds; ``log`` records the ``tag`` of each call as it starts."""
    async def nap(args, _ctx):
        if log is not None:
            log.append(args.get("tag", ""))
        await asyncio.sleep(args["s"])
        return "rested"

    return ToolDefinition(
        name=name,
        description="sleeps",
        handler=nap,
        category=category,
        parameters={"type": "object", "properties": {"s": {"type": "number"}, "tag": {"type": "string"}}},
    )


async def lane_holds(bus: Bus, lane: str) -> int:
    """Calls a lane holds: unread in its stream plus waiting in the sessions' queues."""
    stream = bus.keys.hands_lane(lane)
    groups = await bus.redis.xinfo_groups(stream) if await bus.redis.exists(stream) else []
    return int(await bus.redis.get(f"{stream}:waiting") or 0) + (groups[0]["lag"] if groups else 0)


async def test_a_session_with_many_calls_queued_does_not_starve_another(bus: Bus, engine, call) -> None:
    started: list[str] = []
    await engine(extra_tools=[napper(log=started)], concurrency={"global": 1})
    burst = [
        asyncio.create_task(call("nap", {"s": 0.02, "tag": "a"}, session="greedy", timeout=60)) for _ in range(200)
    ]
    await async_wait_until(lambda: len(started) >= 1, what="the burst running")
    await async_wait_until(lambda: _at_least(lane_holds(bus, "category:skill"), 150), what="the burst queued")
    single = await call("nap", {"s": 0.02, "tag": "b"}, session="polite", timeout=60)
    assert single.success
    # Its turn came after at most a couple of the greedy session's calls, not after all 200.
    ahead = started.index("b") - started.index("a")
    assert started.count("a") < 200 and ahead < 10, (ahead, len(started))
    assert all(r.success for r in await asyncio.gather(*burst))


async def _at_least(value, n: int) -> bool:
    return await value >= n


async def test_a_full_lane_never_holds_up_another(bus: Bus, engine, call) -> None:
    gate = asyncio.Event()
    await engine(extra_tools=[gated("slow_code", gate, category=Category.CODE)], concurrency={"global": 10, "code": 2})
    slow = [asyncio.create_task(call("slow_code", timeout=60)) for _ in range(40)]
    await async_wait_until(lambda: _at_least(lane_holds(bus, "category:code"), 38), what="38 code calls queued")
    reads = [await call("read_file", {"path": "a.txt"}) for _ in range(5)]  # another lane: starts at once
    assert all(r.success for r in reads)
    assert not any(t.done() for t in slow)
    gate.set()
    assert all(r.success for r in await asyncio.gather(*slow))


async def test_the_backlog_goes_to_whichever_worker_has_room(bus: Bus, engine, call) -> None:
    first = await engine(extra_tools=[napper()], concurrency={"global": 2})
    calls = [asyncio.create_task(call("nap", {"s": 0.3}, session=f"s{i % 3}", timeout=60)) for i in range(40)]
    await async_wait_until(lambda: _at_least(lane_holds(bus, "category:skill"), 30), what="the backlog")
    second = await engine(extra_tools=[napper()], concurrency={"global": 4})  # joins later: takes from Redis
    results: list[ToolResult] = await asyncio.gather(*calls)
    assert all(r.success for r in results)
    by_worker = {w: sum(r.metadata.worker_id == w for r in results) for w in (first.worker_id, second.worker_id)}
    assert by_worker[second.worker_id] > by_worker[first.worker_id], by_worker  # it had twice the room
    assert await lane_holds(bus, "category:skill") == 0
    for stream in (bus.keys.hands_requests, bus.keys.hands_lane("category:skill")):
        await nothing_pending(bus, stream, "hands")


async def test_a_pool_depth_bounds_every_lane_for_the_whole_pool(bus: Bus, engine, call) -> None:
    gate = asyncio.Event()
    await engine(extra_tools=[gated("slow", gate)], concurrency={"global": 1}, queue={"pool_depth": 5})
    calls = [asyncio.create_task(call("slow", timeout=60)) for _ in range(20)]

    async def settled() -> bool:  # every call answered, running, or waiting in the lane
        return sum(t.done() for t in calls) + 1 + await lane_holds(bus, "category:skill") == 20

    await async_wait_until(settled, what="the burst settled")
    refused = [t.result() for t in calls if t.done()]
    # The bound is 5; a call a lane loop read with room that was taken meanwhile goes back in too.
    assert 13 <= len(refused) <= 14 and 5 <= await lane_holds(bus, "category:skill") <= 6
    assert {r.error.code for r in refused} == {ErrorCode.QUEUE_FULL}
    assert "its bound (hands.queue.pool_depth)" in refused[0].error.message and refused[0].error.recoverable
    gate.set()
    assert sum(r.success for r in await asyncio.gather(*calls)) == 20 - len(refused)


async def test_the_heartbeat_shows_the_backlog_per_lane_and_its_oldest_age(bus: Bus, engine, call) -> None:
    gate = asyncio.Event()
    worker = await engine(extra_tools=[gated("slow", gate)], concurrency={"global": 1})
    calls = [asyncio.create_task(call("slow", timeout=60, session=f"s{i}")) for i in range(8)]

    async def shown() -> dict | None:
        backlog = json.loads((await bus.redis.hget(bus.keys.instance("hands", worker.worker_id), "backlog")) or "{}")
        lane = backlog.get("category:skill")
        return lane if lane and lane["ready"] + lane["waiting"] == 7 and lane["oldest_s"] >= 0.5 else None

    lane = await async_wait_until(shown, what="the backlog in the heartbeat")
    assert lane["ready"] == 1 and lane["waiting"] == 6  # one ready to start (the pool's room), six behind it
    gate.set()
    assert all(r.success for r in await asyncio.gather(*calls))
