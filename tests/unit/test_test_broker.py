"""The shipped in-memory broker: a Hands worker's handler answers through it with no Redis loop running."""

from __future__ import annotations

from pathlib import Path

import pytest

from bus.protocol import ChatCancel, ToolExecute, ToolResult, ToolsAvailable, ToolsList, now_ms
from bus.testing import TestBroker
from hands.config import HandsSettings
from hands.worker import HandsWorker
from tests.conftest import SHIPPED_SKILLS
from tests.fakes import fake_bus


async def test_a_hands_worker_answers_through_the_broker(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("alpha")
    bus = fake_bus()
    worker = HandsWorker(bus, HandsSettings(workspace=tmp_path / "ws", skill_dirs=[SHIPPED_SKILLS]), worker_id="w1")
    broker = TestBroker()
    broker.subscribe(bus.keys.hands_requests, worker.handle)
    try:
        replies = await broker.publish(bus.keys.hands_requests, ToolsList(reply_to="t:inbox"))
        assert [stream for stream, _ in replies] == ["t:inbox"]
        offered = broker.sent["t:inbox"][0]
        assert isinstance(offered, ToolsAvailable) and "word_count" in {t.name for t in offered.tools}
        call = ToolExecute(tool="read_file", args={"path": "a.txt"}, reply_to="t:inbox", deadline=now_ms() + 10_000)
        await broker.publish(bus.keys.hands_requests, call)
        result = broker.sent["t:inbox"][1]
        assert isinstance(result, ToolResult) and result.success and "alpha" in str(result.data)
    finally:
        await bus.close()


async def test_replies_reach_their_own_handlers_and_a_loop_is_stopped() -> None:
    broker = TestBroker()
    seen: list[str] = []

    async def ping(message, stream):  # type: ignore[no-untyped-def]
        seen.append(stream)
        return [("pong", ChatCancel(session_id=message.session_id, by="ping"))]

    async def pong(message, stream):  # type: ignore[no-untyped-def]
        seen.append(stream)
        return []

    broker.subscribe("ping", ping)
    broker.subscribe("pong", pong)
    await broker.publish("ping", ChatCancel(session_id="s"))
    assert seen == ["ping", "pong"] and broker.sent["pong"][0] == ChatCancel(session_id="s", by="ping")
    broker.subscribe("pong", ping)  # now they answer each other for ever
    with pytest.raises(RuntimeError, match="in a loop"):
        await broker.publish("ping", ChatCancel(session_id="s"))
