"""Replay of a recorded session through the current code: a real Brain's turns and a real Hands worker
(its tool list and policy) on a real Redis; the model and the tools answered from the record."""

from __future__ import annotations

from pathlib import Path

from brain.config import BrainSettings
from brain.llm import Completion
from brain.replay import replay
from bus.protocol import ChatReply
from bus.streams import Bus
from hands.config import HandsSettings
from hands.scratch import ScratchHands
from memory.flight import FlightRecorder, read_lines
from tests.conftest import SHIPPED_SKILLS
from tests.integration.brain_fakes import FakeLLM, call


def two_reads_then_answer(messages):
    """read_file twice, then an answer quoting the last read; a message without "twice": a plain answer."""
    last, done = messages[-1], sum(m["role"] == "tool" for m in messages)
    if last["role"] == "user" and "twice" not in last["content"]:
        return Completion(text=f"plain answer to {last['content']}", model="fake")
    if last["role"] == "user" or done % 2 == 1:
        return Completion(tool_calls=[call("read_file", {"path": "a.txt"}, done)], model="fake",
                          usage={"prompt_tokens": 100, "completion_tokens": 5, "cached_tokens": 60})
    return Completion(text=f"a.txt says {last['content']}", model="fake",
                      usage={"prompt_tokens": 120, "completion_tokens": 6})


async def recorded(bus: Bus, pool, chat, llm: FakeLLM) -> FlightRecorder:
    await pool(llm)
    assert isinstance((await chat("read a.txt twice", sender="owner"))[-1], ChatReply)
    assert isinstance((await chat("thanks", sender="owner"))[-1], ChatReply)
    return FlightRecorder(bus.redis, bus.keys, keep_s=60)


async def test_a_replay_asks_no_model_runs_no_tool_and_gives_the_same_answers(
        bus: Bus, pool, chat, tmp_path: Path) -> None:
    llm = FakeLLM(two_reads_then_answer)
    recorder = await recorded(bus, pool, chat, llm)
    asked = len(llm.seen)
    (tmp_path / "ws" / "a.txt").write_text("CHANGED")  # a tool that ran now would read this, and the request differ
    report = await replay(bus, BrainSettings(), await recorder.steps("s1"), await recorder.parts("s1"))
    assert len(llm.seen) == asked  # not one provider request
    assert report.diverged is None, report.diverged
    assert [t.text for t in report.turns] == ["read a.txt twice", "thanks"]
    assert all(t.same and t.matched == t.model_steps and not t.live for t in report.turns), report.turns
    assert report.turns[0].tools == ["read_file", "read_file"] and "alpha" in (report.turns[0].answer or "")
    assert report.recorded["model_calls"] == 4 and report.recorded["cached_tokens"] == 120
    assert await bus.redis.keys(f"{bus.keys.prefix}session:{{replay/*") == []  # the scratch session is gone


async def test_a_changed_instruction_is_reported_at_its_first_step_with_a_diff_then_goes_live(
        bus: Bus, pool, chat) -> None:
    llm = FakeLLM(two_reads_then_answer)
    recorder = await recorded(bus, pool, chat, llm)
    steps, parts = await recorder.steps("s1"), await recorder.parts("s1")
    changed = BrainSettings(instructions="You are Pincer, and you answer in verse.")
    stopped = await replay(bus, changed, steps, parts)
    assert stopped.diverged is not None and (stopped.diverged.turn, stopped.diverged.step) == (1, 1)
    diff = stopped.diverged.diff.splitlines()
    assert "+    You are Pincer, and you answer in verse." in diff and " [1] system" in diff
    assert any(line.startswith("-    You are Pincer, a helpful assistant.") for line in diff)
    assert "differs from the recording" in (stopped.turns[0].error or "") and len(stopped.turns) == 1
    asked = len(llm.seen)
    went_live = await replay(bus, changed, steps, parts, live=llm)
    assert len(llm.seen) > asked and went_live.turns[0].live >= 1 and len(went_live.turns) == 2
    assert went_live.turns[1].answer == "plain answer to thanks"


async def test_an_exported_file_replays_as_the_session_did(bus: Bus, pool, chat) -> None:
    llm = FakeLLM(two_reads_then_answer)
    recorder = await recorded(bus, pool, chat, llm)
    steps, parts = read_lines(await recorder.export("s1"))
    report = await replay(bus, BrainSettings(), steps, parts)
    assert report.diverged is None and all(t.same for t in report.turns)


def write_then_answer(messages):
    if messages[-1]["role"] == "tool":
        return Completion(text=f"wrote: {messages[-1]['content'][:60]}", model="fake")
    return Completion(tool_calls=[call("write_file", {"path": "b.txt", "content": "new"})], model="fake")


def scratch_hands(tmp_path: Path) -> ScratchHands:
    return ScratchHands(HandsSettings(workspace=tmp_path / "ws", skill_dirs=[SHIPPED_SKILLS]), "owner")


async def test_tools_live_run_in_a_scratch_copy_and_what_they_return_now_is_compared(
        bus: Bus, pool, chat, tmp_path: Path) -> None:
    llm = FakeLLM(two_reads_then_answer)
    recorder = await recorded(bus, pool, chat, llm)
    steps, parts = await recorder.steps("s1"), await recorder.parts("s1")
    scratch = scratch_hands(tmp_path)
    try:
        same = await replay(bus, BrainSettings(), steps, parts, run_tool=scratch.call)
        assert same.diverged is None and same.tools_live and same.turns[0].tools == ["read_file", "read_file"]
        (tmp_path / "ws" / "a.txt").write_text("CHANGED")  # the copy was made before: it still reads alpha
        assert (await replay(bus, BrainSettings(), steps, parts, run_tool=scratch.call)).diverged is None
    finally:
        scratch.close()
    changed = scratch_hands(tmp_path)  # a copy of the workspace as it is now
    try:
        report = await replay(bus, BrainSettings(), steps, parts, run_tool=changed.call)
    finally:
        changed.close()
    assert report.diverged is not None and (report.diverged.turn, report.diverged.step) == (1, 2)
    assert any(line.startswith("+") and "CHANGED" in line for line in report.diverged.diff.splitlines())
    assert not changed.root.exists()


async def test_a_tool_run_live_writes_the_copy_never_the_agents_files(bus: Bus, pool, chat, tmp_path: Path) -> None:
    await pool(FakeLLM(write_then_answer))
    assert isinstance((await chat("write b.txt", sender="owner"))[-1], ChatReply)
    recorder = FlightRecorder(bus.redis, bus.keys, keep_s=60)
    (tmp_path / "ws" / "b.txt").unlink()  # written by the recorded turn
    scratch = scratch_hands(tmp_path)
    try:
        report = await replay(bus, BrainSettings(), await recorder.steps("s1"), await recorder.parts("s1"),
                              run_tool=scratch.call)
        assert (scratch.workspace / "b.txt").read_text() == "new"  # the copy has it
    finally:
        scratch.close()
    assert report.diverged is None and report.turns[0].tools == ["write_file"], report.diverged
    assert not (tmp_path / "ws" / "b.txt").exists()  # the agent's own workspace does not
