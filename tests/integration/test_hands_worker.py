"""A Hands worker on a real Redis: tools:list, tool:execute, errors, garbage, and a shared pool."""

from __future__ import annotations

import asyncio

import msgpack
import pytest

from bus.keys import HANDS_GROUP
from bus.protocol import (
    ErrorCode,
    ToolsAvailable,
    ToolsList,
)
from bus.streams import Bus
from hands.registry import Category, ToolDefinition
from tests.conftest import TOOL_NAMES, async_wait_until, nothing_pending


async def test_tools_list_answers_with_specs_and_digest(bus: Bus, engine, call) -> None:
    await engine()
    request = ToolsList(reply_to=call.inbox.stream)
    reply = await call.inbox.request(bus.keys.hands_requests, request, request.request_id, timeout=5)
    assert isinstance(reply, ToolsAvailable)
    assert [t.name for t in reply.tools] == TOOL_NAMES
    assert [(s.name, s.location.endswith("skills/tidy-notes/SKILL.md")) for s in reply.skills] == [("tidy-notes", True)]
    assert reply.digest and (await bus.redis.get(bus.keys.tools_digest)).decode() == reply.digest


async def test_execute_and_every_error_path(bus: Bus, engine, call) -> None:
    await engine()
    ok = await call("read_file", {"path": "a.txt"})
    assert ok.success and ok.data["content"] == "alpha" and ok.metadata.worker_id == "w0"
    missing = await call("read_file", {"path": "b.txt"})
    assert missing.error.code is ErrorCode.FILE_NOT_FOUND
    unknown = await call("rm_rf", {})
    assert unknown.error.code is ErrorCode.TOOL_NOT_FOUND and "read_file" in unknown.error.message
    invalid = await call("write_file", {"path": "x"})
    assert (
        invalid.error.code is ErrorCode.INVALID_ARGUMENTS
        and "'content' is a required property" in invalid.error.message
    )
    await nothing_pending(bus, bus.keys.hands_requests, HANDS_GROUP)


async def test_garbage_on_the_request_stream_goes_to_dead_and_work_continues(bus: Bus, engine, call) -> None:
    await engine()
    await bus.redis.xadd(bus.keys.hands_requests, {b"type": b"tool:execute", b"data": msgpack.packb([1, 2, 3])})
    await bus.redis.xadd(bus.keys.hands_requests, {b"junk": b"\x00" * 100})
    ok = await call("read_file", {"path": "a.txt"})
    assert ok.success
    await async_wait_until(lambda: bus.redis.xlen(bus.keys.dead), what="dead letters")
    dead = await bus.redis.xrange(bus.keys.dead)
    assert len(dead) == 2 and b"must be a map" in dead[0][1][b"dead:reason"]


async def test_several_workers_share_the_work(engine, call) -> None:
    async def nap(args, _ctx):
        await asyncio.sleep(args["s"])
        return "rested"

    sleep = ToolDefinition(name="nap", description="sleep", handler=nap, category=Category.SKILL,
                           parameters={"type": "object", "properties": {"s": {"type": "number"}}})
    await engine(extra_tools=[sleep])
    await engine(extra_tools=[sleep])
    results = await asyncio.gather(*(call("nap", {"s": 0.05}) for _ in range(30)))
    assert all(r.success and r.data == "rested" for r in results)
    assert {r.metadata.worker_id for r in results} == {"w0", "w1"}
    assert len({r.call_id for r in results}) == 30


async def test_a_call_nobody_answers_times_out_at_the_caller(call) -> None:
    with pytest.raises(TimeoutError):
        await call("read_file", {"path": "a.txt"}, timeout=0.3)


async def test_a_close_that_fails_leaves_no_other_service_open(bus: Bus, tmp_path) -> None:
    """Services close in reverse order of their start whatever fails: a failing close is reported, and the
    worker still leaves the pool (its presence gone) with its inbox closed."""
    from bus.presence import alive
    from hands.config import HandsSettings
    from hands.worker import HandsWorker

    (tmp_path / "ws").mkdir()
    worker = HandsWorker(bus, HandsSettings.model_validate({"workspace": tmp_path / "ws"}), worker_id="w-closing",
                         heartbeat_s=0.5)

    async def broken() -> None:
        raise RuntimeError("the reaper failed to close")

    worker.reaper.close = broken  # type: ignore[method-assign]
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    await async_wait_until(lambda: _present(bus, "w-closing"), what="the worker in the pool")
    stop.set()
    with pytest.raises(RuntimeError, match="reaper failed"):
        await running
    assert "w-closing" not in await alive(bus, "hands")  # presence stopped after the failing close
    assert worker.inbox._task is None or worker.inbox._task.done()  # the reply reader ended


async def _present(bus: Bus, worker_id: str) -> bool:
    from bus.presence import alive

    return worker_id in await alive(bus, "hands")
