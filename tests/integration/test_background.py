"""Background processes through the bus: yield, poll, log, write, kill, routing to the owner, a lost owner."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bus.protocol import ErrorCode
from bus.streams import Bus
from tests.conftest import async_wait_until, processes_matching


@pytest.fixture
async def workers(engine, ws: Path):
    settings = {"workspace": ws, "sandbox": {"allow_degraded": True}, "background": {"keep_s": 30}}
    return [await engine(**settings), await engine(**settings)]


async def test_a_slow_command_yields_a_background_process_that_can_be_polled_to_its_end(workers, call,
                                                                                        bus: Bus) -> None:
    started = await call("exec", {"command": "echo start; sleep 1; echo done; exit 3", "yield_ms": 300})
    assert started.success and started.data["status"] == "running" and started.data["stdout"] == "start\n"
    process_id = started.data["process_id"]
    owner = started.metadata.worker_id
    # Its record lapses even if its worker is killed -9 now: after its timeout and the keep after it
    # (keep_s 30 and a minute, and what is left of the call's timeout)
    assert await bus.redis.ttl(bus.keys.hands_process(process_id)) > 30 + 60 + 5
    finished = await call("process", {"action": "poll", "process_id": process_id, "wait_s": 10})
    since_start = finished.data["stdout"]
    while finished.data["status"] == "running":  # a poll may wake on the new line before the exit
        finished = await call("process", {"action": "poll", "process_id": process_id, "wait_s": 10})
        since_start += finished.data["stdout"]
    assert finished.data["status"] == "exited" and finished.data["exit_code"] == 3
    assert since_start == "done\n"  # each poll gives only what is new since the last
    assert finished.metadata.worker_id == owner  # answered by the worker that owns the process
    log = await call("process", {"action": "log", "process_id": process_id, "lines": 5})
    assert log.data["stdout"] == "start\ndone"
    listed = await call("process", {"action": "list"})
    listing = [(p["process_id"], p["status"], p["worker"]) for p in listed.data["processes"]]
    assert listing == [(process_id, "exited", owner)]


async def test_every_call_about_a_background_process_reaches_its_owner(workers, call) -> None:
    started = await call("exec", {"command": "sleep 30.75", "background": True})  # a duration no other process has
    owner = started.metadata.worker_id
    answers = await asyncio.gather(*(call("process", {"action": "poll", "process_id": started.data["process_id"]})
                                     for _ in range(12)))
    assert {a.metadata.worker_id for a in answers} == {owner}
    assert all(a.data["status"] == "running" for a in answers)
    killed = await call("process", {"action": "kill", "process_id": started.data["process_id"]})
    assert killed.data["status"] == "killed" and killed.metadata.worker_id == owner
    await async_wait_until(lambda: not processes_matching("sleep 30.75"), timeout=10, what="the process gone")


async def test_write_to_a_background_process(workers, call) -> None:
    started = await call("exec", {"command": "read name; echo hello $name", "background": True})
    process_id = started.data["process_id"]
    await call("process", {"action": "write", "process_id": process_id, "data": "pincer\n", "eof": True})
    polled = await call("process", {"action": "poll", "process_id": process_id, "wait_s": 10})
    said = polled.data["stdout"]
    while polled.data["status"] == "running":  # a poll may wake on the line before the exit; each gives what is new
        polled = await call("process", {"action": "poll", "process_id": process_id, "wait_s": 10})
        said += polled.data["stdout"]
    assert polled.data["exit_code"] == 0 and said == "hello pincer\n"


async def test_a_background_process_outliving_its_timeout_is_killed(workers, call) -> None:
    started = await call("exec", {"command": "sleep 45.5", "background": True, "timeout": 1})
    process_id = started.data["process_id"]
    first = await call("process", {"action": "poll", "process_id": process_id})
    # The premise: it runs (a sandbox that could not start it shows here, with its stderr).
    assert first.data["status"] in ("running", "timed_out"), first.data
    polled = await call("process", {"action": "poll", "process_id": process_id, "wait_s": 10})
    while polled.data["status"] == "running":
        polled = await call("process", {"action": "poll", "process_id": process_id, "wait_s": 10})
    assert polled.data["status"] == "timed_out", polled.data
    await async_wait_until(lambda: not processes_matching("sleep 45.5"), timeout=10, what="the timed-out process gone")


async def test_a_background_process_whose_worker_is_gone_reports_worker_lost(workers, call, bus: Bus) -> None:
    record = {"worker": "hands-ghost", "status": "running"}
    await bus.redis.hset(bus.keys.hands_process("proc-0123456789"), mapping=record)
    lost = await call("process", {"action": "poll", "process_id": "proc-0123456789"})
    assert lost.error.code is ErrorCode.WORKER_LOST and "hands-ghost" in lost.error.message
    unknown = await call("process", {"action": "kill", "process_id": "proc-abcdefabcd"})
    assert unknown.error.code is ErrorCode.FILE_NOT_FOUND
    missing = await call("process", {"action": "poll"})
    assert missing.error.code is ErrorCode.INVALID_ARGUMENTS


async def test_background_processes_belong_to_their_session_and_are_capped(engine, call, ws: Path) -> None:
    await engine(workspace=ws, sandbox={"allow_degraded": True}, background={"keep_s": 30, "max_per_session": 2})
    first = await call("exec", {"command": "sleep 31.25", "background": True})
    second = await call("exec", {"command": "sleep 31.5", "background": True})
    assert first.success and second.success
    process_id = first.data["process_id"]
    for action in ("poll", "log", "kill"):  # another session cannot see, read or stop it
        other = await call("process", {"action": action, "process_id": process_id}, session="someone-else")
        assert other.error.code is ErrorCode.FILE_NOT_FOUND, other
    assert (await call("process", {"action": "list"}, session="someone-else")).data["processes"] == []
    assert (await call("process", {"action": "poll", "process_id": process_id})).data["status"] == "running"

    third = await call("exec", {"command": "sleep 31.75", "background": True})
    assert third.error.code is ErrorCode.RESOURCE_EXHAUSTED and "max_per_session" in third.error.message
    assert not processes_matching("sleep 31.75")  # refused before it started
    foreground = await call("exec", {"command": "sleep 0.5; echo stayed", "yield_ms": 100})
    assert foreground.success and foreground.data["status"] == "exited" and foreground.data["stdout"] == "stayed\n"
    elsewhere = await call("exec", {"command": "sleep 0.2", "background": True}, session="someone-else")
    assert elsewhere.success  # the cap is per session
    for started in (first, second):
        await call("process", {"action": "kill", "process_id": started.data["process_id"]})
    await async_wait_until(lambda: not processes_matching("sleep 31."), timeout=10, what="the processes gone")
