"""Several Brain processes: a session's messages in order, sessions side by side, a dead Brain's turn finished.

Real Brain and Hands processes on the real Redis; litellm speaks HTTP to the
scripted model. Skills stand in for slow tools and record every run in a file,
so a test can count side effects and read when each call ran (Hands' clock).
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import httpx
import pytest

from bus.codec import decode
from bus.protocol import ChatError, ChatMessage, ChatReply, Message
from bus.replies import ReplyInbox
from bus.streams import Bus
from memory.sessions import SessionStore
from tests.conftest import SHIPPED_SKILLS, Processes, async_wait_until, gateway_client, make_skill, wait_until
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e

STAMP = """
import json, time

def handle(args, ctx):
    start = time.time()
    time.sleep(args.get("s", 0))
    with open(args["log"], "a") as log:
        log.write(json.dumps({"tag": args["tag"], "tool": ctx.call.tool, "start": start, "end": time.time(),
                              "saw": [p.tool for p in ctx.call.prior]}) + "\\n")
    return args["tag"]
"""


@pytest.fixture
def brains_env(processes: Processes, pincer_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    skills = tmp_path / "stamp-skills"
    params = "parameters: {s: {type: number}, tag: {type: string}, log: {type: string}}\ntimeout: 30"
    make_skill(skills, "stamp", f"name: stamp\ndescription: sleeps and records\n{params}", STAMP)
    make_skill(skills, "stamp-after", f"name: stamp_after\ndescription: runs after stamp\nafter: [stamp]\n{params}",
               STAMP)
    make_skill(skills, "stamp-once", f"name: stamp_once\ndescription: a side effect\nidempotent: false\n{params}",
               STAMP)
    processes.env = {**pincer_env, "PINCER_HANDS__SKILL_DIRS": json.dumps([str(SHIPPED_SKILLS), str(skills)]),
                     "PINCER_REDIS__CLAIM_IDLE_S": "1", "PINCER_REDIS__REAP_INTERVAL_S": "0.3",
                     "PINCER_BRAIN__SESSION_LEASE_S": "1"}
    return processes.env


def runs(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def stamp(tool: str, tag: str, log: Path, s: float = 0.0) -> str:
    return f"CALL {tool} " + json.dumps({"s": s, "tag": tag, "log": str(log)})


class Client:
    """Sends chat messages straight onto the bus (as a Gateway would) and collects the final answers."""

    def __init__(self, bus: Bus) -> None:
        self.bus, self.inbox = bus, ReplyInbox(bus, "test-gateway", block_ms=100)
        self.finals: dict[str, Message] = {}

    async def send(self, message: ChatMessage) -> None:
        await self.bus.publish(self.bus.keys.brain_inbox, message)

    async def collect(self, messages: list[ChatMessage], timeout: float = 60) -> dict[str, Message]:
        async def one(message: ChatMessage) -> None:
            async with self.inbox.expect(message.message_id) as queue:
                await self.send(message)
                while not isinstance(event := await queue.get(), (ChatReply, ChatError)):
                    pass
                self.finals[message.message_id] = event

        await asyncio.wait_for(asyncio.gather(*(one(m) for m in messages)), timeout)
        return self.finals


@pytest.fixture
async def client(bus: Bus):
    made = Client(bus)
    await made.inbox.start()
    yield made
    await made.inbox.close()


async def test_two_brains_keep_each_sessions_order_and_run_sessions_side_by_side(
        bus: Bus, processes: Processes, brains_env: dict[str, str], client: Client, tmp_path: Path) -> None:
    for i in range(2):
        processes.start("brain", name=f"brain-{i}")
    processes.start("hands", name="hands")
    await wait_for(bus, "brain", 2)
    await wait_for(bus, "hands", 1)
    log = tmp_path / "runs.jsonl"
    messages = [ChatMessage(session_id=session, seq=seq, text=stamp("stamp", f"{session}{seq}", log, 0.4),
                            reply_to=client.inbox.stream)
                for session in ("a", "b") for seq in (1, 2, 3)]
    # The later messages of each session reach the Brains first.
    order = [messages[2], messages[5], messages[1], messages[4], messages[0], messages[3]]
    finals = await client.collect(order)
    assert all(isinstance(final, ChatReply) for final in finals.values()), finals
    ran = {r["tag"]: r for r in runs(log)}
    for session in ("a", "b"):
        assert ran[f"{session}1"]["end"] <= ran[f"{session}2"]["start"]  # in order, never interleaved
        assert ran[f"{session}2"]["end"] <= ran[f"{session}3"]["start"]
        transcript = await SessionStore(bus.redis, bus.keys).load(session)
        users = [e.content for e in transcript if e.role == "user"]
        assert users == [m.text for m in messages if m.session_id == session]
        assert [e.role for e in transcript] == ["user", "assistant", "tool", "assistant"] * 3
    overlaps = [(a, b) for a in ("a1", "a2", "a3") for b in ("b1", "b2", "b3")
                if ran[a]["start"] < ran[b]["end"] and ran[b]["start"] < ran[a]["end"]]
    assert overlaps  # the two sessions ran at the same time, on the two Brains


async def test_a_brain_killed_mid_turn_is_finished_by_another_without_repeating_calls(
        bus: Bus, processes: Processes, brains_env: dict[str, str], client: Client, tmp_path: Path) -> None:
    first = processes.start("brain", name="brain-a")
    processes.start("hands", name="hands")
    (brain_a,) = await wait_for(bus, "brain", 1)
    await wait_for(bus, "hands", 1)
    log = tmp_path / "runs.jsonl"
    # One response with a quick call and a slow call that must not run twice.
    text = f"{stamp('stamp', 'quick', log)}\n{stamp('stamp_once', 'slow', log, 3)}"
    message = ChatMessage(session_id="killed", seq=1, text=text, reply_to=client.inbox.stream)
    answer = asyncio.create_task(client.collect([message], timeout=90))
    sessions = SessionStore(bus.redis, bus.keys)

    async def quick_recorded() -> bool:  # its side effect alone is not enough: the Brain may not have its result yet
        return any(e.role == "tool" for e in await sessions.load("killed"))

    await async_wait_until(quick_recorded, what="the quick call's result in the transcript")
    assert [r["tag"] for r in runs(log)] == ["quick"]
    processes.stop(first, signal.SIGKILL)  # the slow call is still running in Hands
    await bus.redis.zrem(bus.keys.alive("brain"), brain_a)
    processes.start("brain", name="brain-b")
    final = (await answer)[message.message_id]
    assert isinstance(final, ChatReply), final
    assert "RESULT stamp: quick" in final.text and "RESULT stamp_once: slow" in final.text
    assert sorted(r["tag"] for r in runs(log)) == ["quick", "slow"]  # each ran exactly once
    transcript = await sessions.load("killed")
    assert [e.role for e in transcript] == ["user", "assistant", "tool", "tool", "assistant"]
    assert await bus.redis.xpending(bus.keys.brain_inbox, "brain") == {
        "pending": 0, "min": None, "max": None, "consumers": []}


async def test_a_dependent_call_runs_after_the_call_it_needs(
        bus: Bus, processes: Processes, brains_env: dict[str, str], client: Client, tmp_path: Path) -> None:
    processes.start("brain", name="brain")
    processes.start("hands", name="hands")
    await wait_for(bus, "brain", 1)
    await wait_for(bus, "hands", 1)
    log = tmp_path / "runs.jsonl"
    text = "\n".join([stamp("stamp_after", "second", log, 0.3), stamp("stamp", "first", log, 0.3),
                      stamp("stamp", "beside", log, 0.3)])
    message = ChatMessage(session_id="deps", text=text, reply_to=client.inbox.stream)
    final = (await client.collect([message]))[message.message_id]
    assert isinstance(final, ChatReply), final
    ran = {r["tag"]: r for r in runs(log)}
    assert ran["second"]["start"] >= max(ran["first"]["end"], ran["beside"]["end"])  # after every stamp call
    assert ran["second"]["saw"] == ["stamp", "stamp"]
    assert ran["first"]["start"] < ran["beside"]["end"] and ran["beside"]["start"] < ran["first"]["end"]


async def test_the_gateway_numbers_a_sessions_messages(bus: Bus, processes: Processes,
                                                      pincer_env: dict[str, str]) -> None:
    processes.start("gateway", name="gateway")
    processes.start("brain", name="brain")
    processes.start("hands", name="hands")
    url = f"http://127.0.0.1:{pincer_env['PINCER_GATEWAY_PORT']}"
    await asyncio.to_thread(wait_until, lambda: _healthy(url), timeout=60, what="the gateway with a brain and hands")
    for text in ("one", "two"):
        response = await asyncio.to_thread(gateway_client(pincer_env).post, "/v1/sessions/numbered/messages",
                                           json={"text": text})
        assert response.status_code == 200
    entries = await bus.redis.xrange(bus.keys.brain_inbox)
    assert [m.seq for _, fields in entries if isinstance(m := decode(fields), ChatMessage)] == [1, 2]


def _healthy(url: str) -> bool:
    try:
        health = httpx.get(f"{url}/healthz", timeout=2).json()
    except httpx.HTTPError:
        return False
    return health.get("brains") == 1 and health.get("hands") == 1


async def test_a_brain_killed_mid_delegation_finishes_the_tree_without_repeating_anything(
        bus: Bus, processes: Processes, brains_env: dict[str, str], client: Client, tmp_path: Path) -> None:
    first = processes.start("brain", name="brain-a")
    processes.start("hands", name="hands")
    (brain_a,) = await wait_for(bus, "brain", 1)
    await wait_for(bus, "hands", 1)
    log = tmp_path / "runs.jsonl"
    # Two sub-agents at once, each with a side effect that must not run twice (a quick one and a 3 s one).
    tasks = [stamp("stamp_once", "quick", log), stamp("stamp_once", "slow", log, 3)]
    text = "\n".join("CALL delegate " + json.dumps({"task": task}) for task in tasks)
    message = ChatMessage(session_id="parent", seq=1, text=text, reply_to=client.inbox.stream)
    answer = asyncio.create_task(client.collect([message], timeout=120))
    sessions = SessionStore(bus.redis, bus.keys)

    async def children() -> list[str]:
        return [s for s in await sessions.list_sessions() if s.startswith("parent:sub-")]

    async def slow_child_asked() -> bool:  # the slow sub-agent's model asked for its call: it runs in Hands now
        for child in await children():
            if any(e.role == "assistant" and '\\"slow\\"' in json.dumps(e.tool_calls or [])
                   for e in await sessions.load(child)):
                return True
        return False

    await async_wait_until(slow_child_asked, timeout=30, what="the slow sub-agent's call running")
    processes.stop(first, signal.SIGKILL)  # the parent and both sub-agents ran on brain A
    await bus.redis.zrem(bus.keys.alive("brain"), brain_a)
    processes.start("brain", name="brain-b")
    final = (await answer)[message.message_id]
    assert isinstance(final, ChatReply), final
    assert final.text.count("RESULT delegate") == 2 and "slow" in final.text and "quick" in final.text
    assert sorted(r["tag"] for r in runs(log)) == ["quick", "slow"]  # each side effect exactly once
    for child in await children():
        transcript = await sessions.load(child)
        assert [e.role for e in transcript] == ["user", "assistant", "tool", "assistant"], child  # ran once
    transcript = await sessions.load("parent")
    assert [e.role for e in transcript] == ["user", "assistant", "tool", "tool", "assistant"]

    async def all_acknowledged() -> bool:  # the parent, both children and the copy the resumed parent sent
        return (await bus.redis.xpending(bus.keys.brain_inbox, "brain"))["pending"] == 0

    await async_wait_until(all_acknowledged, timeout=30, what="every Brain message acknowledged")
