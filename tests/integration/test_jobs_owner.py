"""Whose jobs `/v1/cron` reaches, on a real Redis: a chat token only its own (naming another owner is refused
outright, as with sessions), an operator its own by default, another identity's with ``?owner=NAME`` and
every one's with ``?owner=*``, and each action on a listed job (pause, resume, run, runs, remove)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from bus.presence import Presence
from bus.streams import Bus
from gateway.config import GatewaySettings
from gateway.server.app import Gateway
from gateway.tokens import TokenStore
from memory.jobs import JobStore

OWNER_TOKEN = "pincer_test_owner_token_for_jobs_owner_0123456789"
HOURLY = {"every": "1h", "message": "what changed?"}


@pytest.fixture
async def clients(bus: Bus) -> AsyncIterator[Any]:
    """An in-process Gateway on the test's Redis, with a Brain announced alive that reads nothing (a run's
    turn stays open): ``client(token)`` gives an HTTP client for a token."""
    async with contextlib.AsyncExitStack() as stack:
        brain = Presence(bus, "brain", "brain-silent", interval_s=0.5, details=lambda: {"agents": "main"})
        await brain.start()
        stack.push_async_callback(brain.stop)
        made = Gateway(bus, GatewaySettings.model_validate({"token": OWNER_TOKEN}), instance_id="gw-owner",
                       heartbeat_s=0.5)
        app = made.app()
        await stack.enter_async_context(made.lifespan(app))

        async def client(token: str) -> httpx.AsyncClient:
            return await stack.enter_async_context(httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8780",
                headers={"Authorization": f"Bearer {token}"}))

        yield client


async def _token(bus: Bus, name: str) -> str:
    return await TokenStore(bus.redis, bus.keys).create(name, scope="chat")


async def _made(client: httpx.AsyncClient, name: str) -> None:
    made = await client.post("/v1/cron", json={"name": name, **HOURLY})
    assert made.status_code == 201, made.text


def _ids(listed: httpx.Response) -> list[str]:
    assert listed.status_code == 200, listed.text
    return [job["id"] for job in listed.json()["jobs"]]


async def test_an_operator_lists_one_owners_jobs_or_everyones_a_chat_token_only_its_own(bus: Bus, clients) -> None:
    alice, bob = await clients(await _token(bus, "alice")), await clients(await _token(bus, "bob"))
    owner = await clients(OWNER_TOKEN)
    await _made(alice, "daily")
    await _made(bob, "weekly")
    await _made(owner, "mine")
    assert _ids(await alice.get("/v1/cron")) == ["alice/daily"]
    assert _ids(await owner.get("/v1/cron")) == ["owner/mine"]  # an operator's own list is its own
    assert _ids(await owner.get("/v1/cron?owner=bob")) == ["bob/weekly"]
    everyone = (await owner.get("/v1/cron?owner=*")).json()["jobs"]
    assert [(job["id"], job["owner"]) for job in everyone] == [
        ("alice/daily", "alice"), ("bob/weekly", "bob"), ("owner/mine", "owner")]
    for path in ("/v1/cron?owner=bob", "/v1/cron?owner=*"):
        refused = await alice.get(path)  # naming another owner is an operator's act, refused outright
        assert refused.status_code == 403 and "operator" in refused.json()["error"]["message"], path


async def test_a_chat_token_reaches_no_other_identitys_job_by_any_action(bus: Bus, clients) -> None:
    alice, bob = await clients(await _token(bus, "alice")), await clients(await _token(bus, "bob"))
    await _made(bob, "weekly")
    store = JobStore(bus)
    before = await store.get("bob/weekly")
    asks = [("GET", "/v1/cron/weekly"), ("GET", "/v1/cron/weekly/runs"), ("POST", "/v1/cron/weekly/pause"),
            ("POST", "/v1/cron/weekly/run"), ("DELETE", "/v1/cron/weekly")]
    for method, path in asks:
        assert (await alice.request(method, path)).status_code == 404, path  # a bare name is alice's own
        named = await alice.request(method, f"{path}?owner=bob")
        assert named.status_code == 403 and "operator" in named.json()["error"]["message"], path
    assert await store.get("bob/weekly") == before  # not paused, not removed
    assert await store.runs("bob/weekly", limit=10) == []  # and never run


async def test_an_operator_pauses_resumes_runs_and_removes_another_owners_job(bus: Bus, clients) -> None:
    alice = await clients(await _token(bus, "alice"))
    owner = await clients(OWNER_TOKEN)
    await _made(alice, "daily")
    assert (await owner.post("/v1/cron/daily/pause")).status_code == 404  # its own "daily": there is none
    paused = await owner.post("/v1/cron/daily/pause?owner=alice")
    assert paused.status_code == 200 and paused.json()["paused"] is True, paused.text
    assert (await alice.get("/v1/cron/daily")).json()["paused"] is True  # alice sees it paused
    resumed = await owner.post("/v1/cron/daily/resume?owner=alice")
    assert resumed.json()["paused"] is False and resumed.json()["next_due"] is not None
    ran = await owner.post("/v1/cron/daily/run?owner=alice")
    assert ran.status_code == 202, ran.text
    runs = (await owner.get("/v1/cron/daily/runs?owner=alice")).json()
    assert runs["job"] == "alice/daily" and [run["status"] for run in runs["runs"]] == ["fired"]
    assert (await alice.get("/v1/cron/daily/runs")).json()["runs"] == runs["runs"]  # the same record, alice's
    assert (await owner.get("/v1/cron/daily?owner=not/a-name")).status_code == 400  # not an identity
    removed = await owner.delete("/v1/cron/daily?owner=alice")
    assert removed.json() == {"removed": "alice/daily"}
    assert _ids(await alice.get("/v1/cron")) == []
