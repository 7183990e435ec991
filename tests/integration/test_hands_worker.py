"""A Hands worker on a real Redis: tools:list, tool:execute, errors, garbage, and a shared pool."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import pytest

from bus.keys import HANDS_GROUP
from bus.presence import alive
from bus.protocol import ErrorCode, ToolExecute, ToolResult, ToolsAvailable, ToolsList, now_ms
from bus.streams import Bus, ReplyInbox
from hands.config import HandsSettings
from hands.registry import Category, ToolDefinition
from hands.worker import HandsWorker
from tests.conftest import SHIPPED_SKILLS, TOOL_NAMES, async_wait_until


@pytest.fixture
async def workers(bus: Bus, tmp_path: Path):
    """Factory: start N in-process workers; all are stopped at teardown."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("alpha")
    running: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    async def start(n: int = 1, *, extra_tools: list[ToolDefinition] = ()) -> list[HandsWorker]:
        started = []
        for i in range(n):
            worker = HandsWorker(bus, HandsSettings(workspace=tmp_path / "ws", skill_dirs=[SHIPPED_SKILLS]),
                                 worker_id=f"w{len(running)}",
                                 heartbeat_s=0.5)
            for tool in extra_tools:
                worker.registry.register(tool)
            stop = asyncio.Event()
            running.append((stop, asyncio.create_task(worker.run(stop))))
            started.append(worker)
        await async_wait_until(lambda: _count_alive(bus, len(running)), what="workers alive")
        return started

    yield start
    for stop, _ in running:
        stop.set()
    await asyncio.gather(*(task for _, task in running))


async def _count_alive(bus: Bus, n: int) -> bool:
    return len(await alive(bus, "hands")) == n


@pytest.fixture
async def inbox(bus: Bus):
    box = ReplyInbox(bus, "brain-test", block_ms=100)
    await box.start()
    yield box
    await box.close()


async def execute(bus: Bus, inbox: ReplyInbox, tool: str, args: dict, *, timeout: float = 10) -> ToolResult:
    call = ToolExecute(tool=tool, args=args, session_id="s", reply_to=inbox.stream, deadline=now_ms() + 10_000)
    return await inbox.request(bus.keys.hands_requests, call, call.call_id, timeout=timeout)


async def test_tools_list_answers_with_specs_and_digest(bus: Bus, inbox: ReplyInbox, workers) -> None:
    await workers(1)
    request = ToolsList(reply_to=inbox.stream)
    reply = await inbox.request(bus.keys.hands_requests, request, request.request_id, timeout=5)
    assert isinstance(reply, ToolsAvailable)
    assert [t.name for t in reply.tools] == TOOL_NAMES
    assert [(s.name, s.location.endswith("skills/tidy-notes/SKILL.md")) for s in reply.skills] == [("tidy-notes", True)]
    assert reply.digest and (await bus.redis.get(bus.keys.tools_digest)).decode() == reply.digest


async def test_execute_and_every_error_path(bus: Bus, inbox: ReplyInbox, workers) -> None:
    await workers(1)
    ok = await execute(bus, inbox, "read_file", {"path": "a.txt"})
    assert ok.success and ok.data["content"] == "alpha" and ok.metadata.worker_id == "w0"
    missing = await execute(bus, inbox, "read_file", {"path": "b.txt"})
    assert missing.error.code is ErrorCode.FILE_NOT_FOUND
    unknown = await execute(bus, inbox, "rm_rf", {})
    assert unknown.error.code is ErrorCode.TOOL_NOT_FOUND and "read_file" in unknown.error.message
    invalid = await execute(bus, inbox, "write_file", {"path": "x"})
    assert invalid.error.code is ErrorCode.INVALID_ARGUMENTS and "'content' is a required property" in invalid.error.message
    pending = await bus.redis.xpending(bus.keys.hands_requests, HANDS_GROUP)
    assert pending["pending"] == 0


async def test_garbage_on_the_request_stream_goes_to_dead_and_work_continues(bus: Bus, inbox: ReplyInbox, workers) -> None:
    await workers(1)
    await bus.redis.xadd(bus.keys.hands_requests, {b"type": b"tool:execute", b"data": msgpack.packb([1, 2, 3])})
    await bus.redis.xadd(bus.keys.hands_requests, {b"junk": b"\x00" * 100})
    ok = await execute(bus, inbox, "read_file", {"path": "a.txt"})
    assert ok.success
    await async_wait_until(lambda: bus.redis.xlen(bus.keys.dead), what="dead letters")
    dead = await bus.redis.xrange(bus.keys.dead)
    assert len(dead) == 2 and b"must be a map" in dead[0][1][b"dead:reason"]


async def test_several_workers_share_the_work(bus: Bus, inbox: ReplyInbox, workers) -> None:
    async def nap(args, _ctx):
        await asyncio.sleep(args["s"])
        return "rested"

    sleep = ToolDefinition(name="nap", description="sleep", handler=nap, category=Category.SKILL,
                           parameters={"type": "object", "properties": {"s": {"type": "number"}}})
    await workers(2, extra_tools=[sleep])
    results = await asyncio.gather(*(execute(bus, inbox, "nap", {"s": 0.05}) for _ in range(30)))
    assert all(r.success and r.data == "rested" for r in results)
    assert {r.metadata.worker_id for r in results} == {"w0", "w1"}
    assert len({r.call_id for r in results}) == 30


async def test_a_call_nobody_answers_times_out_at_the_caller(bus: Bus, inbox: ReplyInbox) -> None:
    with pytest.raises(TimeoutError):
        await execute(bus, inbox, "read_file", {"path": "a.txt"}, timeout=0.3)
