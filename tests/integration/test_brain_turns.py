"""Brain turns on a real Redis with a real Hands worker and a fake LLM behind the seam."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from brain.llm import Completion, LLMError
from bus.presence import alive
from bus.protocol import (
    ChatError,
    ChatMessage,
    ChatReply,
    ChatTool,
    ErrorCode,
)
from bus.replies import ReplyInbox
from bus.streams import Bus
from hands.registry import Category, ToolDefinition
from memory.longterm import LongTermMemory
from memory.sessions import SessionStore, TranscriptEntry
from tests.conftest import TOOL_NAMES, async_wait_until
from tests.integration.brain_fakes import Endless, FakeLLM, call, read_then_answer


async def test_tool_turn_is_answered_and_the_transcript_kept(bus: Bus, pool, chat) -> None:
    llm = FakeLLM(read_then_answer)
    await pool(llm)
    events = await chat("what is in a.txt?", sender="owner")  # the owner's turn: the agent's own workspace
    assert isinstance(events[-1], ChatReply) and "alpha" in events[-1].text
    tool_events = [e for e in events if isinstance(e, ChatTool)]
    assert [e.status for e in tool_events] == ["started", "finished"] and tool_events[1].summary == "ok"
    transcript = await SessionStore(bus.redis, bus.keys).load("s1")
    assert [e.role for e in transcript] == ["user", "assistant", "tool", "assistant"]
    assert transcript[1].tool_calls[0]["function"]["name"] == "read_file"
    assert transcript[2].metadata["worker_id"] == "hands-t" and "alpha" in transcript[2].content

    await chat("and again?")
    second = llm.seen[-2]  # the first model call of the second turn sees the whole first turn
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "assistant", "user"]


async def test_every_turn_is_handed_the_same_tool_list_object_in_name_order(bus: Bus, pool, chat) -> None:
    from brain.testing import FunctionModel

    handed: list[list[Any]] = []

    def script(_messages: list[dict[str, Any]], tools: list[Any]) -> Completion:
        handed.append(tools)
        return Completion(text="ok")

    await pool(FunctionModel(script))
    await chat("one")
    await chat("two", session_id="s2")
    assert [t.name for t in handed[0]] == sorted(t.name for t in handed[0])
    # The same object: what is made of a list once (its wire form, its JSON) is made once, not per turn.
    assert handed[1] is handed[0]


async def test_invented_tools_and_bad_json_are_answered_without_hands(bus: Bus, pool, chat) -> None:
    def script(messages):
        if messages[-1]["role"] == "tool":
            return Completion(text=" | ".join(m["content"] for m in messages if m["role"] == "tool"))
        deep: Any = "x"
        for _ in range(200):  # far past any tool, and past what the wire carries: it must not crash the turn
            deep = {"a": deep}
        return Completion(tool_calls=[call("teleport", {}, 0), call("read_file", "{not json", 1),
                                      call("read_file", [1, 2], 2), call("read_file", {"path": deep}, 3),
                                      call("read_file", "[" * 100_000 + "]" * 100_000, 4)])

    await pool(FakeLLM(script))
    reply = (await chat("go"))[-1]
    assert isinstance(reply, ChatReply), reply
    assert "TOOL_NOT_FOUND" in reply.text and "no tool named 'teleport'" in reply.text
    assert ", ".join(TOOL_NAMES) in reply.text
    assert reply.text.count("INVALID_ARGUMENTS") == 4 and "nest deeper than 32 levels" in reply.text
    sent = await bus.redis.xrange(bus.keys.hands_requests)
    assert all(fields[b"type"] == b"tools:list" for _, fields in sent)  # none of them reached Hands


async def test_no_hands_worker_ends_with_a_clear_error(pool, chat) -> None:
    await pool(FakeLLM(read_then_answer), hands=False)
    final = (await chat("hello"))[-1]
    assert isinstance(final, ChatError) and final.code is ErrorCode.SERVICE_UNAVAILABLE
    assert "no Hands worker answered" in final.message and "pincer hands" in final.message


async def test_tool_call_that_no_worker_answers_times_out(bus: Bus, pool, chat) -> None:
    stops = await pool(FakeLLM(read_then_answer), tool_deadline_s=1.0)
    assert isinstance((await chat("read it"))[-1], ChatReply)  # the Brain now has the tool list cached
    stops["HandsWorker"].set()
    await async_wait_until(lambda: _no_hands(bus), what="the Hands worker gone")
    final = (await chat("read it again"))[-1]
    assert isinstance(final, ChatReply)  # the model learned what happened and answered
    assert "TIMEOUT" in final.text and "no Hands worker answered within 1s" in final.text


async def _no_hands(bus: Bus) -> bool:
    return not await alive(bus, "hands")


async def test_no_model_and_model_errors_become_chat_errors(pool, chat) -> None:
    await pool(None)
    final = (await chat("hi"))[-1]
    assert final.code is ErrorCode.MODEL_NOT_CONFIGURED and "PINCER_MODEL" in final.message


async def test_llm_failure_is_reported(pool, chat) -> None:
    def broken(_messages):
        raise LLMError(ErrorCode.RATE_LIMITED, "slow down")

    await pool(FakeLLM(broken))
    final = (await chat("hi"))[-1]
    assert final.code is ErrorCode.RATE_LIMITED and final.message == "slow down"


async def test_tool_list_is_cached_until_hands_announces_a_new_digest(bus: Bus, pool) -> None:
    from brain.catalog import ToolCatalog

    await pool(FakeLLM(read_then_answer))  # starts a Hands worker (and a Brain we do not use here)
    await async_wait_until(lambda: alive(bus, "hands"), what="the Hands worker announced")
    inbox = ReplyInbox(bus, "catalog-t", block_ms=100)
    await inbox.start()
    try:
        catalog = ToolCatalog(bus, inbox, timeout_s=5)

        async def list_requests() -> int:
            entries = await bus.redis.xrange(bus.keys.hands_requests)
            return sum(1 for _, f in entries if f[b"type"] == b"tools:list" and inbox.stream.encode() in f[b"data"])

        first = await catalog.tools()
        assert [t.name for t in first] == TOOL_NAMES
        assert [s.name for s in (await catalog.lookup())[1]] == ["tidy-notes"]
        assert await catalog.tools() is first and await list_requests() == 1  # cached: no second request
        await bus.redis.set(bus.keys.tools_digest, "changed")
        assert [t.name for t in await catalog.tools()] == [t.name for t in first]
        assert await list_requests() == 2  # the digest moved, so the list was asked for again
        await catalog.tools()
        assert await list_requests() == 2  # and is cached again under the new digest
        await bus.redis.set(bus.keys.tools_digest, "changed again")
        await asyncio.gather(*(catalog.tools() for _ in range(20)))
        assert await list_requests() == 3  # lookups at once (turns starting together) share one request
        reads, get = [], bus.redis.get

        async def counted(key: str) -> object:
            reads.append(key)
            return await get(key)

        bus.redis.get = counted  # type: ignore[method-assign]
        try:
            await bus.redis.set(bus.keys.tools_digest, "changed a third time")
            await asyncio.gather(*(catalog.tools() for _ in range(20)))
        finally:
            bus.redis.get = get  # type: ignore[method-assign]
        assert reads == [bus.keys.tools_digest]  # ... and one read of the digest
        assert await list_requests() == 4  # which they all saw move
    finally:
        await inbox.close()


async def test_tool_progress_reaches_the_person_as_chat_tool_events(pool, chat) -> None:
    async def slow_fetch(_args, ctx):
        await ctx.progress("downloaded 3 of 4 parts")
        await asyncio.sleep(0.3)
        return "page"

    tool = ToolDefinition(name="slow_fetch", description="", parameters={"type": "object"}, handler=slow_fetch,
                          category=Category.NETWORK)

    def script(messages):
        if messages[-1]["role"] == "tool":
            return Completion(text=f"got {messages[-1]['content']}")
        return Completion(tool_calls=[call("slow_fetch", {})])

    await pool(FakeLLM(script), tools=[tool])
    events = await chat("fetch it")
    assert events[-1].text == "got page"
    statuses = [(e.status, e.summary) for e in events if isinstance(e, ChatTool)]
    assert statuses[0][0] == "started" and statuses[-1] == ("finished", "ok")
    progress = [summary for status, summary in statuses if status == "progress"]
    assert "slow_fetch started" in progress and "downloaded 3 of 4 parts" in progress
    assert "slow_fetch running" in progress


async def test_cancel_stops_the_turn_and_its_tool_calls(bus: Bus, pool, chat) -> None:
    from bus.protocol import ChatCancel

    forever = Endless("forever")
    await pool(forever.llm, tools=[forever.tool])
    turn = asyncio.create_task(chat("run forever", session_id="stop-me"))
    await asyncio.wait_for(forever.started.wait(), 10)
    await bus.publish(bus.keys.brain_inbox, ChatCancel(session_id="stop-me", by="tester"))  # DESIGN's path
    events = await asyncio.wait_for(turn, 10)
    final = events[-1]
    assert isinstance(final, ChatError) and final.code is ErrorCode.CANCELLED
    assert "cancelled by tester" in final.message and "1 tool call(s) stopped" in final.message
    await asyncio.wait_for(forever.stopped.wait(), 10)  # the call itself was stopped in Hands
    entries = await SessionStore(bus.redis, bus.keys).load("stop-me")
    assert [e.role for e in entries] == ["user", "assistant", "tool", "assistant"]
    assert "CANCELLED" in entries[2].content and entries[3].metadata["stopped"] == "CANCELLED"


def stamped(name: str, after: tuple[str, ...] = ()) -> ToolDefinition:
    """A tool that sleeps, and reports when it ran and what results it was given."""

    async def handle(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
        start = time.monotonic()
        await asyncio.sleep(args.get("s", 0.3))
        return {"start": start, "end": time.monotonic(), "saw": [p.tool for p in ctx.call.prior]}

    return ToolDefinition(name=name, description=name, handler=handle, category=Category.SKILL, after=after,
                          parameters={"type": "object", "properties": {"s": {"type": "number"}}})


def ran(messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m["name"]: json.loads(m["content"]) for m in messages if m["role"] == "tool"}


async def test_dependent_calls_run_in_order_and_independent_ones_overlap(pool, chat) -> None:
    def script(messages):
        if messages[-1]["role"] == "tool":
            return Completion(text="done")
        # The dependent call comes first in the response; it still runs second.
        return Completion(tool_calls=[call("fetch_like", {}, 0), call("search_like", {}, 1),
                                      call("other_a", {}, 2), call("other_b", {}, 3)])

    llm = FakeLLM(script)
    await pool(llm, tools=[stamped("search_like"), stamped("fetch_like", after=("search_like",)),
                           stamped("other_a"), stamped("other_b")])
    assert isinstance((await chat("go"))[-1], ChatReply)
    times = ran(llm.seen[-1])
    assert times["fetch_like"]["start"] >= times["search_like"]["end"]  # sequential
    assert times["fetch_like"]["saw"] == ["search_like"]  # and it was given the search's result
    assert times["other_a"]["start"] < times["other_b"]["end"] and times["other_b"]["start"] < times["other_a"]["end"]
    assert times["other_a"]["start"] < times["search_like"]["end"]  # independent calls did not wait
    assert times["other_a"]["saw"] == []


async def test_a_turn_redelivered_after_its_brain_died_does_not_repeat_answered_calls(
        bus: Bus, pool, chat) -> None:
    runs: list[str] = []

    async def count(args: dict[str, Any], _ctx: Any) -> str:
        runs.append(args["name"])
        return f"counted {args['name']}"

    counter = ToolDefinition(name="count", description="count", handler=count, category=Category.SKILL,
                             parameters={"type": "object", "properties": {"name": {"type": "string"}}})

    def script(messages):
        if messages[-1]["role"] == "tool":
            return Completion(text=" | ".join(m["content"] for m in messages if m["role"] == "tool"), model="fake")
        return Completion(tool_calls=[call("count", {"name": "a"}, 0), call("count", {"name": "b"}, 1)])

    # What a Brain that died left: the user message, the model's two calls, and one answer.
    sessions = SessionStore(bus.redis, bus.keys)
    message = ChatMessage(session_id="resume", text="count twice", reply_to="unused")
    tagged = {"message_id": message.message_id}
    calls_made = [call("count", {"name": "a"}, 0).to_openai(), call("count", {"name": "b"}, 1).to_openai()]
    await sessions.append("resume", TranscriptEntry(role="user", content="count twice", metadata=tagged),
                          TranscriptEntry(role="assistant", tool_calls=calls_made, metadata={**tagged, "iteration": 1}),
                          TranscriptEntry(role="tool", tool_call_id="call_0", name="count", content="counted a",
                                          metadata=tagged))
    llm = FakeLLM(script)
    await pool(llm, tools=[counter])
    final = (await chat("count twice", session_id="resume", message_id=message.message_id))[-1]
    assert isinstance(final, ChatReply) and final.text == "counted a | counted b"
    assert runs == ["b"]  # the answered call was not run again
    assert len(llm.seen) == 1  # and the model was not asked for the calls again
    roles = [e.role for e in await sessions.load("resume")]
    assert roles == ["user", "assistant", "tool", "tool", "assistant"]

    again = (await chat("count twice", session_id="resume", message_id=message.message_id))[-1]
    assert again.text == final.text and len(llm.seen) == 1 and runs == ["b"]  # a finished turn is answered as is


async def test_the_model_reads_big_results_cut_and_its_memory_in_the_prompt(bus: Bus, pool, chat) -> None:
    memory = LongTermMemory(bus.redis, bus.keys)
    await memory.write("main", "favourite-colour", "The user likes green.\nAnd more.", owner="user")
    await memory.write("main", "house", "Dinner is at seven.", owner="")
    await memory.write("main", "secret", "Someone else's note.", owner="stranger")

    async def big(_args: dict[str, Any], _ctx: Any) -> str:
        return "HEAD" + "x" * 40_000 + "TAIL"

    llm = FakeLLM(lambda m: Completion(text="ok") if m[-1]["role"] == "tool"
                  else Completion(tool_calls=[call("big", {})]))
    await pool(llm, tool_result_max_tokens=500,
               tools=[ToolDefinition(name="big", description="big", handler=big, category=Category.SKILL,
                                     parameters={"type": "object"})])
    assert isinstance((await chat("go"))[-1], ChatReply)
    assert "favourite-colour" not in llm.seen[0][0]["content"]  # the instructions, the same whatever memory holds
    system = llm.seen[0][1]["content"]  # memory in a system message after them
    assert "long-term memory" in system and "- favourite-colour: The user likes green.…" in system
    assert "- house (shared): Dinner is at seven." in system and "Someone else" not in system
    shown = llm.seen[-1][-1]["content"]
    assert shown.startswith("HEAD") and shown.endswith("TAIL") and "characters cut from the middle" in shown
    assert len(shown) < 2_500
    stored = (await SessionStore(bus.redis, bus.keys).load("s1"))[2].content
    assert len(stored) > 40_000  # the transcript keeps the whole result


async def test_a_brain_whose_close_fails_still_leaves_the_pool(bus: Bus) -> None:
    from brain.config import BrainSettings
    from brain.worker import BrainWorker

    brain = BrainWorker(bus, BrainSettings(), instance_id="brain-closing", llm=FakeLLM([]), heartbeat_s=0.5)

    async def broken() -> None:
        raise RuntimeError("the reaper failed to close")

    brain.reaper.close = broken  # type: ignore[method-assign]
    stop = asyncio.Event()
    running = asyncio.create_task(brain.run(stop))
    await async_wait_until(lambda: _brain_present(bus, "brain-closing"), what="the Brain in the pool")
    stop.set()
    try:
        await running
    except RuntimeError as exc:
        assert "reaper failed" in str(exc)
    else:
        raise AssertionError("a failing close must be reported")
    assert "brain-closing" not in await alive(bus, "brain")  # its presence stopped all the same


async def _brain_present(bus: Bus, instance_id: str) -> bool:
    return instance_id in await alive(bus, "brain")
