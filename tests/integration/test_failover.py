"""Redis fails over under a running pool: a primary killed -9, a replica promoted by three sentinels,
while tool calls and chat turns (a Brain with a fake model reading a file through Hands) run."""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from brain.config import BrainSettings
from brain.worker import BrainWorker
from bus.protocol import ChatError, ChatMessage, ChatReply, ErrorCode, ToolExecute, ToolResult, now_ms
from bus.replies import ReplyInbox
from bus.settings import RedisSettings
from bus.streams import CONNECTION_ERRORS, Bus
from tests.conftest import async_wait_until
from tests.integration.brain_fakes import FakeLLM, read_then_answer
from tests.redis_topology import Topology, worker_and_caller

CALL_S = 8.0  # each call's deadline: past it a worker answers TIMEOUT without running it
# How long a caller waits for any answer. A failover (~1 s to notice, then an election) plus re-sends
# with backoff, each held by WAIT's own timeout under min_replicas, can take longer than the deadline:
# an answer that comes late is not a lost call; one that never comes is.
PATIENCE_S = 45.0
TOOL_ENDED = re.compile(f'"code": "({ErrorCode.TIMEOUT.value}|{ErrorCode.WORKER_LOST.value})"')


class ThinkingModel:
    """The model of ``read_then_answer``, except that while ``go`` is clear a turn's first call waits for it:
    so the turns are at the model, mid-way, when the primary dies."""

    def __init__(self) -> None:
        self.go, self.thinking, self.answers = asyncio.Event(), 0, FakeLLM(read_then_answer)
        self.go.set()

    async def complete(self, messages, tools, on_text, **_options):  # type: ignore[no-untyped-def]
        if messages[-1]["role"] == "user" and not self.go.is_set():
            self.thinking += 1
            await self.go.wait()
        return await self.answers.complete(messages, tools, on_text)


@pytest.fixture
def topology() -> Iterator[Topology]:
    if not shutil.which("redis-server"):
        pytest.fail("redis-server is not installed: .ci/run installs it (apt-get install redis-server)")
    where = Path(tempfile.mkdtemp(prefix="pincer-failover-"))
    found = Topology(where)
    found.start()
    yield found
    found.stop()
    shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize("min_replicas", [0, 1])
async def test_the_pool_carries_on_after_a_failover(topology: Topology, tmp_path: Path, min_replicas: int) -> None:
    """Without WAIT, what the primary had not yet replicated may be lost (counted, and each such call
    still ends at its deadline); with redis.min_replicas: 1 no acknowledged write is."""
    settings = RedisSettings(sentinels=topology.sentinels, sentinel_master=Topology.MASTER, prefix="failover:",
                             claim_idle_s=2, reap_interval_s=0.5, min_replicas=min_replicas)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("alpha")
    brain_bus, model = Bus.from_settings(settings, ""), ThinkingModel()
    brain = BrainWorker(brain_bus, BrainSettings(tool_deadline_s=CALL_S, tools_list_timeout_s=5),
                        instance_id="brain-failover", llm=model, heartbeat_s=0.5)
    stop_brain = asyncio.Event()
    brain_running = asyncio.create_task(brain.run(stop_brain))
    try:
        async with worker_and_caller(settings, "", tmp_path / "ws", "failover") as (bus, inbox):
            calls, turns = await _fail_over_under_load(topology, bus, inbox, model)
    finally:
        stop_brain.set()
        await asyncio.wait_for(brain_running, 30)
        await brain_bus.close()
    assert turns["not sent"] == 0, turns  # a chat message waits the failover out
    if min_replicas:  # every write counted as sent was on a replica
        assert calls["lost"] == 0 and turns["lost"] == 0, (calls, turns)


async def _fail_over_under_load(topology: Topology, caller_bus: Bus, inbox: ReplyInbox,
                                model: ThinkingModel) -> tuple[Counter[str], Counter[str]]:
    async def one_call(n: int) -> str:
        call = ToolExecute(tool="list_directory", args={"path": "."}, reply_to=inbox.stream,
                           deadline=now_ms() + int(CALL_S * 1000), session_id=f"s{n % 4}")
        try:
            result = await inbox.request(caller_bus.keys.hands_requests, call, call.call_id, timeout=PATIENCE_S,
                                         final=(ToolResult,))
        except (TimeoutError, *CONNECTION_ERRORS):
            return "lost"  # the request or its answer was in the primary's last unreplicated moment
        assert isinstance(result, ToolResult)
        return "ok" if result.success else result.error.code.value

    async def one_turn(n: int) -> str:
        """A chat turn as the Gateway sends one: the model reads a.txt through Hands, then answers."""
        message = ChatMessage(session_id=f"chat{n}", text="what does a.txt say?", reply_to=inbox.stream,
                              sender="owner")
        async with inbox.expect(message.message_id) as events:
            try:  # as the Gateway sends one: again while Redis is away, for a while
                await caller_bus.publish_until_sent(caller_bus.keys.brain_inbox, message, within_s=PATIENCE_S)
            except CONNECTION_ERRORS:
                return "not sent"  # the sender is told (the Gateway answers 503): nothing to lose
            try:
                async with asyncio.timeout(PATIENCE_S):
                    while not isinstance(event := await events.get(), ChatReply | ChatError):
                        pass
            except TimeoutError:
                return "lost"
        if isinstance(event, ChatError):
            return event.code.value
        if '"content": "alpha"' in event.text:  # the model read the file through Hands
            return "ok"
        assert TOOL_ENDED.search(event.text), event.text  # its tool call ended at its deadline, or was lost
        return "answered without the file"

    before = [await one_call(n) for n in range(20)] + [await one_turn(n) for n in range(3)]
    assert before == ["ok"] * 23
    model.go.clear()
    turns = [asyncio.create_task(one_turn(n)) for n in range(10, 22)]
    await async_wait_until(lambda: model.thinking == 12, what="12 turns at the model")
    calls = [asyncio.create_task(one_call(n)) for n in range(60)]
    await asyncio.sleep(0)  # they are on their way
    topology.kill_primary()
    model.go.set()  # the turns go on: a tool call each, the transcript, the answer, against a failing Redis
    turns += [asyncio.create_task(one_turn(n)) for n in range(30, 36)]  # and new ones are sent meanwhile
    call_outcomes = Counter(await asyncio.gather(*calls))  # every one ends: result, WORKER_LOST, TIMEOUT or lost
    turn_outcomes = Counter(await asyncio.gather(*turns))  # every turn ends: answer, error, not sent or lost
    assert sum(call_outcomes.values()) == 60 and sum(turn_outcomes.values()) == 18
    assert set(call_outcomes) <= {"ok", ErrorCode.WORKER_LOST.value, ErrorCode.TIMEOUT.value, "lost"}, call_outcomes
    assert set(turn_outcomes) <= {"ok", "answered without the file", "not sent", "lost"}, turn_outcomes
    await async_wait_until(topology.promoted, timeout=30, what="the sentinels to promote a replica")
    after: list[str] = []

    async def settled() -> bool:
        after.append(await one_call(len(after)))
        return after[-5:] == ["ok"] * 5
    await async_wait_until(settled, timeout=60, what="calls succeeding against the new primary")
    assert [await one_turn(100 + n) for n in range(3)] == ["ok"] * 3  # and chat turns too
    print(f"failover: calls {dict(call_outcomes)} of 60, chat turns {dict(turn_outcomes)} of 18 in flight; "
          f"{len(after) - 5} calls before the pool settled")
    return call_outcomes, turn_outcomes
