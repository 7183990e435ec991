"""Brain turns end with a reason when they exceed a budget or loop, per agent."""

from __future__ import annotations

import asyncio

from brain.llm import Completion
from bus.protocol import ChatError, ErrorCode
from bus.streams import Bus
from memory.sessions import SessionStore
from tests.integration.brain_fakes import Endless, FakeLLM, call


async def test_iteration_budget_ends_the_turn_with_a_reason(pool, chat) -> None:
    llm = FakeLLM(lambda _m: Completion(tool_calls=[call("list_directory", {})]))
    await pool(llm, max_iterations=3)
    final = (await chat("loop forever"))[-1]
    assert isinstance(final, ChatError) and final.code is ErrorCode.BUDGET_EXHAUSTED
    assert "brain.max_iterations" in final.message and "Done so far: 3 model call(s), 3 tool call(s)" in \
        final.message and len(llm.seen) == 3

async def test_tool_call_and_token_budgets(bus: Bus, pool, chat) -> None:
    def greedy(_messages):
        return Completion(tool_calls=[call("list_directory", {}, n) for n in range(3)], usage={"total_tokens": 400})

    await pool(FakeLLM(greedy), max_tool_calls=5, max_tokens=1000)
    final = (await chat("do a lot", session_id="budget"))[-1]
    assert final.code is ErrorCode.BUDGET_EXHAUSTED and "brain.max_tool_calls = 5" in final.message
    assert "Done so far: 2 model call(s), 3 tool call(s) (list_directory), 800 tokens" in final.message
    entries = await SessionStore(bus.redis, bus.keys).load("budget")
    assert [e.role for e in entries][-4:] == ["tool", "tool", "tool", "assistant"]  # every call closed
    assert all("CANCELLED" not in e.content or e.metadata.get("cancelled") for e in entries if e.role == "tool")


async def test_wall_time_budget_stops_a_slow_tool(pool, chat) -> None:
    slow = Endless("slow")
    await pool(slow.llm, tools=[slow.tool], max_turn_s=1.5)
    final = (await chat("be slow", session_id="wall"))[-1]
    assert final.code is ErrorCode.BUDGET_EXHAUSTED and "brain.max_turn_s = 1.5s" in final.message
    await asyncio.wait_for(slow.stopped.wait(), 10)  # the tool call was stopped in Hands too


async def test_a_looping_model_is_warned_then_stopped(pool, chat) -> None:
    llm = FakeLLM(lambda _m: Completion(tool_calls=[call("list_directory", {})]))
    await pool(llm)
    final = (await chat("look again", session_id="loop"))[-1]
    assert final.code is ErrorCode.LOOP_DETECTED and "same arguments 5 times" in final.message
    warned = [m for m in llm.seen[3] if m["role"] == "tool"][-1]["content"]  # the 4th model call read the warning
    assert "[Pincer: you have called list_directory with the same arguments 3 times" in warned
    assert len(llm.seen) == 5


async def test_agents_have_their_own_instructions_and_budgets(pool, chat) -> None:
    from brain.config import AgentSettings

    llm = FakeLLM(lambda m: Completion(tool_calls=[call("list_directory", {})]) if len(m) < 3 else
                  Completion(text="done"))
    await pool(llm, agents={"terse": AgentSettings(instructions="Be terse.", max_iterations=1)})
    main = (await chat("hi", session_id="m"))[-1]
    assert main.text == "done" and llm.seen[0][0]["content"].startswith("You are Pincer")
    terse = (await chat_as(chat, "hi", "terse"))[-1]
    assert terse.code is ErrorCode.BUDGET_EXHAUSTED and "brain.max_iterations" in terse.message
    assert llm.seen[-1][0]["content"].startswith("Be terse.\n\nSkills you can use")
    unknown = (await chat_as(chat, "hi", "ghost"))[-1]
    assert unknown.code is ErrorCode.INVALID_ARGUMENTS and "agents: main, terse" in unknown.message


async def chat_as(chat, text: str, agent: str):
    return await chat(text, session_id=f"agent-{agent}", agent_id=agent)
