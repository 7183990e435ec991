"""Operating the pool from the command line: `pincer status`, `pincer dead`, and what they say without Redis."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from brain.config import BrainSettings
from bus.codec import decode, encode
from bus.protocol import ChatMessage, ToolExecute, now_ms
from bus.redis_server import free_port
from bus.streams import Bus
from tests.conftest import Processes, async_wait_until
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e


async def run(processes: Processes, *args: str):
    return await asyncio.to_thread(processes.run, *args)


async def test_status_shows_workers_queues_and_dead_letters(bus: Bus, processes: Processes) -> None:
    for i in range(2):
        processes.start("hands", name=f"hands-{i}", extra_env={"PINCER_HANDS__CONCURRENCY__GLOBAL": str(4 + i)})
    processes.start("brain", name="brain")
    await wait_for(bus, "hands", 2)
    await wait_for(bus, "brain", 1)
    await bus.redis.xadd(bus.keys.hands_requests, {b"type": b"nonsense"})  # garbage: goes to dead

    async def one_dead() -> int:
        found = json.loads((await run(processes, "status", "--json")).stdout)
        return found if found["dead"] == 1 else None

    for _ in range(100):
        if found := await one_dead():
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the garbage entry never reached dead")
    hands = found["instances"]["hands"]
    assert sorted(int(w["capacity"]) for w in hands) == [4, 5]
    assert all(w["pid"].isdigit() and w["host"] and w["version"] and int(w["tools"]) > 10 for w in hands)
    brains = found["instances"]["brain"]
    shipped = BrainSettings()  # the Brain runs with the shipped bounds
    assert [(b["in_flight"], b["waiting"], b["capacity"]) for b in brains] == [
        ("0", "0", str(shipped.max_turns))]
    assert found["instances"]["gateway"] == []
    requests = next(s for s in found["streams"] if s["stream"] == "hands:requests")
    assert requests["consumers"] >= 2 and requests["pending"] == 0 and requests["undelivered"] == 0

    table = await run(processes, "status")
    assert table.returncode == 0 and "hands:requests" in table.stdout and "dead letters: 1" in table.stdout


async def test_status_shows_the_pools_backlog_per_lane(bus: Bus, processes: Processes, ws: Path) -> None:
    processes.start("hands", name="hands-0", extra_env={"PINCER_HANDS__CONCURRENCY__GLOBAL": "1",
                                                        "PINCER_WORKSPACE": str(ws)})
    await wait_for(bus, "hands", 1)
    for i in range(5):  # one runs; four wait in the lane of code calls
        await bus.publish(bus.keys.hands_requests, ToolExecute(
            tool="exec", args={"command": "sleep 20"}, session_id=f"s{i}", reply_to="nowhere",
            deadline=now_ms() + 60_000))

    async def backlog_shown() -> dict | None:
        found = json.loads((await run(processes, "status", "--json")).stdout)
        lane = found["backlog"].get("category:code")
        return found if lane and lane["ready"] + lane["waiting"] == 4 else None

    found = await async_wait_until(backlog_shown, timeout=30, what="four calls in the backlog")
    assert found["backlog"]["category:code"]["oldest_s"] > 0
    lane = next(s for s in found["streams"] if s["stream"] == "hands:lane:{category:code}")
    assert lane["consumers"] == 1 and lane["pending"] == 0  # nothing taken: no room
    table = (await run(processes, "status")).stdout
    assert "Backlog" in table and "category:code" in table


async def test_dead_list_show_retry_and_purge(bus: Bus, processes: Processes) -> None:
    # Two entries set aside by hand, as a consumer does: one message worth retrying, one piece of garbage.
    lost = ChatMessage(session_id="s", text="try me again", reply_to="nowhere")
    good = await bus.redis.xadd(bus.keys.dead, {b"dead:source": bus.keys.brain_inbox.encode(),
                                                b"dead:reason": b"handler crashed: boom", **encode(lost)})
    junk = await bus.redis.xadd(bus.keys.dead, {b"dead:source": bus.keys.hands_requests.encode(),
                                                b"dead:reason": b"no type", b"type": b"??"})
    listed = json.loads((await run(processes, "dead", "list", "--json")).stdout)
    assert [e["id"] for e in listed] == [junk.decode(), good.decode()]  # newest first
    assert listed[1]["reason"] == "handler crashed: boom" and listed[1]["type"] == "chat:message"

    shown = json.loads((await run(processes, "dead", "show", good.decode())).stdout)
    assert shown["message"]["text"] == "try me again"
    junk_shown = json.loads((await run(processes, "dead", "show", junk.decode())).stdout)
    assert junk_shown["message"] is None and "malformed" in junk_shown

    missing = await run(processes, "dead", "show", "1-1")
    assert missing.returncode == 1 and "no dead-letter entry '1-1'" in missing.stderr
    nothing = await run(processes, "dead", "retry")
    assert nothing.returncode == 1 and "--all" in nothing.stderr

    retried = await run(processes, "dead", "retry", good.decode())
    assert retried.returncode == 0 and "1 entry sent back" in retried.stdout
    back = await bus.redis.xrange(bus.keys.brain_inbox)
    assert decode(back[-1][1]).text == "try me again" and b"dead:reason" not in back[-1][1]
    assert await bus.redis.xlen(bus.keys.dead) == 1

    purged = await run(processes, "dead", "purge", "--all")
    assert purged.returncode == 0 and "1 entry purged" in purged.stdout
    assert await bus.redis.xlen(bus.keys.dead) == 0


@pytest.mark.parametrize("command", [["status"], ["tools"], ["dead", "list"], ["token", "list"], ["trace", "s1"],
                                     ["channels"], ["channels", "pair", "ABCDEFGH"], ["hooks", "list"]])
def test_every_command_says_plainly_when_redis_is_unreachable(processes: Processes, command: list[str]) -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    done = processes.run(*command, extra_env={"PINCER_REDIS_URL": nobody}, timeout=60)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "pincer: error: cannot reach Redis" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "retrying" not in done.stderr and "Hands worker" not in done.stderr, done.stderr  # the cause, alone


def test_a_gateway_whose_port_is_taken_says_so_and_logs_no_address(processes: Processes) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = processes.run("gateway", "--port", str(port), timeout=60)
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert f"gateway could not listen on 127.0.0.1:{port}" in said and "gateway.port" in said, said
    assert "gateway on http" not in said and "Traceback" not in said, said  # never claims an address it lacks
