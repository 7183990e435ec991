"""The jobs' scheduler on a real Redis, inside real Brains (a fake model): due instants fired once and
recorded with their turn's outcome, two Brains never firing one instant twice, a fenced lease, pause and
resume, and the catch-up of instants a stopped scheduler missed."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from brain.config import BrainSettings, HeartbeatSettings, SchedulerSettings
from brain.llm import Completion, ToolCall
from brain.scheduler import Scheduler
from brain.testing import FunctionModel
from brain.worker import BrainWorker
from bus.codec import decode
from bus.metrics import Meter
from bus.protocol import ChatMessage
from bus.streams import Bus
from hands.config import HandsSettings
from hands.worker import HandsWorker
from memory.jobs import Job, JobStore
from memory.schedule import Schedule
from tests.conftest import async_wait_until


def answer(messages: list[dict[str, Any]], _tools: Any) -> Completion:
    return Completion(text=f"done: {messages[-1]['content']}")


@pytest.fixture
def brains(brain_pool):
    """Start ``count`` Brains whose schedulers tick fast (and a Hands worker)."""
    async def start(count: int, **scheduler: Any) -> list[BrainWorker]:
        settings = BrainSettings(model="fake/model", tools_list_timeout_s=2.0,
                                 scheduler=SchedulerSettings(tick_s=0.2, lease_s=2.0, **scheduler))
        made: list[BrainWorker] = await brain_pool(settings, FunctionModel(answer), count)
        return made

    return start


def every(name: str, seconds: float, **fields: Any) -> Job:
    return Job(name=name, owner="alice", message=f"tick from {name}",
               schedule=Schedule(kind="every", every_s=seconds, anchor=time.time()), **fields)


async def test_an_interval_job_is_first_due_one_interval_after_it_was_made(bus: Bus) -> None:
    made = 1_796_176_654.5
    for n, stored_at in enumerate((made, made + 0.0004, made + 5)):  # at once, within the millisecond, later
        job = Job(name=f"tick-{n}", owner="alice", message="m",
                  schedule=Schedule(kind="every", every_s=3600, anchor=made))
        assert await JobStore(bus).add(job, now=stored_at) == made + 3600
    soon = Job(name="soon", owner="alice", message="m", schedule=Schedule(kind="at", at=made))
    assert await JobStore(bus).add(soon, now=made) == made  # a one-off at this very moment is due now


async def test_an_instant_a_fraction_of_a_millisecond_ahead_is_not_due_yet(bus: Bus) -> None:
    store, at = JobStore(bus), 1_796_176_654.5
    await store.add(Job(name="soon", owner="alice", message="m", schedule=Schedule(kind="at", at=at)), now=at - 5)
    assert await store.due(at - 0.0004) == []  # rounding the bound to the millisecond fired it early
    assert [job_id for job_id, _ in await store.due(at)] == ["alice/soon"]
    assert all(due <= at + 0.0009 for _, due in await store.due(at + 0.0009))


async def test_two_brains_fire_each_instant_once_and_record_its_outcome(bus: Bus, brains) -> None:
    store = JobStore(bus)
    await brains(2)
    job = every("ping", 1.0)
    await store.add(job)
    runs = await async_wait_until(lambda: _ended(store, job.id, 3), timeout=30, what="three runs ended")
    fired = [r for r in runs if r.status == "fired"]
    assert len({r.due for r in runs}) == len(runs)  # one record per instant
    assert all(r.outcome == "ok" and r.answer == "done: tick from ping" and r.turn for r in fired)
    assert [round(b.due - a.due, 3) for a, b in itertools.pairwise(runs)] == [1.0] * (len(runs) - 1)
    sent = [m for m in await _inbox(bus) if m.session_id == "alice/cron-ping"]
    assert sorted(m.message_id for m in sent) == sorted(r.turn for r in fired)  # each sent once, as alice
    assert {m.sender for m in sent} == {"alice"} and {m.job for m in sent} == {job.id}
    results = [decode(f).type for _, f in await bus.redis.xrange(bus.keys.jobs_results)]
    assert set(results) == {"chat:reply"}  # only each turn's end: nobody watches a job's turn live


async def test_paused_nothing_is_due_and_resumed_it_goes_on_from_now(bus: Bus, brains) -> None:
    store = JobStore(bus)
    await brains(1)
    job = every("pausable", 1.0)
    await store.add(job)
    await async_wait_until(lambda: _ended(store, job.id, 1), timeout=30, what="a first run")
    paused = await store.set_paused(job, True)
    assert await store.next_due(job.id) is None  # not in the due set: no scheduler can fire it
    assert (await store.get(job.id)).paused  # type: ignore[union-attr]
    before = {r.due for r in await store.runs(job.id)}
    resumed_at = time.time()
    await store.set_paused(paused, False)
    assert (await store.next_due(job.id) or 0) > resumed_at  # from now on, not what was missed meanwhile
    runs = await async_wait_until(lambda: _ended(store, job.id, len(before) + 2), timeout=30,
                                  what="runs after the resume")
    assert all(r.status == "fired" and r.due > resumed_at for r in runs if r.due not in before)


async def test_a_scheduler_that_lost_its_lease_cannot_fire(bus: Bus) -> None:
    store = JobStore(bus)
    job = every("fenced", 60.0)
    job.schedule.anchor = time.time() - 120
    first = await store.add(job, now=job.schedule.anchor)  # due two minutes ago
    scheduler = Scheduler(bus, SchedulerSettings(), instance_id="brain-old", meter=Meter())
    assert await scheduler.lease.take()
    await bus.redis.set(bus.keys.scheduler_lease, "brain-new")  # it stalled; another took the lease
    await scheduler.tick()
    assert await store.runs(job.id) == [] and await store.next_due(job.id) == pytest.approx(first, abs=0.001)
    assert not scheduler.lease.held and not await _inbox(bus)


async def test_instants_missed_while_no_scheduler_ran_follow_the_catch_up_policy(bus: Bus) -> None:
    store = JobStore(bus)
    now = time.time()
    once, skip = every("once", 60.0), every("skipper", 60.0, catch_up="skip")
    for job in (once, skip):
        job.schedule.anchor = now - 660  # made eleven minutes ago: ten instants missed and one on time
        await store.add(job, now=now - 660)
    scheduler = Scheduler(bus, SchedulerSettings(grace_s=5), instance_id="brain-back", meter=Meter())
    assert await scheduler.lease.take()
    await scheduler.tick()
    ran = await store.runs(once.id)
    assert [r.status for r in ran].count("fired") == 1 and len(ran) == 11 and ran[-1].status == "fired"
    assert all("catch-up run_once" in r.reason for r in ran[:-1])
    skipped = await store.runs(skip.id)
    assert [r.status for r in skipped] == ["skipped"] * 10 + ["fired"]  # the on-time one still runs
    assert (await store.next_due(once.id) or 0) > now


async def _ended(store: JobStore, job_id: str, count: int) -> list[Any] | None:
    runs = await store.runs(job_id)
    return runs if len([r for r in runs if r.outcome]) >= count else None


async def _inbox(bus: Bus) -> list[ChatMessage]:
    entries = await bus.redis.xrange(bus.keys.brain_inbox)
    return [m for _, fields in entries if isinstance(m := decode(fields), ChatMessage)]


async def test_the_schedule_tool_makes_lists_and_cancels_its_senders_own_jobs(bus: Bus, engine, call) -> None:
    await engine(tools={"owners": ["owner", "boss"]})
    store = JobStore(bus)
    refused = await call("schedule", {"action": "create", "name": "x", "every": "1h", "message": "m"},
                         sender="telegram:42")
    assert not refused.success and refused.error.code.value == "PERMISSION_DENIED"  # owner-only by default
    made = await call("schedule", {"action": "create", "name": "standup", "cron": "0 8 * * 1-5",
                                   "tz": "Europe/Berlin", "message": "What is on today?"}, sender="boss")
    assert made.success and made.data["owner"] == "boss"
    assert made.data["schedule"] == "cron '0 8 * * 1-5' (Europe/Berlin)"
    assert (await store.get("boss/standup")) is not None and (await store.next_due("boss/standup") or 0) > time.time()
    again = await call("schedule", {"action": "create", "name": "standup", "every": "2h", "message": "m"},
                       sender="boss")
    assert not again.success and "already exists" in again.error.message
    bad = await call("schedule", {"action": "create", "name": "typo", "cron": "daily", "message": "m"},
                     sender="boss")
    assert not bad.success and "is not a cron expression" in bad.error.message
    listed = await call("schedule", {"action": "list"}, sender="owner")
    assert listed.data["jobs"] == []  # the owner's own list: not boss's
    assert [j["name"] for j in (await call("schedule", {"action": "list"}, sender="boss")).data["jobs"]] == ["standup"]
    assert (await call("schedule", {"action": "cancel", "name": "standup"}, sender="boss")).success
    assert await store.get("boss/standup") is None


async def test_a_chat_user_allowed_to_schedule_gets_answers_in_their_chat_within_limits(bus: Bus, engine, call) -> None:
    await engine(tools={"owner_only": []})
    quick = await call("schedule", {"action": "create", "name": "spam", "every": "10s", "message": "m"},
                       sender="telegram:42")
    assert not quick.success and "every 60s at most often" in quick.error.message
    made = await call("schedule", {"action": "create", "name": "remind", "every": "1h", "message": "stretch"},
                      sender="telegram:42")
    assert made.success and made.data["deliver"] == ["telegram:42"] and made.data["session_id"] == \
        "telegram:42/cron-remind"


async def test_a_heartbeat_skips_an_idle_owner_stays_silent_with_nothing_to_say_and_else_is_delivered(
        bus: Bus, tmp_path: Path) -> None:
    said = {"text": "HEARTBEAT_OK"}
    settings = BrainSettings(model="fake/model", tools_list_timeout_s=2.0,  # priced: a heartbeat has a budget
                             prices={"fake/model": {"input_per_mtok": 1.0, "output_per_mtok": 1.0}},
                             scheduler=SchedulerSettings(tick_s=0.2, lease_s=2.0),
                             heartbeats={"main": {"every": "1s", "idle_after": "1h", "deliver": ["telegram:42"]}})
    brain = BrainWorker(bus, settings, instance_id="brain-hb", heartbeat_s=0.5,
                        llm=FunctionModel(lambda _m, _t: Completion(text=said["text"])))
    hands = HandsWorker(bus, HandsSettings(workspace=tmp_path), worker_id="hands-hb", heartbeat_s=0.5)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(worker.run(stop)) for worker in (brain, hands)]
    store = JobStore(bus)
    try:
        idle = await async_wait_until(lambda: _recorded(store, "owner/heartbeat-main", "skipped"), timeout=30,
                                      what="a heartbeat skipped")
        assert "has not talked to the agent for ever" in idle.reason and "idle owner" in idle.reason
        assert not await bus.redis.xlen(bus.keys.brain_inbox)  # no turn, no model call for an idle owner
        await bus.redis.set(bus.keys.identity_seen("owner"), str(time.time()))  # the owner talked just now
        quiet = await async_wait_until(lambda: _recorded(store, "owner/heartbeat-main", "fired", ended=True),
                                       timeout=30, what="a heartbeat with nothing to say")
        assert quiet.answer == "HEARTBEAT_OK" and quiet.outcome == "ok"
        said["text"] = "Your build failed twice tonight."
        await async_wait_until(lambda: bus.redis.xlen(bus.keys.channel_outbox("telegram")), timeout=30,
                               what="a report delivered")
        sent = [decode(f) for _, f in await bus.redis.xrange(bus.keys.channel_outbox("telegram"))]
        assert {(m.chat, m.text) for m in sent} == {("42", "Your build failed twice tonight.")}  # never the OK
        job = await store.get("owner/heartbeat-main")
        assert job is not None and job.heartbeat and job.daily_usd == 0.25 and job.catch_up == "skip"
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def _recorded(store: JobStore, job_id: str, status: str, *, ended: bool = False) -> Any:
    return next((r for r in await store.runs(job_id) if r.status == status and (r.outcome or not ended)), None)


async def test_a_stalled_scheduler_is_reported_by_status_and_readyz(bus: Bus) -> None:
    from bus.pool import scheduler_state
    from gateway.server.observe import metrics_text, readiness

    store = JobStore(bus)
    assert (await scheduler_state(bus, time.time()))["state"] == "idle"  # nothing scheduled: nothing to report
    job = every("late", 60.0)
    job.schedule.anchor = time.time() - 150
    await store.add(job, now=job.schedule.anchor)  # made 150 s ago, first due 90 s ago, and no Brain has looked
    state = await scheduler_state(bus, time.time())
    assert state["state"] == "stalled" and state["overdue_job"] == job.id and state["overdue_s"] >= 89
    _, body = await readiness(bus, max_backlog=1000)
    assert any("the jobs' scheduler has stalled: a job is" in p for p in body["problems"])
    assert "alice" not in json.dumps(body)  # answered without a token: no identity's name
    exposition, _ = await metrics_text(bus)
    assert b"pincer_scheduler_stalled 1.0" in exposition and b"pincer_jobs_scheduled 1.0" in exposition
    scheduler = Scheduler(bus, SchedulerSettings(grace_s=5), instance_id="brain-now", meter=Meter())
    assert await scheduler.lease.take()
    await scheduler.tick()  # a holder catches up: running again
    assert (await scheduler_state(bus, time.time()))["state"] == "running"


async def test_cron_across_a_daylight_saving_change_with_its_scheduler_replaced_fires_each_instant_once(
        bus: Bus) -> None:
    berlin = ZoneInfo("Europe/Berlin")
    start = datetime(2027, 10, 31, 1, 40, tzinfo=berlin).timestamp()  # the night the clocks go back
    clock = [start]
    store = JobStore(bus)
    job = Job(name="halfhourly", owner="alice", message="m",
              schedule=Schedule(kind="cron", cron="*/30 * * * *", tz="Europe/Berlin"))
    await store.add(job, now=start)
    schedulers = [Scheduler(bus, SchedulerSettings(grace_s=600), instance_id=f"brain-dst{n}", meter=Meter(),
                            clock=lambda: clock[0]) for n in range(3)]
    for step in range(180):  # three real hours, a minute at a time
        clock[0] += 60
        if step % 7 == 0:  # the holder dies (its lease gone with it) and the next Brain takes over
            await bus.redis.delete(bus.keys.scheduler_lease)
        holder = schedulers[step // 7 % 3]
        if await holder.lease.take():
            await holder.tick()
    runs = await store.runs(job.id)
    expected = job.schedule.instants(start, clock[0])
    assert [datetime.fromtimestamp(t, berlin).strftime("%H:%M%z") for t in expected][:4] == [
        "02:00+0200", "02:30+0200", "02:00+0100", "02:30+0100"]  # the repeated hour's instants, both times
    assert [r.due for r in runs] == expected and {r.status for r in runs} == {"fired"}
    assert len({r.turn for r in runs}) == len(runs)


async def test_a_jobs_command_that_needs_approval_is_refused_at_once(bus: Bus, tmp_path: Path) -> None:
    def model(messages: list[dict[str, Any]], _tools: Any) -> Completion:
        if messages[-1]["role"] == "user":
            return Completion(tool_calls=[ToolCall(id="c1", name="exec", arguments='{"command": "echo hi"}')])
        return Completion(text=f"result: {messages[-1]['content']}")

    settings = BrainSettings(model="fake/model", tools_list_timeout_s=2.0, scheduler=SchedulerSettings(enabled=False))
    brain = BrainWorker(bus, settings, instance_id="brain-ask", heartbeat_s=0.5, llm=FunctionModel(model))
    hands = HandsWorker(bus, HandsSettings.model_validate({
        "workspace": tmp_path, "exec": {"mode": "ask", "approval_timeout_s": 600},
        "sandbox": {"allow_degraded": True}}), worker_id="hands-ask", heartbeat_s=0.5)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(worker.run(stop)) for worker in (brain, hands)]
    scheduler = Scheduler(bus, SchedulerSettings(), instance_id="brain-ask", meter=Meter())
    results = asyncio.create_task(scheduler.results.run(stop))
    store = JobStore(bus)
    try:
        job = every("nightly", 3600.0)
        await store.add(job)
        message = job.turn(reply_to=bus.keys.jobs_results)  # a run by hand, as `cron run` records one
        run = await store.record_hand_run(job, message)
        await bus.publish(bus.keys.brain_inbox, message)
        ended = await async_wait_until(lambda: _recorded(store, job.id, "fired", ended=True), timeout=30,
                                       what="the job's turn ended (not waiting 600 s for a yes)")
        assert ended.turn == run.turn and "APPROVAL_DENIED" in ended.answer
        assert "no chat that could ask" in ended.answer
    finally:
        stop.set()
        await asyncio.gather(*tasks, results)


async def test_heartbeats_follow_the_config_and_one_paused_by_hand_stays_paused(bus: Bus) -> None:
    store = JobStore(bus)
    scheduler = Scheduler(bus, SchedulerSettings(), instance_id="brain-hbsync", meter=Meter(),
                          heartbeats={"main": HeartbeatSettings(every="30m")})
    await scheduler.sync_heartbeats(time.time())
    job = await store.get("owner/heartbeat-main")
    assert job is not None and job.heartbeat and job.schedule.every_s == 1800
    await store.set_paused(job, True)
    await scheduler.sync_heartbeats(time.time())  # the config unchanged: the job left as it is
    assert (await store.get(job.id)).paused and await store.next_due(job.id) is None  # type: ignore[union-attr]
    scheduler.heartbeats = {"main": HeartbeatSettings(every="1h")}
    await scheduler.sync_heartbeats(time.time())  # changed: remade, and still paused
    changed = await store.get(job.id)
    assert changed is not None and changed.schedule.every_s == 3600 and changed.paused
    assert await store.next_due(job.id) is None
    scheduler.heartbeats = {}
    await scheduler.sync_heartbeats(time.time())  # no longer configured: gone
    assert await store.get(job.id) is None
