"""A Brain killed -9 at each point of a one-tool turn: the turn ends once, the tool runs once, the provider is
never asked twice for a response it gave in full.

Real Redis, Gateway, Brain and Hands processes; litellm streams from the scripted model. The points:
``streaming`` (the first response still streams: held mid-way by the scripted model), ``answered`` (it is
in the record and the transcript, the tool call not yet sent to Hands), ``tool`` (the tool runs in Hands,
held by a gate file the test opens) and ``results`` (the tool's result is in the transcript, the second
model request not yet sent). The two points between writes are reached through the Brain's test seam
(brain/pause.py); the killed Brain's turn is then taken over by a new one, from the transcript.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from brain.pause import ENV as PAUSE_AT
from bus.codec import decode
from bus.presence import alive
from bus.protocol import ToolExecute
from bus.streams import Bus
from tests.conftest import (
    SHIPPED_SKILLS,
    Processes,
    async_wait_until,
    gateway_client,
    gateway_health,
    make_skill,
    wait_until,
)
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.e2e

# Not idempotent: Hands runs it at most once per call id. It notes its start and its end, and between them
# waits for the gate file (opened by the test at once, or after the kill when the kill is while it runs).
TALLY = """
import pathlib, time

def handle(args, ctx):
    log, gate = pathlib.Path(args["log"]), pathlib.Path(args["gate"])
    with log.open("a") as out:
        out.write(f"start {ctx.call_id}\\n")
    while not gate.exists():
        time.sleep(0.01)
    with log.open("a") as out:
        out.write(f"done {ctx.call_id}\\n")
    return "tallied"
"""
ANSWER = "RESULT tally: tallied"


@pytest.fixture
def kill_env(processes: Processes, pincer_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    skills = tmp_path / "tally-skills"
    make_skill(skills, "tally", "name: tally\ndescription: counts its runs\nidempotent: false\ntimeout: 120\n"
               "parameters: {log: {type: string}, gate: {type: string}}", TALLY)
    processes.env = {**pincer_env, "PINCER_HANDS__SKILL_DIRS": json.dumps([str(SHIPPED_SKILLS), str(skills)]),
                     "PINCER_REDIS__CLAIM_IDLE_S": "1", "PINCER_REDIS__REAP_INTERVAL_S": "0.3",
                     "PINCER_BRAIN__SESSION_LEASE_S": "1"}
    return processes.env


def entries(env: dict[str, str]) -> list[dict[str, Any]]:
    """The session's transcript, as the Gateway shows it."""
    with gateway_client(env) as client:
        found: list[dict[str, Any]] = client.get("/v1/sessions/killed").json()["entries"]
    return found


def ask(env: dict[str, str], text: str) -> httpx.Response:
    """The message to the session, answered when its turn ends (on whichever Brain ends it)."""
    with gateway_client(env, timeout=180) as client:
        return client.post("/v1/sessions/killed/messages", json={"text": text})


def roles(env: dict[str, str]) -> list[str]:
    return [e["role"] for e in entries(env)]


def tally(log: Path) -> list[str]:
    return log.read_text().split("\n")[:-1] if log.exists() else []


async def tool_calls_sent(bus: Bus) -> list[ToolExecute]:
    """The tool calls Brains sent to Hands (the stream also carries the tool list requests)."""
    rows: list[tuple[bytes, dict[bytes, bytes]]] = await bus.redis.xrange(  # type: ignore[assignment]  # bytes
        bus.keys.hands_requests)
    sent = [decode(fields) for _, fields in rows]
    return [message for message in sent if isinstance(message, ToolExecute)]


async def brains(bus: Bus, n: int) -> list[str]:
    """The live Brains, once there are ``n`` (a Brain is alive once it has warmed up and takes turns)."""
    found = await alive(bus, "brain")
    return found if len(found) == n else []


def logged(processes: Processes, name: str, text: str) -> bool:
    return any(text in log.read_text(errors="replace") for who, _, log in processes.started if who == name)


@pytest.mark.parametrize("point", ["streaming", "answered", "tool", "results"])
async def test_a_brain_killed_at_each_point_of_a_tool_turn_never_has_the_provider_answer_twice(
        bus: Bus, processes: Processes, kill_env: dict[str, str], scripted_llm: ScriptedLLM, tmp_path: Path,
        point: str) -> None:
    log, gate = tmp_path / "tally.log", tmp_path / "gate"
    if point != "tool":
        gate.touch()
    processes.start("gateway", name="gateway")
    paused = {PAUSE_AT: point} if point in ("answered", "results") else None
    first = processes.start("brain", name="brain-a", extra_env=paused)
    processes.start("hands", name="hands")
    wait_until(lambda: (h := gateway_health(kill_env)) and h.get("brains") == 1 and h.get("hands") == 1,
               timeout=60, what="the Gateway counting a Brain and a Hands worker")
    (brain_a,) = await async_wait_until(lambda: brains(bus, 1), timeout=60, what="brain A ready")
    held = "HOLD 3\n" if point == "streaming" else ""  # after the role: the call's name, two pieces of its arguments
    text = held + "CALL tally " + json.dumps({"log": str(log), "gate": str(gate)})
    answer = asyncio.create_task(asyncio.to_thread(ask, kill_env, text))

    if point == "streaming":
        await async_wait_until(lambda: scripted_llm.holding == 1, timeout=60, what="the first response held")
        assert roles(kill_env) == ["user"]
    elif point == "answered":
        await async_wait_until(lambda: logged(processes, "brain-a", "paused at answered"), timeout=60,
                               what="brain A paused with the first response")
        assert roles(kill_env) == ["user", "assistant"] and not await tool_calls_sent(bus)
    elif point == "tool":
        await async_wait_until(lambda: tally(log), timeout=60, what="the tool running")
        assert roles(kill_env) == ["user", "assistant"]
    else:
        await async_wait_until(lambda: logged(processes, "brain-a", "paused at results"), timeout=60,
                               what="brain A paused with the tool's result")
        assert roles(kill_env) == ["user", "assistant", "tool"] and len(scripted_llm.requests) == 1
    # Brain A stays at the point until it is killed; brain B, ready by then, takes the turn over at once.
    processes.start("brain", name="brain-b")
    await async_wait_until(lambda: brains(bus, 2), timeout=120, what="brain B ready")
    assert not answer.done()
    processes.stop(first, signal.SIGKILL)
    await bus.redis.zrem(bus.keys.alive("brain"), brain_a)  # gone now, not after its heartbeat lapses
    scripted_llm.release()  # a held stream ends unfinished: its Brain is gone
    if point == "tool":  # brain B sends the same call again while it still runs: Hands waits for that run
        async def sent_twice() -> list[ToolExecute]:
            calls = await tool_calls_sent(bus)
            return calls if len(calls) == 2 else []

        again = await async_wait_until(sent_twice, timeout=60, what="brain B sending the call again")
        assert again[0].call_id == again[1].call_id
        gate.touch()
    reply = await asyncio.wait_for(answer, 180)

    assert reply.status_code == 200 and reply.json()["text"] == ANSWER, reply.text
    transcript = entries(kill_env)
    assert [e["role"] for e in transcript] == ["user", "assistant", "tool", "assistant"]
    assert [e.get("content") for e in transcript].count(ANSWER) == 1
    ran = tally(log)
    call_id = ran[0].removeprefix("start ")
    assert ran == [f"start {call_id}", f"done {call_id}"]  # the tool ran once
    # Each response the provider gave in full was asked for once; only a stream cut short was asked again.
    asked = [r["messages"][-1]["role"] for r in scripted_llm.requests]
    assert [r["messages"][-1]["role"] for r in scripted_llm.answered] == ["user", "tool"]
    if point == "streaming":
        assert asked == ["user", "user", "tool"]
        cut, repeated = scripted_llm.requests[:2]
        assert all(body is not cut for body in scripted_llm.answered) and repeated["messages"] == cut["messages"]
    else:
        assert asked == ["user", "tool"]
    shown = processes.run("record", "show", "killed", "--json")
    assert shown.returncode == 0, shown.stderr
    assert [row["kind"] for row in json.loads(shown.stdout)] == ["turn", "model", "tool", "model"]
