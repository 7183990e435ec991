"""A call to a tool that is not idempotent runs at most once per call id, whoever sends it again."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import msgpack

from bus.protocol import ErrorCode, ResultMetadata, ToolExecute, ToolResult, now_ms
from bus.redis_client import RedisAway
from bus.replies import ReplyInbox
from bus.streams import Bus
from hands.call_records import CallRecords
from hands.registry import Category, ToolDefinition
from tests.conftest import async_wait_until


def once_tool(runs: list[int], delay: float = 0.0) -> ToolDefinition:
    async def handle(args: dict[str, Any], _ctx: Any) -> str:
        runs.append(args["n"])
        await asyncio.sleep(delay)
        return f"ran {len(runs)}"

    return ToolDefinition(name="once", description="a side effect", handler=handle, category=Category.SKILL,
                          idempotent=False, parameters={"type": "object", "properties": {"n": {"type": "integer"}}})


async def send(bus: Bus, call, call_id: str, *, n: int = 1, inbox: ReplyInbox | None = None) -> ToolResult:
    inbox = inbox or call.inbox
    request = ToolExecute(call_id=call_id, tool="once", args={"n": n}, reply_to=inbox.stream,
                          deadline=now_ms() + 20_000)
    return await inbox.request(bus.keys.hands_requests, request, call_id, timeout=20, final=(ToolResult,))


async def test_the_same_call_sent_again_gets_the_first_result(bus: Bus, engine, call) -> None:
    runs: list[int] = []
    await engine(extra_tools=[once_tool(runs)])
    first = await send(bus, call, "same-call")
    again = await send(bus, call, "same-call")
    assert first.success and again.success and again.data == first.data == "ran 1"
    assert runs == [1]
    other = await send(bus, call, "another-call")
    assert other.data == "ran 2"  # a new call id is a new call


async def test_a_duplicate_sent_while_the_first_runs_waits_for_its_result(bus: Bus, engine, call) -> None:
    runs: list[int] = []
    await engine(extra_tools=[once_tool(runs, delay=0.5)])
    other_brain = ReplyInbox(bus, "another-brain", block_ms=100)  # e.g. a Brain resuming the turn
    await other_brain.start()
    try:
        first, second = await asyncio.gather(send(bus, call, "dup"), send(bus, call, "dup", inbox=other_brain))
    finally:
        await other_brain.close()
    assert runs == [1] and first.data == second.data == "ran 1"


async def test_a_call_whose_worker_died_mid_run_is_not_run_again(bus: Bus, engine, call) -> None:
    runs: list[int] = []
    await engine(extra_tools=[once_tool(runs)])
    # A worker that is no longer alive had started it.
    await bus.redis.set(bus.keys.call_record("orphan"), b"running:gone-worker", px=60_000)
    result = await send(bus, call, "orphan")
    assert not result.success and result.error.code is ErrorCode.WORKER_LOST
    assert result.error.recoverable and "gone-worker" in result.error.message
    assert runs == []


async def test_this_workers_own_claim_on_a_call_it_is_not_running_runs_the_call(bus: Bus, engine, call) -> None:
    # As when Redis went away after taking the worker's claim but before answering it: the call never started.
    runs: list[int] = []
    worker = await engine(extra_tools=[once_tool(runs)])
    await bus.redis.set(bus.keys.call_record("cut-off"), f"running:{worker.worker_id}#0a1b2c3d".encode(), px=60_000)
    result = await send(bus, call, "cut-off")
    assert result.success and runs == [1]  # at once, not after waiting for its own claim until the deadline
    record = await bus.redis.get(bus.keys.call_record("cut-off"))
    assert not record.startswith(b"running:")


class Flaky:
    """A Redis client whose ``set`` fails with a lost connection ``failures`` times (after applying it, if
    ``applied``: the answer is what is lost), then works."""

    def __init__(self, redis: Any, failures: int, *, applied: bool) -> None:
        self.redis, self.failures, self.applied = redis, failures, applied

    def __getattr__(self, name: str) -> Any:
        return getattr(self.redis, name)

    async def set(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures:
            self.failures -= 1
            if self.applied:
                await self.redis.set(*args, **kwargs)
            raise RedisAway("Connection closed by server.")  # as the bus's connections say it
        return await self.redis.set(*args, **kwargs)


def _call(call_id: str) -> ToolExecute:
    return ToolExecute(call_id=call_id, tool="once", args={}, reply_to="r", deadline=now_ms() + 20_000)


async def test_a_claim_whose_answer_was_lost_is_dropped_once_redis_answers(bus: Bus) -> None:
    records = CallRecords(SimpleNamespace(redis=Flaky(bus.redis, 1, applied=True), keys=bus.keys), "w-lost",
                          keep_s=60)
    try:
        await records.claim(_call("lost-answer"))
        raise AssertionError("the claim's lost answer was not raised")
    except RedisAway:
        pass
    key = bus.keys.call_record("lost-answer")
    await async_wait_until(lambda: _gone(bus, key), what="the claim dropped")
    # Another worker now runs the call instead of waiting for a claim nobody acts on.
    assert await CallRecords(bus, "w-other", keep_s=60).claim(_call("lost-answer")) is None
    await records.close()


async def _gone(bus: Bus, key: str) -> bool:
    return not await bus.redis.exists(key)


async def test_a_result_redis_did_not_take_is_kept_and_written_when_it_answers(bus: Bus) -> None:
    records = CallRecords(SimpleNamespace(redis=Flaky(bus.redis, 0, applied=False), keys=bus.keys), "w-kept",
                          keep_s=60)
    assert await records.claim(_call("kept")) is None  # the claim itself goes through (failures start after)
    records.bus.redis.failures = 3
    result = ToolResult(call_id="kept", success=True, data="ran once", metadata=ResultMetadata(tool_name="once"))
    await records.done(_call("kept"), result)  # Redis away: kept here, the answer goes on
    assert await records.claim(_call("kept")) == result  # a second delivery here gets it, not a second run
    key = bus.keys.call_record("kept")
    await async_wait_until(lambda: _is_result(bus, key), what="the record written once Redis answered")
    assert msgpack.unpackb(await bus.redis.get(key), raw=False)["data"] == "ran once"
    assert await CallRecords(bus, "w-other", keep_s=60).claim(_call("kept")) == result
    await records.close()


async def _is_result(bus: Bus, key: str) -> bool:
    record = await bus.redis.get(key)
    return record is not None and not record.startswith(b"running:")


class HeldResult:
    """A Redis client whose ``set`` of a result (not a claim) waits until ``let_go`` is set, and which counts
    the reads of a record."""

    def __init__(self, redis: Any) -> None:
        self.redis, self.let_go, self.holding, self.reads = redis, asyncio.Event(), asyncio.Event(), 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.redis, name)

    async def set(self, key: str, value: bytes, **kwargs: Any) -> Any:
        if not value.startswith(b"running:"):
            self.holding.set()
            await self.let_go.wait()
        return await self.redis.set(key, value, **kwargs)

    async def get(self, key: str) -> Any:
        self.reads += 1
        return await self.redis.get(key)


async def test_a_delivery_waiting_on_a_run_here_gets_its_result_while_the_record_is_written(bus: Bus) -> None:
    running = {"between"}
    redis = HeldResult(bus.redis)
    records = CallRecords(SimpleNamespace(redis=redis, keys=bus.keys), "w-here", keep_s=60,
                          running_here=lambda call_id: call_id in running)
    assert await records.claim(_call("between")) is None  # the first delivery runs it
    second = asyncio.ensure_future(records.claim(_call("between")))  # the same call again: waits for that run
    await async_wait_until(lambda: _read(redis), timeout=10, what="the second delivery waiting on the run")
    result = ToolResult(call_id="between", success=True, data="ran once", metadata=ResultMetadata(tool_name="once"))
    running.discard("between")  # the run ends, and its record is on its way (held) while the second looks again
    written = asyncio.ensure_future(records.done(_call("between"), result))
    await redis.holding.wait()
    assert await asyncio.wait_for(second, 10) == result  # not None: that would be a second run of the call
    redis.let_go.set()
    await written
    assert msgpack.unpackb(await bus.redis.get(bus.keys.call_record("between")), raw=False)["data"] == "ran once"
    await records.close()


async def _read(redis: HeldResult) -> bool:
    return redis.reads > 0
