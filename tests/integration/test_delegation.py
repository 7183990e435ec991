"""Sub-agents on a real Redis, in real Brains and a real Hands worker (a fake model): a delegate call runs as
its own turn and its answer comes back as the tool's result; children run at once, as the chosen agent with
only that agent's tools, within the depth, fan-out and the root turn's limits; cancelling the parent stops its
children's running commands."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from brain.config import BrainSettings, DelegationSettings
from brain.delegation import child_session
from brain.llm import Completion
from brain.spend import report
from brain.testing import FunctionModel, tool_call
from bus.protocol import ChatCancel, ChatError, ChatMessage, ChatReply, ChatTool, Message, ToolSpec
from bus.replies import ReplyInbox
from bus.streams import Bus
from memory.sessions import SessionStore
from tests.conftest import async_wait_until

SUB = "You are a sub-agent"


def system_text(messages: list[dict[str, Any]]) -> str:
    """Every system message's text: the agent's instructions, then what the turn adds (a sub-agent's role)."""
    return "\n\n".join(m["content"] for m in messages if m["role"] == "system")


def is_child(messages: list[dict[str, Any]]) -> bool:
    return SUB in system_text(messages)


def last_user(messages: list[dict[str, Any]]) -> str:
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")


def results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool results the model reads since the person's last message, parsed."""
    start = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return [json.loads(m["content"]) for m in messages[start:] if m["role"] == "tool"]


def delegating(*tasks: dict[str, Any]):
    """A parent that hands out ``tasks`` in one response, then answers with what came back;
    its children answer ``did: <task>``."""
    def model(messages: list[dict[str, Any]], _tools: list[ToolSpec]) -> Completion:
        if is_child(messages):
            return Completion(text=f"did: {last_user(messages)}")
        if messages[-1]["role"] == "tool":
            return Completion(text=" | ".join(r.get("answer") or f"{r['error']}: {r['message']}"
                                              for r in results(messages)))
        return Completion(tool_calls=[tool_call("delegate", task, f"d{n}") for n, task in enumerate(tasks)])
    return model


def settings(**delegation: Any) -> BrainSettings:
    return BrainSettings(model="fake/model", tools_list_timeout_s=2.0, delegation=DelegationSettings(**delegation),
                         agents={"researcher": {"instructions": "You research."}})


async def test_one_child_answers_as_the_tool_result_in_a_session_of_its_own(bus: Bus, brain_pool, chat) -> None:
    llm = FunctionModel(delegating({"task": "count to three", "context": "the person likes Roman numerals"}))
    await brain_pool(settings(), llm)
    events = await chat("count for me", session_id="alice/main", sender="alice")
    final = events[-1]
    assert isinstance(final, ChatReply), final
    assert final.text == "did: count to three"
    tools = [e for e in events if isinstance(e, ChatTool)]
    assert [(t.tool, t.status) for t in tools] == [("delegate", "started"), ("delegate", "finished")]
    assert tools[1].error_code is None and tools[0].parent_call_id is None
    assert tools[1].answer == "did: count to three"  # the stream shows what the sub-agent answered
    # The child: its own session under the parent's, the task verbatim as the person's words, as alice.
    parent = await SessionStore(bus.redis, bus.keys).load("alice/main")
    call_id = parent[-2].metadata["call_id"]
    child_id = child_session("alice/main", call_id)
    assert child_id.startswith("alice/main:sub-") and parent[-2].metadata["child_session"] == child_id
    child = await SessionStore(bus.redis, bus.keys).load(child_id)
    assert [(e.role, e.content) for e in child] == [("user", "count to three"), ("assistant", "did: count to three")]
    assert child[0].metadata["sender"] == "alice"
    seen = next(conversation for conversation in llm.seen if is_child(conversation))
    assert "the person likes Roman numerals" in system_text(seen)
    assert "count to three" not in system_text(seen)  # the task is the user's message, not in the instructions
    assert await bus.redis.get(bus.keys.session_owner(child_id)) == await bus.redis.get(
        bus.keys.session_owner("alice/main"))


async def test_three_children_run_at_the_same_time_on_the_pool(bus: Bus, brain_pool, chat) -> None:
    together = asyncio.Barrier(3)  # passed only when all three children are in their model call at once

    async def model(messages: list[dict[str, Any]], tools: list[ToolSpec]) -> Completion:
        if is_child(messages):
            async with asyncio.timeout(10):
                await together.wait()
        return delegating({"task": "a"}, {"task": "b"}, {"task": "c"})(messages, tools)

    await brain_pool(settings(), FunctionModel(model), 2)
    final = (await chat("split it", session_id="alice/split", sender="alice"))[-1]
    assert isinstance(final, ChatReply), final
    assert final.text == "did: a | did: b | did: c"


async def test_a_child_of_another_agent_has_only_that_agents_tools(bus: Bus, brain_pool, chat) -> None:
    offered: dict[str, list[str]] = {}

    def model(messages: list[dict[str, Any]], tools: list[ToolSpec]) -> Completion:
        offered["child" if is_child(messages) else "parent"] = sorted(t.name for t in tools)
        if is_child(messages):
            assert "You research." in messages[0]["content"]
        return delegating({"task": "look it up", "agent": "researcher"})(messages, tools)

    await brain_pool(settings(agents={"main": ["researcher"]}), FunctionModel(model),
                     tools={"agents": {"researcher": {"allow": ["read_file", "web_fetch"]}}})
    final = (await chat("research", session_id="alice/r", sender="alice", agents=["*"]))[-1]
    assert isinstance(final, ChatReply) and final.text == "did: look it up", final
    assert offered["child"] == ["read_file", "web_fetch"]
    assert "delegate" in offered["parent"] and "exec" in offered["parent"]


async def test_a_sub_agent_at_the_depth_limit_is_refused_saying_so(bus: Bus, brain_pool, chat) -> None:
    def model(messages: list[dict[str, Any]], tools: list[ToolSpec]) -> Completion:
        if is_child(messages):
            if messages[-1]["role"] == "tool":
                return Completion(text=f"child got: {results(messages)[0]['message']}")
            assert "delegate" not in [t.name for t in tools]  # not offered at the last level...
            return Completion(tool_calls=[tool_call("delegate", {"task": "deeper"}, "x")])  # ...refused if called
        return delegating({"task": "one"})(messages, tools)

    await brain_pool(settings(max_depth=1), FunctionModel(model))
    final = (await chat("go", session_id="alice/depth", sender="alice"))[-1]
    assert isinstance(final, ChatReply), final
    assert final.text.startswith("child got: sub-agents may not delegate further (brain.delegation.max_depth = 1")
    assert final.text.endswith("do the task yourself")


async def test_fan_out_agents_and_arguments_are_refused_with_what_to_do(bus: Bus, brain_pool, chat) -> None:
    seen: list[list[dict[str, Any]]] = []

    def model(messages: list[dict[str, Any]], tools: list[ToolSpec]) -> Completion:
        if not is_child(messages) and messages[-1]["role"] == "tool":
            seen.append(results(messages))
        return delegating({"task": "one"}, {"task": "x", "agent": "researcher"}, {"task": "y", "agent": "nobody"},
                          {"task": ""}, {"task": "two"})(messages, tools)

    await brain_pool(settings(max_children=4), FunctionModel(model))
    final = (await chat("go", session_id="alice/refusals", sender="alice", agents=["*"]))[-1]
    assert isinstance(final, ChatReply), final
    got = seen[0]
    assert got[0]["answer"] == "did: one"
    assert got[1]["error"] == "PERMISSION_DENIED" and "brain.delegation.agents.main" in got[1]["message"]
    assert got[2]["error"] == "INVALID_ARGUMENTS" and "no agent named 'nobody'" in got[2]["message"]
    assert got[3]["error"] == "INVALID_ARGUMENTS" and got[3]["message"].startswith("task:")
    assert got[4]["error"] == "RESOURCE_EXHAUSTED" and "brain.delegation.max_children" in got[4]["message"]


async def test_the_tree_shares_the_root_turns_tool_calls(bus: Bus, brain_pool, chat) -> None:
    def model(messages: list[dict[str, Any]], tools: list[ToolSpec]) -> Completion:
        if is_child(messages):
            if messages[-1]["role"] == "tool":
                return Completion(text="read it")
            return Completion(tool_calls=[tool_call("read_file", {"path": "a.txt"}, f"r{n}") for n in range(3)])
        return delegating({"task": "a"}, {"task": "b"})(messages, tools)

    await brain_pool(BrainSettings(model="fake/model", tools_list_timeout_s=2.0, max_tool_calls=5),
                     FunctionModel(model))
    final = (await chat("read", session_id="alice/tree", sender="alice"))[-1]
    # 2 delegations + 3 reads fit in 5; the other child's 3 reads do not: it stops, saying why. The two run
    # at once, so either may be the one that read.
    assert isinstance(final, ChatReply), final
    read, stopped = sorted(final.text.split(" | "), key=lambda answer: answer != "read it")
    assert read == "read it"
    assert stopped.startswith("BUDGET_EXHAUSTED: the sub-agent (main, session tree:sub-")
    assert "across the turn and its sub-agents (brain.max_tool_calls = 5)" in stopped


async def test_cancelling_the_parent_kills_the_childs_running_command(bus: Bus, brain_pool, ws: Path) -> None:
    marker = "61.4271"

    def model(messages: list[dict[str, Any]], tools: list[ToolSpec]) -> Completion:
        if is_child(messages):
            return Completion(tool_calls=[tool_call("exec", {"command": f"sleep {marker}"}, "e")])
        return delegating({"task": "wait a minute"})(messages, tools)

    await brain_pool(settings(), FunctionModel(model), workspace=ws)
    inbox = ReplyInbox(bus, "gateway-cancel", block_ms=100)
    await inbox.start()
    events: list[Message] = []
    try:
        message = ChatMessage(session_id="alice/cancel", sender="alice", text="go", reply_to=inbox.stream)
        async with inbox.expect(message.message_id) as queue:
            await bus.publish(bus.keys.brain_inbox, message)
            await async_wait_until(lambda: _sleeping(marker), timeout=20, what="the child's command running")
            await bus.publish(bus.keys.brain_control, ChatCancel(session_id="alice/cancel", by="alice"))
            async with asyncio.timeout(20):
                while not isinstance(event := await queue.get(), (ChatReply, ChatError)):
                    events.append(event)
    finally:
        await inbox.close()
    assert isinstance(event, ChatError) and event.code.value == "CANCELLED", event
    await async_wait_until(lambda: not _sleeping(marker), timeout=20, what="the child's command killed")
    nested = [e for e in events if isinstance(e, ChatTool) and e.parent_call_id]
    assert nested and nested[0].tool == "exec" and nested[0].session_id == "alice/cancel"
    delegate = next(e for e in events if isinstance(e, ChatTool) and e.tool == "delegate")
    assert nested[0].parent_call_id == delegate.call_id
    store, child_id = SessionStore(bus.redis, bus.keys), child_session("alice/cancel", delegate.call_id)

    async def child_closed() -> bool:  # the child closes its transcript on its own time, after the parent's end
        child = await store.load(child_id)
        return bool(child) and child[-1].metadata.get("stopped") == "CANCELLED"

    await async_wait_until(child_closed, timeout=20, what="the child's transcript closed as cancelled")


def _sleeping(marker: str) -> bool:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if f"sleep\0{marker}" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    return True
            except OSError:
                continue
    return False


async def test_an_identity_limited_to_some_agents_cannot_reach_another_through_a_sub_agent(bus: Bus, brain_pool,
                                                                                           chat) -> None:
    seen: list[list[dict[str, Any]]] = []

    def model(messages: list[dict[str, Any]], tools: list[ToolSpec]) -> Completion:
        if not is_child(messages) and messages[-1]["role"] == "tool":
            seen.append(results(messages))
        return delegating({"task": "find it", "agent": "researcher"})(messages, tools)

    await brain_pool(settings(agents={"main": ["researcher"]}), FunctionModel(model))
    # The stamps the doors put on a turn: a token limited to main, a channel's user or a hook of main.
    for sender, stamp in [("kid", ["main"]), ("telegram:42", ["main"]), ("hook:ci", ["main", "family"])]:
        final = (await chat("go", session_id=f"{sender}/s", sender=sender, agents=stamp))[-1]
        assert isinstance(final, ChatReply), final
        assert seen[-1][0]["error"] == "PERMISSION_DENIED"
        assert seen[-1][0]["message"] == f"{sender!r} may not use agent 'researcher' (it may use {', '.join(stamp)})"
    # A turn nobody stamped (a raw bus client): its own agent only, whoever it claims to be.
    final = (await chat("go", session_id="owner/raw", sender="owner"))[-1]
    assert isinstance(final, ChatReply) and "no agents stamped by a door" in seen[-1][0]["message"], final
    final = (await chat("go", session_id="alice/s", sender="alice", agents=["*"]))[-1]  # an identity of any agent may
    assert isinstance(final, ChatReply) and final.text == "did: find it", final


async def test_a_sub_agent_cancelled_before_it_starts_never_runs(bus: Bus, brain_pool, chat) -> None:
    llm = FunctionModel(delegating({"task": "never"}))
    # One turn slot and none to lend: the child waits in the stream while its parent waits for it.
    brains = await brain_pool(BrainSettings(model="fake/model", tools_list_timeout_s=2.0, max_turns=1,
                                            max_waiting=0), llm)
    answer = asyncio.create_task(chat("go", session_id="alice/queued", sender="alice"))
    await async_wait_until(lambda: _child_sent(bus), timeout=20, what="the child's message sent")
    await bus.publish(bus.keys.brain_control, ChatCancel(session_id="alice/queued", by="alice"))
    final = (await answer)[-1]
    assert isinstance(final, ChatError) and final.code.value == "CANCELLED", final
    await async_wait_until(lambda: _pending(bus, 0), timeout=20, what="the child's message handled")
    assert not any(is_child(conversation) for conversation in llm.seen)  # the child's model was never called
    assert brains[0].consumer.in_flight == 0


async def _child_sent(bus: Bus) -> bool:
    return any(b"delegation" in b"".join(fields.values()) for _, fields in await bus.redis.xrange(bus.keys.brain_inbox))


async def _pending(bus: Bus, n: int) -> bool:
    return (await bus.redis.xpending(bus.keys.brain_inbox, "brain"))["pending"] == n


async def test_sub_agents_spend_is_the_same_identitys_and_shares_the_turns_money(bus: Bus, brain_pool,
                                                                                chat) -> None:
    prices = {"fake/priced": {"input_per_mtok": 1000.0, "output_per_mtok": 3000.0}}

    def model(messages: list[dict[str, Any]], tools: list[ToolSpec]) -> Completion:
        done = delegating({"task": "a"}, {"task": "b"})(messages, tools)
        return Completion(text=done.text, tool_calls=done.tool_calls, model="fake/priced",
                          usage={"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110})

    # Each call costs 0.1 + 0.03 = $0.13; the turn may spend $0.35: the parent's first call and both children
    # fit ($0.39 is only reached by the last of them), the parent's second call does not.
    await brain_pool(BrainSettings(model="fake/priced", prices=prices, tools_list_timeout_s=2.0, max_cost_usd=0.35),
                     FunctionModel(model))
    final = (await chat("go", session_id="alice/money", sender="alice"))[-1]
    assert isinstance(final, ChatError) and final.code.value == "BUDGET_EXHAUSTED", final
    assert "across the turn and its sub-agents (brain.max_cost_usd = 0.35)" in final.message
    shown = await report(bus, BrainSettings(model="fake/priced", prices=prices))
    alice = next(row for row in shown["budgets"] if row["budget"] == "brain.budget.per_identity.daily_usd")
    assert alice["scope"] == "identity:alice"
    assert alice["calls"] == 3 and alice["spent_usd"] == 0.39  # the children's calls are alice's spend
