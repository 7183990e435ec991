"""A call to a tool that is not idempotent runs at most once per call id, whoever sends it again."""

from __future__ import annotations

import asyncio
from typing import Any

from bus.protocol import ErrorCode, ToolExecute, ToolResult, now_ms
from bus.replies import ReplyInbox
from bus.streams import Bus
from hands.registry import Category, ToolDefinition


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
