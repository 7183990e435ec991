"""The jobs' scheduler under chaos: three Brain processes, jobs every two seconds and one-offs, and the
Brain holding the scheduler's lease killed -9 again and again (a new one started each time). Every due
instant ends with exactly one record, none is fired twice, and the turns it started are answered."""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
import time
from typing import Any

import pytest

from bus.settings import RedisSettings
from bus.streams import Bus
from memory.jobs import Job, JobStore, Run
from memory.schedule import Schedule
from memory.sessions import SessionStore
from tests.conftest import Processes, wait_until
from tests.e2e.conftest import start_stack

pytestmark = pytest.mark.e2e


def with_bus(env: dict[str, str], work: Any) -> Any:
    async def run() -> Any:
        bus = Bus.from_settings(RedisSettings(prefix=env["PINCER_REDIS__PREFIX"]), env["PINCER_REDIS_URL"])
        try:
            return await work(bus)
        finally:
            await bus.redis.aclose()

    return asyncio.run(run())


def test_killing_the_scheduling_brain_again_and_again_fires_each_instant_once(
        processes: Processes, pincer_env: dict[str, str]) -> None:
    processes.env = {**pincer_env, "PINCER_BRAIN__SCHEDULER__TICK_S": "0.2", "PINCER_BRAIN__SCHEDULER__LEASE_S": "3"}
    start_stack(processes, hands=1, brain=False)
    names = itertools.count()
    for _ in range(3):
        processes.start("brain", name=f"brain-{next(names)}")
    start = time.time() + 2
    jobs = [Job(name=f"every{n}", owner="owner", message=f"tick {n}",
                schedule=Schedule(kind="every", every_s=2, anchor=start + n * 0.5)) for n in range(4)]
    jobs += [Job(name=f"once{n}", owner="owner", message=f"once {n}", schedule=Schedule(kind="at", at=start + 8 * n))
             for n in range(1, 4)]
    minutely = Job(name="minutely", owner="owner", message="each minute",
                   schedule=Schedule(kind="cron", cron="* * * * *", tz="Europe/Berlin"))
    jobs.append(minutely)  # a cron job too (across daylight-saving changes: tests/unit/test_job_schedules.py)

    async def add(bus: Bus) -> None:
        for job in jobs:
            await JobStore(bus).add(job)

    with_bus(processes.env, add)
    kills = 0
    while time.time() < start + 36:
        time.sleep(random.uniform(3, 6))  # the chaos' own rhythm, not a wait for a fact
        holder = with_bus(processes.env, lambda bus: bus.redis.get(bus.keys.scheduler_lease))
        pid = with_bus(processes.env, lambda bus, h=holder: bus.redis.hget(bus.keys.instance("brain", h.decode()),
                                                                           "pid")) if holder else None
        victim = next((p for _, p, _ in processes.started if pid and p.pid == int(pid) and p.poll() is None), None)
        if victim is not None:
            processes.stop(victim, sig=signal.SIGKILL)
            kills += 1
            processes.start("brain", name=f"brain-{next(names)}")
    assert kills >= 5

    async def pause(bus: Bus) -> None:  # nothing fires after this: what was fired is then checked whole
        store = JobStore(bus)
        for job in jobs:
            if (found := await store.get(job.id)) is not None:
                await store.set_paused(found, True)

    with_bus(processes.env, pause)

    def settled(bus: Bus) -> Any:
        async def check() -> dict[str, list[Run]] | None:
            store = JobStore(bus)
            found = {job.id: await store.runs(job.id, limit=500) for job in jobs}
            fired = [r for runs in found.values() for r in runs if r.status == "fired"]
            return found if all(r.outcome for r in fired) else None
        return check()

    records: dict[str, list[Run]] = wait_until(lambda: with_bus(processes.env, settled), timeout=90,
                                               what="every fired instant's turn answered")
    sent = with_bus(processes.env, lambda bus: _turns_started(bus, [job.session_id for job in jobs]))
    lags = []
    for job in jobs:
        runs = records[job.id]
        dues = [r.due for r in runs]
        if not dues:  # the minutely job, when no minute began during the run
            assert job is minutely
            continue
        assert len(dues) == len(set(dues)), f"{job.id}: an instant recorded twice"
        since = job.created_at if job.schedule.kind == "cron" else job.schedule.anchor
        expected = job.schedule.instants(since - 0.001, max(dues))
        assert [round(d, 3) for d in dues] == [round(e, 3) for e in expected], f"{job.id}: an instant lost"
        fired = [r for r in runs if r.status == "fired"]
        assert {r.status for r in runs} <= {"fired", "skipped"} and all(r.reason for r in runs if r.status != "fired")
        assert sorted(sent[job.session_id]) == sorted(r.turn for r in fired), \
            f"{job.id}: a turn started twice, or one not recorded"
        assert all(r.outcome == "ok" for r in fired)
        lags += [r.fired_at - r.due for r in fired if r.fired_at]
    every = [records[j.id] for j in jobs[:4]]
    assert sum(len(runs) for runs in every) >= 4 * 15  # ~36 s of instants every 2 s, each recorded
    assert all(len(records[j.id]) == 1 for j in jobs[4:7])  # each one-off: one record
    print(f"scheduler chaos: {kills} kills, {len(lags)} fired, lag p50 {sorted(lags)[len(lags) // 2]:.3f}s, "
          f"max {max(lags):.3f}s")


async def _turns_started(bus: Bus, sessions: list[str]) -> dict[str, list[str]]:
    """Each session's turns as its transcript has them: the message id of every user entry (a turn resumed
    by another Brain finds its entry and adds none; an instant fired twice would start two turns)."""
    store = SessionStore(bus.redis, bus.keys)
    found = {}
    for session in sessions:
        entries = await store.load(session)
        found[session] = [e.marks.message_id for e in entries if e.role == "user" and e.marks.message_id]
    return found
