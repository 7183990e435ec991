"""An ask_user question outlives the Brain that asked it: killed -9 while the question waits, a new Brain takes
the turn over and waits on the same call; the person answers over HTTP; the turn ends once, and the provider
is asked for each response it gave in full once.

Real Redis, Gateway, Brain and Hands processes; litellm streams from the scripted model.
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

import httpx
import pytest

from bus.codec import decode
from bus.presence import alive
from bus.protocol import ToolExecute, now_ms
from bus.streams import Bus
from tests.conftest import Processes, async_wait_until, gateway_client, gateway_health, wait_until
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.e2e

ASK = 'CALL ask_user {"questions": [{"text": "Ship it?", "choices": ["yes", "not yet"]}]}'


@pytest.fixture
def restart_env(processes: Processes, pincer_env: dict[str, str]) -> dict[str, str]:
    processes.env = {**pincer_env, "PINCER_REDIS__CLAIM_IDLE_S": "1", "PINCER_REDIS__REAP_INTERVAL_S": "0.3",
                     "PINCER_BRAIN__SESSION_LEASE_S": "1"}
    return processes.env


def ask(env: dict[str, str], text: str) -> httpx.Response:
    """The message to the session, answered when its turn ends (on whichever Brain ends it)."""
    with gateway_client(env, timeout=180) as client:
        return client.post("/v1/sessions/asked/messages", json={"text": text})


async def tool_calls_sent(bus: Bus) -> list[ToolExecute]:
    rows: list[tuple[bytes, dict[bytes, bytes]]] = await bus.redis.xrange(  # type: ignore[assignment]  # bytes
        bus.keys.hands_requests)
    return [m for m in (decode(fields) for _, fields in rows) if isinstance(m, ToolExecute)]


async def brains(bus: Bus, n: int) -> list[str]:
    found = await alive(bus, "brain")
    return found if len(found) == n else []


async def pending_questions(bus: Bus) -> list[str]:
    prefix = bus.keys.question("")
    return [key.decode().removeprefix(prefix) async for key in bus.redis.scan_iter(match=prefix + "*")]


async def test_a_question_outlives_its_brain_and_the_answer_ends_the_turn_once(
        bus: Bus, processes: Processes, restart_env: dict[str, str], scripted_llm: ScriptedLLM) -> None:
    processes.start("gateway", name="gateway")
    first = processes.start("brain", name="brain-a")
    processes.start("hands", name="hands")
    wait_until(lambda: (h := gateway_health(restart_env)) and h.get("brains") == 1 and h.get("hands") == 1,
               timeout=60, what="the Gateway counting a Brain and a Hands worker")
    (brain_a,) = await async_wait_until(lambda: brains(bus, 1), timeout=60, what="brain A ready")
    answer = asyncio.create_task(asyncio.to_thread(ask, restart_env, ASK))
    (question_id,) = await async_wait_until(lambda: pending_questions(bus), timeout=60, what="the question asked")

    processes.start("brain", name="brain-b")
    await async_wait_until(lambda: brains(bus, 2), timeout=120, what="brain B ready")
    processes.stop(first, signal.SIGKILL)
    await bus.redis.zrem(bus.keys.alive("brain"), brain_a)  # gone now, not after its heartbeat lapses

    async def sent_twice() -> list[ToolExecute]:
        calls = await tool_calls_sent(bus)
        return calls if len(calls) == 2 else []

    again = await async_wait_until(sent_twice, timeout=60, what="brain B sending the same call again")
    assert again[0].call_id == again[1].call_id and not answer.done()
    # brain.tool_deadline_s is 60 s, but a question may wait hands.ask_user.timeout_s (300 s): its calls say so
    assert all(call.deadline - now_ms() > 240_000 for call in again)
    assert await pending_questions(bus) == [question_id]  # the same question still waits: nobody asked twice

    with gateway_client(restart_env) as client:
        wrong = client.post(f"/v1/questions/{question_id}", json={"answers": ["maybe"]})
        assert wrong.status_code == 400 and "one of yes, not yet" in wrong.text
        answered = client.post(f"/v1/questions/{question_id}", json={"answers": ["not yet"]})
    assert answered.status_code == 200 and answered.json()["complete"] is True, answered.text

    reply = await asyncio.wait_for(answer, 180)
    assert reply.status_code == 200, reply.text
    assert reply.json()["text"] == 'RESULT ask_user: {"answers": ["not yet"], "by": "owner"}'
    with gateway_client(restart_env) as client:
        transcript: list[dict[str, Any]] = client.get("/v1/sessions/asked").json()["entries"]
    assert [e["role"] for e in transcript] == ["user", "assistant", "tool", "assistant"]
    # Each response the provider gave in full was asked for once.
    assert [r["messages"][-1]["role"] for r in scripted_llm.requests] == ["user", "tool"]
    assert [r["messages"][-1]["role"] for r in scripted_llm.answered] == ["user", "tool"]
    shown = processes.run("record", "show", "asked", "--json")
    assert shown.returncode == 0, shown.stderr
    assert [row["kind"] for row in json.loads(shown.stdout)].count("question") == 1
