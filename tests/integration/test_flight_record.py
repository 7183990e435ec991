"""The flight record of real turns: a Brain and a Hands worker on a real Redis, the model behind the seam."""

from __future__ import annotations

import json

import pytest

from brain.llm import Completion
from bus.protocol import ChatError, ChatReply, ErrorCode
from bus.streams import Bus
from memory.flight import FlightRecorder, RecordError, read_lines
from memory.record_parts import STORE_PARTS, canonical, digest
from memory.sessions import SessionStore
from tests.integration.brain_fakes import FakeLLM, call


def two_reads_then_answer(messages):
    done = sum(m["role"] == "tool" for m in messages)
    if done < 2:
        return Completion(tool_calls=[call("read_file", {"path": "a.txt"}, done)], model="fake",
                          usage={"prompt_tokens": 100, "completion_tokens": 5, "cached_tokens": 80},
                          finish_reason="tool_calls")
    return Completion(text="a.txt says alpha", model="fake", usage={"prompt_tokens": 120, "completion_tokens": 6},
                      finish_reason="stop")


async def test_each_step_of_a_tool_turn_is_recorded_in_order_with_the_request_as_sent(
        bus: Bus, pool, chat) -> None:
    llm = FakeLLM(two_reads_then_answer)
    await pool(llm)
    reply = (await chat("read a.txt twice", sender="owner"))[-1]
    assert isinstance(reply, ChatReply) and "alpha" in reply.text
    recorder = FlightRecorder(bus.redis, bus.keys, keep_s=60)
    steps = await recorder.steps("s1")
    assert [s.kind for s in steps] == ["turn", "model", "tool", "model", "tool", "model"]
    assert steps[0].data["text"] == "read a.txt twice" and steps[0].data["sender"] == "owner"
    models = [s for s in steps if s.kind == "model"]
    for step, sent in zip(models, llm.seen, strict=True):  # what the model was sent, exactly
        request = await recorder.request("s1", step)
        assert request["messages"] == sent
        assert "read_file" in [t["function"]["name"] for t in request["tools"]]
    first = models[0].data["response"]
    assert first["finish_reason"] == "tool_calls" and first["usage"]["cached_tokens"] == 80
    assert first["tool_calls"][0]["function"]["name"] == "read_file" and first["total_ms"] >= 0
    assert models[-1].data["response"]["text"] == "a.txt says alpha"
    tool = steps[2].data
    assert tool["tool"] == "read_file" and tool["success"] and tool["worker_id"] == "hands-t"
    assert "alpha" in tool["result"] and json.loads(tool["arguments"]) == {"path": "a.txt"}
    assert {s.message_id for s in steps} == {steps[0].message_id}


async def test_a_long_conversation_stores_each_message_once(bus: Bus, pool, chat) -> None:
    llm = FakeLLM(lambda messages: Completion(text=f"answer {len(messages)}", model="fake"))
    await pool(llm)
    for n in range(6):
        assert isinstance((await chat(f"message {n}"))[-1], ChatReply)
    recorder = FlightRecorder(bus.redis, bus.keys, keep_s=60)
    parts = await recorder.parts("s1")
    sent = {digest(m) for messages in llm.seen for m in messages}
    assert len(llm.seen) == 6 and sum(len(m) for m in llm.seen) == 2 + 4 + 6 + 8 + 10 + 12  # 42 messages sent
    tool_lists = {s.data["request"]["tools"] for s in await recorder.steps("s1") if s.kind == "model"}
    assert len(tool_lists) == 1 and set(parts) == sent | tool_lists
    assert len(sent) == 1 + 6 + 5  # the instructions once, each question once, each answer the model read once


async def test_a_stopped_turn_records_why_and_a_deleted_session_takes_its_record(bus: Bus, pool, chat) -> None:
    await pool(FakeLLM(lambda _m: Completion(tool_calls=[call("read_file", {"path": "a.txt"})], model="fake")),
               max_iterations=2)
    final = (await chat("loop"))[-1]
    assert isinstance(final, ChatError) and final.code is ErrorCode.BUDGET_EXHAUSTED
    recorder = FlightRecorder(bus.redis, bus.keys, keep_s=60)
    steps = await recorder.steps("s1")
    assert steps[-1].kind == "stop" and steps[-1].data["code"] == "BUDGET_EXHAUSTED"
    assert 0 < await bus.redis.ttl(bus.keys.session_record("s1")) <= 30 * 86_400
    await SessionStore(bus.redis, bus.keys).delete("s1")
    assert await recorder.steps("s1") == [] and await recorder.parts("s1") == {}


async def test_an_export_imports_as_the_same_record_and_an_edited_one_is_refused(bus: Bus, pool, chat) -> None:
    await pool(FakeLLM(two_reads_then_answer))
    await chat("read a.txt twice")
    recorder = FlightRecorder(bus.redis, bus.keys, keep_s=60)
    lines = await recorder.export("s1")
    assert json.loads(lines[0])["pincer_record"] == 1
    assert await recorder.import_lines("copy", lines) == 6
    assert await recorder.export("copy") != [] and [s.kind for s in await recorder.steps("copy")] == \
        [s.kind for s in await recorder.steps("s1")]
    for a, b in zip(await recorder.steps("copy"), await recorder.steps("s1"), strict=True):
        assert a.model_dump() == b.model_dump()
        if a.kind == "model":
            assert await recorder.request("copy", a) == await recorder.request("s1", b)
    part = next(n for n, line in enumerate(lines) if '"part"' in line)
    edited = [*lines[:part], lines[part].replace("system", "sYstem"), *lines[part + 1:]]
    with pytest.raises(RecordError, match=f"line {part + 1}: part .* does not match its content"):
        read_lines(edited)
    with pytest.raises(RecordError, match="starts with its header"):
        read_lines(lines[1:])
    with pytest.raises(RecordError, match="record format 2"):
        read_lines([lines[0].replace('"pincer_record":1', '"pincer_record":2')])


def _sent_texts(bus: Bus, builds: list) -> list[str]:
    """The part texts the queued writes carry (HSETNX values and the store script's sent pairs)."""
    texts = []
    for build in builds:
        pipe = bus.redis.pipeline(transaction=False)
        build(pipe)
        for args, _options in pipe.command_stack:
            if args[0] == "HSETNX":
                texts.append(args[3])
            elif args[0] == "EVAL" and args[1] == STORE_PARTS:  # not the step's own script
                keys = int(args[2])
                script_args = args[3 + keys:]
                texts += [script_args[i] for i in range(2, 2 * int(script_args[0]) + 1, 2)]
    return texts


async def test_a_session_sends_each_part_once_and_what_went_missing_again(bus: Bus) -> None:
    builds: list = []

    def send(build, *, done=lambda _outcome: None) -> None:
        builds.append(build)
        bus.batcher.send(build, done=done)

    recorder = FlightRecorder(bus.redis, bus.keys, keep_s=60, send=send)
    tools = [{"type": "function", "function": {"name": "read_file", "description": "x" * 500}}]
    talk = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one"}]

    async def step(messages: list[dict[str, str]]) -> list[str]:
        builds.clear()
        await recorder.model_call("s1", "m1", messages=messages, tools=tools, params={}, response={"text": "ok"})
        await bus.batcher.run(lambda pipe: pipe.ping())  # behind the step and anything its outcome sent
        await bus.batcher.run(lambda pipe: pipe.ping())
        return _sent_texts(bus, builds)

    def stored_whole(parts: dict, messages: list) -> bool:
        return all(parts.get(digest(m)) == m for m in messages) and parts.get(digest(tools)) == tools

    assert len(await step(talk)) == 3  # the instructions, the question, the tool list
    talk += [{"role": "assistant", "content": "two"}, {"role": "user", "content": "three"}]
    assert sorted(await step(talk)) == sorted(canonical(m) for m in talk[2:])  # the new only
    assert stored_whole(await recorder.parts("s1"), talk)

    await bus.redis.delete(bus.keys.session_record_parts("s1"))  # a record imported over, a failover: parts gone
    talk += [{"role": "assistant", "content": "four"}]
    again = await step(talk)
    assert len(again) == 1 + len(talk)  # the new one with the step, then every part the hash lost
    assert stored_whole(await recorder.parts("s1"), talk)
    models = [s for s in await recorder.steps("s1") if s.kind == "model"]
    assert (await recorder.request("s1", models[-1]))["messages"] == talk


async def test_a_failed_write_makes_the_next_request_send_every_part(bus: Bus) -> None:
    outcomes: list = [ConnectionError("Redis away")]
    sent: list = []

    def send(build, *, done=lambda _outcome: None) -> None:
        sent.append(build)
        if outcomes:
            done(outcomes.pop())  # lost: nothing reached Redis
        else:
            bus.batcher.send(build, done=done)

    recorder = FlightRecorder(bus.redis, bus.keys, keep_s=60, send=send)
    talk = [{"role": "user", "content": "one"}]
    await recorder.model_call("s2", "m1", messages=talk, tools=[], params={}, response={})
    sent.clear()
    talk += [{"role": "assistant", "content": "two"}]
    await recorder.model_call("s2", "m2", messages=talk, tools=[], params={}, response={})
    assert len(_sent_texts(bus, sent)) == 3  # the tool list and both messages: none was taken as stored
    await bus.batcher.run(lambda pipe: pipe.ping())
    assert set(await recorder.parts("s2")) == {digest(m) for m in talk} | {digest([])}


async def test_a_session_that_never_goes_quiet_keeps_its_steps_for_keep_s_each(bus: Bus) -> None:
    from bus.protocol import now_ms
    from memory.flight import Step

    recorder = FlightRecorder(bus.redis, bus.keys, keep_s=60)
    record = bus.keys.session_record("alice/cron-tidy")
    for age_s in (3600, 120, 30):  # steps written an hour, two minutes and half a minute ago
        step = Step(kind="turn", at=now_ms() - age_s * 1000, message_id=f"m{age_s}")
        await bus.redis.xadd(record, {"e": step.model_dump_json()}, id=f"{now_ms() - age_s * 1000}-0")
    await recorder.write("alice/cron-tidy", Step(kind="turn", message_id="now"))
    assert [s.message_id for s in await recorder.steps("alice/cron-tidy")] == ["m30", "now"]
    assert 0 < await bus.redis.ttl(record) <= 60
