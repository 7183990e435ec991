"""Jobs pass their owner's limits through every door, on a real Redis: `cron run` through the Gateway's HTTP
(message rate, open turns, the Brains' backlog), parallel creates against the cap, the scheduler's own fires
(rate, backlog, an owner who is gone), the model's jobs (a floor and a cap for every sender, announced), and
an identity's jobs removed with it (token revoked, user unpaired, hook removed)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from brain.config import SchedulerSettings
from brain.scheduler import Scheduler
from bus.admission import Admission, RateLimits
from bus.codec import decode
from bus.config import Config
from bus.metrics import Meter
from bus.presence import Presence
from bus.protocol import ChannelSend, ChatCancel, ChatMessage, ChatReply
from bus.streams import Bus
from gateway.cli import channels as channels_cli
from gateway.cli import hooks as hooks_cli
from gateway.cli.tokens import manage_tokens
from gateway.config import GatewaySettings
from gateway.server.app import Gateway
from gateway.server.hooks import HookStore
from gateway.tokens import TokenStore
from memory.jobs import Job, JobStore, OwnerKind, Run
from memory.schedule import Schedule
from tests.conftest import async_wait_until

OWNER_TOKEN = "pincer_test_owner_token_for_job_limits_0123456789"
HOURLY = {"every": "1h", "message": "what changed?"}


@pytest.fixture
async def gateway(bus: Bus) -> AsyncIterator[Any]:
    """An in-process Gateway on the test's Redis, with a Brain announced alive that reads nothing (turns stay
    open, messages stay unread): ``start(**limits)`` gives an HTTP client for a token."""
    async with contextlib.AsyncExitStack() as stack:
        brain = Presence(bus, "brain", "brain-silent", interval_s=0.5, details=lambda: {"agents": "main"})
        await brain.start()
        stack.push_async_callback(brain.stop)

        async def start(**limits: Any) -> Gateway:
            settings = GatewaySettings.model_validate({"token": OWNER_TOKEN, "limits": limits})
            made = Gateway(bus, settings, instance_id="gw-jobs", heartbeat_s=0.5)
            app = made.app()
            await stack.enter_async_context(made.lifespan(app))
            made.client = lambda token: stack.enter_async_context(httpx.AsyncClient(  # type: ignore[attr-defined]
                transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8780",
                headers={"Authorization": f"Bearer {token}"}))
            return made

        yield start


async def _chat_token(bus: Bus, name: str = "alice") -> str:
    return await TokenStore(bus.redis, bus.keys).create(name, scope="chat")


async def _inbox(bus: Bus) -> list[ChatMessage]:
    entries = await bus.redis.xrange(bus.keys.brain_inbox)
    return [m for _, fields in entries if isinstance(m := decode(fields), ChatMessage)]


async def _made(client: httpx.AsyncClient, name: str = "daily") -> None:
    made = await client.post("/v1/cron", json={"name": name, **HOURLY})
    assert made.status_code == 201, made.text


async def test_cron_run_past_messages_per_minute_is_refused_and_sends_nothing(bus: Bus, gateway) -> None:
    client = await (await gateway(messages_per_minute=3, burst=3)).client(await _chat_token(bus))
    await _made(client)
    for _ in range(3):
        assert (await client.post("/v1/cron/daily/run")).status_code == 202
    refused = await client.post("/v1/cron/daily/run")
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "RATE_LIMITED"
    assert "messages a minute" in refused.json()["error"]["message"] and refused.headers["Retry-After"]
    sent = await _inbox(bus)
    assert len(sent) == 3 and {m.sender for m in sent} == {"alice"} and {m.job for m in sent} == {"alice/daily"}
    assert len(await JobStore(bus).runs("alice/daily")) == 3  # the refused run left no record


async def test_cron_run_past_open_turns_per_token_is_refused_until_one_ends(bus: Bus, gateway) -> None:
    made = await gateway(open_turns_per_token=2)
    client = await made.client(await _chat_token(bus))
    await _made(client)
    runs = [(await client.post("/v1/cron/daily/run")).json() for _ in range(2)]
    refused = await client.post("/v1/cron/daily/run")
    assert refused.status_code == 429 and "turns running" in refused.json()["error"]["message"]
    assert len(await _inbox(bus)) == 2
    first = next(m for m in await _inbox(bus) if m.message_id == runs[0]["turn"])
    await bus.publish(first.reply_to, ChatReply(session_id=first.session_id, message_id=first.message_id,
                                                text="all quiet"))
    # The ended turn gives its place back, and its outcome goes where the scheduler records job outcomes.
    await async_wait_until(lambda: bus.redis.xlen(bus.keys.jobs_results), timeout=10, what="the outcome passed on")
    again = await async_wait_until(_status(client, "/v1/cron/daily/run", 202), timeout=10, what="a place free")
    assert again and len(await _inbox(bus)) == 3


def _status(client: httpx.AsyncClient, path: str, want: int) -> Any:
    async def check() -> bool:
        return (await client.post(path)).status_code == want
    return check


async def test_cron_run_past_the_brains_backlog_is_refused_and_sends_nothing(bus: Bus, gateway) -> None:
    client = await (await gateway(max_inbox_backlog=2)).client(await _chat_token(bus))
    await _made(client)
    for _ in range(2):
        await bus.publish(bus.keys.brain_inbox, ChatCancel(session_id="someone/else"))
    refused = await client.post("/v1/cron/daily/run")
    assert refused.status_code == 503 and "waiting for a Brain" in refused.json()["error"]["message"]
    assert await bus.redis.xlen(bus.keys.brain_inbox) == 2 and not await JobStore(bus).runs("alice/daily")


@pytest.mark.parametrize("operator", [False, True])
async def test_forty_parallel_creates_leave_exactly_the_cap(bus: Bus, gateway, operator: bool) -> None:
    made = await gateway(jobs={"max_jobs": 20, "operator_max_jobs": 20})
    client = await made.client(OWNER_TOKEN if operator else await _chat_token(bus))
    answers = await asyncio.gather(*(client.post("/v1/cron", json={"name": f"j{n}", **HOURLY}) for n in range(40)))
    codes = sorted(a.status_code for a in answers)
    assert codes == [201] * 20 + [403] * 20
    assert all("the most it may keep" in a.json()["error"]["message"] for a in answers if a.status_code == 403)
    owner = "owner" if operator else "alice"
    assert len(await JobStore(bus).all(owner=owner)) == 20 and await bus.redis.zcard(bus.keys.jobs_due) == 20


async def test_a_chat_tokens_job_under_the_floor_is_refused(bus: Bus, gateway) -> None:
    client = await (await gateway(jobs={"min_every": "5m"})).client(await _chat_token(bus))
    refused = await client.post("/v1/cron", json={"name": "often", "every": "2m", "message": "x"})
    assert refused.status_code == 403 and "every 5m at most often" in refused.json()["error"]["message"]
    assert await JobStore(bus).all(owner="alice") == []


# The scheduler's own fires.

def _due_now(name: str, owner: str, *, kind: OwnerKind = "") -> Job:
    return Job(name=name, owner=owner, owner_kind=kind, message="m",
               schedule=Schedule(kind="every", every_s=3600, anchor=time.time() - 3600.5))


async def _tick(bus: Bus, *, rate: RateLimits | None = None) -> Scheduler:
    scheduler = Scheduler(bus, SchedulerSettings(), instance_id="brain-limits", meter=Meter(), rate=rate)
    assert await scheduler.lease.take()
    await scheduler.tick()
    return scheduler


async def _only_run(store: JobStore, job_id: str) -> Run:
    runs = await store.runs(job_id)
    assert len(runs) == 1, runs
    return runs[0]


async def test_a_fire_past_its_owners_message_rate_is_recorded_skipped(bus: Bus) -> None:
    store, rate = JobStore(bus), RateLimits(messages_per_minute=1, burst=1)
    await store.add(job := _due_now("busy", "alice"), now=time.time() - 1)
    await Admission(bus, rate).take_message("alice")  # alice's one message this minute, spent by her chat
    await _tick(bus, rate=rate)
    run = await _only_run(store, job.id)
    assert run.status == "skipped" and "messages a minute" in run.reason and "alice" in run.reason
    assert await _inbox(bus) == [] and await store.next_due(job.id)  # still scheduled: the next instant runs


async def test_a_fire_past_its_owners_text_a_day_is_recorded_skipped(bus: Bus) -> None:
    store, rate = JobStore(bus), RateLimits(text_bytes_per_day=1_000)
    await store.add(job := _due_now("busy", "alice"), now=time.time() - 1)
    await Admission(bus, rate).take_message("alice", size=1_000)  # alice's day of text, spent by her chat
    await _tick(bus, rate=rate)
    run = await _only_run(store, job.id)
    assert run.status == "skipped" and "text_mb_per_day" in run.reason and "alice" in run.reason
    assert await _inbox(bus) == []


async def test_a_fire_past_the_brains_backlog_is_recorded_skipped(bus: Bus) -> None:
    store = JobStore(bus)
    await store.add(job := _due_now("queued", "alice"), now=time.time() - 1)
    for _ in range(3):
        await bus.publish(bus.keys.brain_inbox, ChatCancel(session_id="someone/else"))
    await _tick(bus, rate=RateLimits(max_inbox_backlog=3))
    run = await _only_run(store, job.id)
    assert run.status == "skipped" and "waiting for a Brain" in run.reason
    assert await _inbox(bus) == []


async def test_a_fire_within_the_owners_limits_is_charged_to_the_owner(bus: Bus) -> None:
    store, rate = JobStore(bus), RateLimits(messages_per_minute=1, burst=1)
    await store.add(job := _due_now("fine", "alice"), now=time.time() - 1)
    await _tick(bus, rate=rate)
    assert (await _only_run(store, job.id)).status == "fired" and len(await _inbox(bus)) == 1
    short = await Admission(bus, rate).take_message("alice")
    assert short is not None and short.short == "messages"  # the fire took alice's one message


@pytest.mark.parametrize(("owner", "kind", "why"), [
    ("bob", "token", "token was revoked"), ("hook:ci", "hook", "hook was removed"),
    ("telegram:42", "paired", "unpaired")])
async def test_a_job_whose_owner_is_gone_is_not_fired_and_says_why(bus: Bus, owner: str, kind: OwnerKind,
                                                                   why: str) -> None:
    store = JobStore(bus)
    await store.add(orphan := _due_now("orphan", owner, kind=kind), now=time.time() - 1)
    await store.add(_due_now("alive", "carol", kind="token"), now=time.time() - 1)
    await TokenStore(bus.redis, bus.keys).create("carol", scope="chat")
    await _tick(bus)
    run = await _only_run(store, orphan.id)
    assert run.status == "skipped" and why in run.reason and "no longer exists" in run.reason
    assert await store.next_due(orphan.id) is None  # out of the due set: never fired later either
    assert [m.job for m in await _inbox(bus)] == ["carol/alive"]  # only the job whose owner exists


# A job runs as what its maker may do: the agents its door stamped travel with it.

async def test_a_job_carries_its_makers_agents_to_every_run(bus: Bus, gateway, engine, call) -> None:
    made = await gateway()
    kid = await made.client(await TokenStore(bus.redis, bus.keys).create("kid", scope="chat", agents=["main"]))
    owner = await made.client(OWNER_TOKEN)
    for client in (kid, owner):
        assert (await client.post("/v1/cron", json={"name": "daily", **HOURLY})).status_code == 201
    assert (await JobStore(bus).get("kid/daily")).agents == ["main"]  # type: ignore[union-attr]
    assert (await JobStore(bus).get("owner/daily")).agents == ["*"]  # type: ignore[union-attr]
    ran = await kid.post("/v1/cron/daily/run")
    assert ran.status_code == 202, ran.text
    assert [m.agents for m in await _inbox(bus)] == [["main"]]  # `cron run` is stamped at admission
    await engine()
    for name, stamp in (("stamped", ["main", "ops"]), ("unstamped", None)):
        done = await call("schedule", {"action": "create", "name": name, "every": "1h", "message": "m"},
                          sender="owner", agents=stamp)
        assert done.success, done.error
        job = await JobStore(bus).get(f"owner/{name}")
        assert job is not None and job.agents == stamp and job.turn().agents == stamp  # the model's job: its turn's


async def test_a_job_whose_maker_may_not_use_its_agent_is_not_fired_and_says_why(bus: Bus) -> None:
    store = JobStore(bus)
    planted = _due_now("ops-night", "kid").model_copy(update={"agent": "ops", "agents": ["main"]})
    await store.add(planted, now=time.time() - 1)  # written into Redis past the API's check
    await store.add(fine := _due_now("main-night", "kid").model_copy(update={"agents": ["main"]}),
                    now=time.time() - 1)
    await _tick(bus)
    run = await _only_run(store, planted.id)
    assert run.status == "skipped" and "may not use agent 'ops' (it may use main)" in run.reason
    assert await store.next_due(planted.id) is None
    assert [(m.job, m.agents) for m in await _inbox(bus)] == [(fine.id, ["main"])]


# An identity's jobs go with it, through each door that removes one.

def _config(bus: Bus, redis_url: str) -> Config:
    return Config(raw={"redis": {"url": redis_url, "prefix": bus.keys.prefix}})


async def _jobs_of(store: JobStore, *owners: str) -> dict[str, list[str]]:
    return {owner: [j.name for j in await store.all(owner=owner)] for owner in owners}


async def test_a_revoked_tokens_jobs_are_gone_and_nobody_elses(bus: Bus, redis_url: str) -> None:
    store = JobStore(bus)
    await TokenStore(bus.redis, bus.keys).create("dave", scope="chat")
    for owner, name in [("dave", "a"), ("dave", "b"), ("dave.x", "a"), ("owner", "a")]:
        await store.add(Job(name=name, owner=owner, owner_kind="token", message="m",
                            schedule=Schedule(kind="every", every_s=3600, anchor=time.time())))
    assert await manage_tokens(_config(bus, redis_url), "revoke", "dave", scope="chat", agents=[], as_json=False) == 0
    assert await _jobs_of(store, "dave", "dave.x", "owner") == {"dave": [], "dave.x": ["a"], "owner": ["a"]}
    assert await store.next_due("dave/a") is None and not await bus.redis.exists(bus.keys.job_runs("dave/a"))
    assert await bus.redis.zcard(bus.keys.jobs_due) == 2


async def test_an_unpaired_users_and_a_removed_hooks_jobs_are_gone(bus: Bus, redis_url: str) -> None:
    store, config = JobStore(bus), _config(bus, redis_url)
    await bus.redis.hset(bus.keys.channel_paired("telegram"), "42", "cli 0 @x")
    await HookStore(bus.redis, bus.keys).add("ci", agent="main", template="build: {payload}", deliver=None)
    for owner in ("telegram:42", "telegram:420", "hook:ci", "hook:cid"):
        await store.add(Job(name="nightly", owner=owner, message="m",
                            schedule=Schedule(kind="every", every_s=3600, anchor=time.time())))
    assert await asyncio.to_thread(channels_cli.command, argparse.Namespace(
        action="unpair", arg="42", channel="telegram", json=False), config) == 0
    assert await asyncio.to_thread(hooks_cli.command, argparse.Namespace(
        action="rm", name="ci", json=False, agent="main", template=None, deliver=None, grace=0.0), config) == 0
    assert await _jobs_of(store, "telegram:42", "telegram:420", "hook:ci", "hook:cid") == {
        "telegram:42": [], "telegram:420": ["nightly"], "hook:ci": [], "hook:cid": ["nightly"]}


# The model's jobs: a floor and a cap for every sender, and the owner told.

async def test_a_model_job_under_the_floor_is_refused_even_for_the_owner(bus: Bus, engine, call) -> None:
    await engine(tools={"schedule": {"min_every": "5m"}})
    for every in ("1s", "10s", "4m"):
        refused = await call("schedule", {"action": "create", "name": "poll", "every": every,
                                          "message": "fetch the URL and do what it says"}, sender="owner")
        assert not refused.success and refused.error.code.value == "PERMISSION_DENIED"
        assert "every 5m at most often" in refused.error.message
    assert await JobStore(bus).all(owner="owner") == [] and not await bus.redis.xlen(bus.keys.alerts)


async def test_the_owners_model_jobs_are_capped_and_each_is_announced(bus: Bus, engine, call) -> None:
    await engine(tools={"schedule": {"operator_max_jobs": 2, "announce": ["telegram:99"]}})
    for name in ("one", "two"):
        made = await call("schedule", {"action": "create", "name": name, "every": "1h", "message": "m"},
                          sender="owner")
        assert made.success and made.data["made_by"] == "model" and made.data["announced_to"] == ["telegram:99"]
    third = await call("schedule", {"action": "create", "name": "three", "every": "1h", "message": "m"},
                       sender="owner")
    assert not third.success and "already has 2 jobs" in third.error.message
    assert [j.name for j in await JobStore(bus).all(owner="owner")] == ["one", "two"]
    told = [decode(f) for _, f in await bus.redis.xrange(bus.keys.channel_outbox("telegram"))]
    assert [(m.chat, "'one'" in m.text or "'two'" in m.text) for m in told if isinstance(m, ChannelSend)] == [
        ("99", True), ("99", True)]
    assert "scheduled a job as owner" in told[0].text  # type: ignore[union-attr]
    assert await bus.redis.xlen(bus.keys.alerts) == 2


async def test_a_chat_users_model_job_is_announced_in_their_chat_and_capped(bus: Bus, engine, call) -> None:
    await engine(tools={"owner_only": [], "schedule": {"max_jobs": 1}})
    await bus.redis.hset(bus.keys.channel_paired("telegram"), "42", "cli 0 @x")
    made = await call("schedule", {"action": "create", "name": "remind", "every": "1h", "message": "stretch"},
                      sender="telegram:42")
    assert made.success and made.data["announced_to"] == ["telegram:42"] and made.data["owner_kind"] == "paired"
    more = await call("schedule", {"action": "create", "name": "more", "every": "1h", "message": "m"},
                      sender="telegram:42")
    assert not more.success and "already has 1 jobs" in more.error.message
    told = [decode(f) for _, f in await bus.redis.xrange(bus.keys.channel_outbox("telegram"))]
    assert len(told) == 1 and isinstance(told[0], ChannelSend) and told[0].chat == "42"
