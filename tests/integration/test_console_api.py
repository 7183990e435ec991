"""The HTTP API the web console uses, in-process on a real Redis: spend, channels and pairing, tokens and
hooks, note search and recall. Each endpoint's happy path, what a chat token is refused or shown, and bad
input's 400."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from brain.config import BrainSettings
from brain.spend import Governor
from bus.config import Config
from bus.metrics import Meter
from bus.presence import Presence
from bus.protocol import ErrorCode
from bus.replies import ReplyInbox
from bus.streams import Bus
from gateway.channels.access import Access
from gateway.cli import budget as budget_cli
from gateway.cli import channels as channels_cli
from gateway.config import GatewaySettings
from gateway.server.app import Gateway
from gateway.server.hooks import HookStore, signed_headers
from gateway.server.memory_api import PoolRecall
from gateway.tokens import TokenStore
from gateway.turns.refusal import Refused
from hands.approvals import remembered
from memory.jobs import Job, JobStore
from memory.longterm import SHARED, LongTermMemory
from memory.schedule import Schedule
from memory.spend import SpendView
from tests.conftest import async_wait_until

OWNER_TOKEN = "pincer_test_owner_token_for_the_console_api_0123"
MODEL = "fake/priced"
PRICES = {MODEL: {"input_per_mtok": 1000.0, "output_per_mtok": 3000.0}}
BUDGET = {"daily_usd": 5.0, "identities": {"alice": {"daily_usd": 0.01}}}


@contextlib.asynccontextmanager
async def gateway_clients(bus: Bus, *, limits: dict[str, Any] | None = None, spend: SpendView | None = None,
                          channels: list[str] | None = None) -> AsyncIterator[Any]:
    """``client(token)``: an HTTP client of an in-process Gateway on the test's Redis (the owner's token: an
    operator's), with ``limits`` as the gateway section's."""
    async with contextlib.AsyncExitStack() as stack:
        settings = GatewaySettings.model_validate({"token": OWNER_TOKEN, **({"limits": limits} if limits else {})})
        gateway = Gateway(bus, settings, instance_id="gw-console", heartbeat_s=0.5, spend=spend or SpendView(),
                          channels=channels or [])
        app = gateway.app()
        await stack.enter_async_context(gateway.lifespan(app))

        async def client(token: str = OWNER_TOKEN) -> httpx.AsyncClient:
            return await stack.enter_async_context(httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8780",
                headers={"Authorization": f"Bearer {token}"}))

        yield client


@pytest.fixture
async def api(bus: Bus) -> AsyncIterator[Any]:
    """``api(token)``: a client of the Gateway the console tests share (a budget, two channels)."""
    async with gateway_clients(bus, spend=SpendView.model_validate({"budget": BUDGET}),
                               channels=["email", "telegram"]) as client:
        yield client


async def _chat_token(bus: Bus, name: str = "alice") -> str:
    return await TokenStore(bus.redis, bus.keys).create(name, scope="chat")


async def _status(client: httpx.AsyncClient, path: str, want: int) -> bool:
    return (await client.get(path)).status_code == want


def _refused(answer: httpx.Response, status: int, *words: str) -> None:
    assert answer.status_code == status, answer.text
    message = answer.json()["error"]["message"]
    assert all(word in message for word in words), message


# --- /v1/spend ---


async def _spent(bus: Bus, identity: str, prompt_tokens: int, *, days_ago: int = 0) -> None:
    """A model call of ``prompt_tokens`` (at $1000 per million: $0.001 each) settled for ``identity`` by the
    Brain's own governor, as if ``days_ago`` days ago."""
    settings = BrainSettings(model=MODEL, prices=PRICES, budget=BUDGET)
    governor = Governor(bus, settings, Meter(), clock=lambda: time.time() - days_ago * 86_400)
    await governor.settle(None, "main", identity, MODEL, {"prompt_tokens": prompt_tokens, "completion_tokens": 0})


async def test_an_operator_sees_the_pools_spend_and_every_scope(bus: Bus, api) -> None:
    await _spent(bus, "alice", 10)  # $0.01: alice's whole day, an alert
    await _spent(bus, "bob", 20)
    found = (await (await api()).get("/v1/spend")).json()
    assert found["scope"] == "pool" and found["timezone"] == "UTC"
    day = {r["scope"]: r for r in found["budgets"] if r["period"].startswith("day:")}
    assert {"pool", "agent:main", "identity:alice", "identity:bob"} <= set(day)
    assert day["pool"]["spent_usd"] == 0.03 and day["pool"]["limit_usd"] == 5.0 and day["pool"]["calls"] == 2
    assert day["identity:alice"]["left_usd"] == 0.0 and day["identity:bob"]["spent_usd"] == 0.02
    assert [a["scope"] for a in found["alerts"]] == ["identity:alice"] * len(found["alerts"]) and found["alerts"]
    assert "daily" not in found


async def test_a_chat_token_sees_only_its_own_identitys_spend_in_the_same_shape(bus: Bus, api) -> None:
    await _spent(bus, "alice", 10)
    await _spent(bus, "bob", 20)
    mine = (await (await api(await _chat_token(bus, "bob"))).get("/v1/spend?days=2")).json()
    everything = (await (await api()).get("/v1/spend?days=2")).json()
    assert set(mine) == set(everything) == {"scope", "timezone", "budgets", "alerts", "daily"}
    assert mine["scope"] == "identity:bob"
    assert {r["scope"] for r in mine["budgets"]} == {"identity:bob"}
    assert {r["period"][:4] for r in mine["budgets"]} == {"day:", "mont"}
    assert set(mine["budgets"][0]) == set(everything["budgets"][0])
    assert mine["alerts"] == []  # alice's alert is not bob's business
    assert [s["scope"] for s in mine["daily"]] == ["identity:bob"]
    assert mine["daily"][0]["days"][-1]["spent_usd"] == 0.02


async def test_the_daily_series_has_each_day_oldest_first_with_gaps_at_zero(bus: Bus, api) -> None:
    await _spent(bus, "alice", 3, days_ago=2)
    await _spent(bus, "alice", 5)
    await _spent(bus, "bob", 7, days_ago=29)
    daily = (await (await api()).get("/v1/spend?days=30")).json()["daily"]
    by_scope = {s["scope"]: s["days"] for s in daily}
    assert daily[0]["scope"] == "pool"
    pool = by_scope["pool"]
    assert len(pool) == 30 and [d["day"] for d in pool] == sorted(d["day"] for d in pool)
    assert pool[-1]["day"] == time.strftime("%Y-%m-%d", time.gmtime())
    assert [d["spent_usd"] for d in pool if d["spent_usd"]] == [0.007, 0.003, 0.005]
    assert pool[-3]["spent_usd"] == 0.003 and pool[-2] == {"day": pool[-2]["day"], "spent_usd": 0.0, "calls": 0}
    assert by_scope["identity:bob"][0]["spent_usd"] == 0.007 and by_scope["identity:alice"][-1]["calls"] == 1


async def test_pincer_budget_shows_what_the_operator_is_shown(bus: Bus, redis_url: str, api, capsys) -> None:
    await _spent(bus, "alice", 10)
    config = Config(raw={"redis": {"url": redis_url, "prefix": bus.keys.prefix}, "brain": {"budget": BUDGET}})
    assert await asyncio.to_thread(budget_cli.command, argparse.Namespace(json=True), config) == 0
    printed = json.loads(capsys.readouterr().out)
    shown = (await (await api()).get("/v1/spend")).json()
    assert printed["budgets"] == shown["budgets"] and printed["alerts"] == shown["alerts"]


@pytest.mark.parametrize("days", ["0", "32", "many", "-3", "%C2%B2", "%D9%A3", "9" * 5000])
async def test_a_bad_number_of_days_is_refused_saying_what_fits(api, days: str) -> None:
    _refused(await (await api()).get(f"/v1/spend?days={days}"), 400, "days must be a whole number from 1 to 31")


# --- /v1/channels ---


async def test_an_operator_sees_each_channels_state(bus: Bus, api) -> None:
    heartbeat = {"channel": "telegram", "polling": 1, "last_progress": time.time(), "stall_s": 90,
                 "username": "pincer_bot", "in": 3, "out": 2, "errors": 1, "last_error": "getUpdates: 502"}
    telegram = Presence(bus, "channel", "channel-tg-1", interval_s=0.5, details=lambda: heartbeat)
    await telegram.start()
    try:
        rows = {r["channel"]: r for r in (await (await api()).get("/v1/channels")).json()["channels"]}
    finally:
        await telegram.stop()
    assert set(rows) == {"email", "telegram"}
    assert rows["telegram"]["state"] == "connected" and rows["telegram"]["enabled"] is True
    assert rows["telegram"]["bot"] == "pincer_bot" and rows["telegram"]["last_progress_s_ago"] is not None
    assert (rows["telegram"]["in"], rows["telegram"]["errors"], rows["telegram"]["last_error"]) == \
        (3, 1, "getUpdates: 502")
    assert rows["email"]["state"] == "not running" and rows["email"]["last_progress_s_ago"] is None


async def test_pincer_channels_shows_what_the_api_does(bus: Bus, redis_url: str, api, capsys) -> None:
    config = Config(raw={"redis": {"url": redis_url, "prefix": bus.keys.prefix}})
    await bus.redis.hset(bus.keys.channel_paired("telegram"), "7", "cli 1700000000 @bea")
    heartbeat = {"channel": "telegram", "polling": 1, "last_progress": time.time(), "stall_s": 90}
    telegram = Presence(bus, "channel", "channel-tg-1", interval_s=0.5, details=lambda: heartbeat)
    await telegram.start()
    try:
        printed = []
        for action in ("list", "paired"):
            assert await asyncio.to_thread(channels_cli.command, argparse.Namespace(
                action=action, arg=None, channel="telegram", json=True), config) == 0
            printed.append(json.loads(capsys.readouterr().out))
        client = await api()
        rows = (await client.get("/v1/channels")).json()["channels"]
    finally:
        await telegram.stop()
    assert [(r["channel"], r["state"]) for r in printed[0]] == [("telegram", "connected")]
    assert [(r["channel"], r["state"]) for r in rows if r["channel"] == "telegram"] == [("telegram", "connected")]
    people = (await client.get("/v1/channels/paired?channel=telegram")).json()["paired"]
    assert printed[1] == {p["user"]: f"{p['by']} {p['at']} @{p['username']}" for p in people} == \
        {"7": "cli 1700000000 @bea"}


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/channels"), ("GET", "/v1/channels/pairing"),
                                              ("POST", "/v1/channels/pairing/ABCDEFGH?channel=telegram"),
                                              ("GET", "/v1/channels/paired"),
                                              ("DELETE", "/v1/channels/paired/42?channel=telegram")])
async def test_a_chat_token_is_refused_the_channels(bus: Bus, api, method: str, path: str) -> None:
    client = await api(await _chat_token(bus))
    _refused(await client.request(method, path), 403, "operator token")


async def test_a_stranger_is_listed_paired_and_unpaired_over_http(bus: Bus, api) -> None:
    door = Access(bus, "telegram", allow_from=[], agent="main", pairing_ttl_s=600)
    code, _ = await door.code_for("42", "ann")
    client = await api()
    waiting = (await client.get("/v1/channels/pairing")).json()["requests"]
    assert [(w["channel"], w["code"], w["user"], w["username"]) for w in waiting] == \
        [("telegram", code, "42", "ann")]
    assert 0 < waiting[0]["expires_in"] <= 600
    assert (await client.get("/v1/channels/pairing?channel=email")).json() == {"requests": []}
    paired = await client.post(f"/v1/channels/pairing/{code}?channel=telegram")
    assert paired.status_code == 200, paired.text
    assert paired.json()["identity"] == "telegram:42" and await door.identity("42") is not None
    assert (await client.get("/v1/channels/pairing")).json() == {"requests": []}
    _refused(await client.post(f"/v1/channels/pairing/{code}?channel=telegram"), 404, "no pending pairing code")
    people = (await client.get("/v1/channels/paired")).json()["paired"]
    assert [(p["channel"], p["user"], p["by"], p["username"]) for p in people] == \
        [("telegram", "42", "http:owner", "ann")]
    gone = await client.delete("/v1/channels/paired/42?channel=telegram")
    assert gone.status_code == 200 and gone.json()["unpaired"] is True, gone.text
    assert await door.identity("42") is None and (await client.get("/v1/channels/paired")).json() == {"paired": []}
    _refused(await client.delete("/v1/channels/paired/42?channel=telegram"), 404, "was not paired")


@pytest.mark.parametrize(("method", "path", "words"), [
    ("POST", "/v1/channels/pairing/ABCDEFGH", "say which channel with ?channel="),
    ("POST", "/v1/channels/pairing/ABCDEFGH?channel=fax", "'fax' is not one"),
    ("POST", "/v1/channels/pairing/AB-CD?channel=telegram", "is not a pairing code"),
    ("DELETE", "/v1/channels/paired/42", "say which channel"),
    ("GET", "/v1/channels/paired?channel=", "say which channel")])
async def test_bad_channel_input_is_refused_saying_what_fits(api, method: str, path: str, words: str) -> None:
    _refused(await (await api()).request(method, path), 400, words)


# --- /v1/tokens and /v1/admin/hooks ---


async def _job_of(bus: Bus, owner: str) -> None:
    await JobStore(bus).add(Job(owner=owner, name="daily", message="hi", schedule=Schedule(kind="every", every_s=3600)),
                            now=time.time())


async def test_a_token_made_over_http_is_shown_once_works_and_is_revoked_with_its_jobs(bus: Bus, api) -> None:
    client = await api()
    made = await client.post("/v1/tokens", json={"name": "carol", "agents": ["main"]})
    assert made.status_code == 201, made.text
    secret = made.json()["token"]
    assert secret.startswith("pcr_") and made.json()["scope"] == "chat" and made.json()["agents"] == ["main"]
    listed = await client.get("/v1/tokens")
    assert secret not in listed.text and "digest" not in listed.text
    rows = {t["name"]: t for t in listed.json()["tokens"]}
    assert rows["carol"]["scope"] == "chat" and rows["owner"]["source"] == "gateway.token"
    carol = await api(secret)
    assert (await carol.get("/v1/me")).json()["name"] == "carol"
    await _job_of(bus, "carol")
    rule = {'{"path": "/usr/bin/date"}': '{"by": "carol", "at": 1}'}
    for agent, who in (("main", "carol"), ("ops", "carol"), ("main", "hook:carol"), ("main", "carol2")):
        await bus.redis.hset(bus.keys.exec_allowlist(agent, who), mapping=rule)
    gone = await client.delete("/v1/tokens/carol")
    assert gone.status_code == 200 and gone.json()["jobs_removed"] == ["daily"], gone.text
    # Its standing approvals went with it, on every agent; other identities' stayed
    assert await remembered(bus, "main", "carol") == [] and await remembered(bus, "ops", "carol") == []
    assert [len(await remembered(bus, "main", who)) for who in ("hook:carol", "carol2")] == [1, 1]
    await async_wait_until(lambda: _status(carol, "/v1/me", 401), timeout=10)  # each Gateway within seconds
    _refused(await client.delete("/v1/tokens/carol"), 404, "no token named 'carol'")


async def test_a_hook_made_over_http_takes_signed_requests_rotates_and_goes(bus: Bus, api) -> None:
    client = await api()
    made = await client.post("/v1/admin/hooks", json={"name": "ci", "template": "CI says: {payload}"})
    assert made.status_code == 201, made.text
    secret = made.json()["secret"]
    assert secret.startswith("whsec_") and made.json()["path"] == "/v1/hooks/ci"
    listed = await client.get("/v1/admin/hooks")
    assert [h["name"] for h in listed.json()["hooks"]] == ["ci"] and secret not in listed.text
    assert (await HookStore(bus.redis, bus.keys).get("ci")) is not None
    rotated = await client.post("/v1/admin/hooks/ci/rotate", json={"grace_s": 0})
    assert rotated.status_code == 200 and rotated.json()["secret"] not in (secret, ""), rotated.text
    body = b'{"build": "green"}'
    stale = await (await api("")).post("/v1/hooks/ci", content=body, headers=signed_headers(secret, body))
    assert stale.status_code == 401, stale.text  # the old secret, with no grace, is refused at once
    for when in ("\u00b2", "1" * 5000):  # not a time a clock gives: refused as one, before any secret is tried
        odd = {**signed_headers(rotated.json()["secret"], body), "X-Pincer-Timestamp": when.encode("latin-1")}
        _refused(await (await api("")).post("/v1/hooks/ci", content=body, headers=odd), 401, "is not within")
    await _job_of(bus, "hook:ci")
    gone = await client.delete("/v1/admin/hooks/ci")
    assert gone.status_code == 200 and gone.json()["jobs_removed"] == ["daily"], gone.text
    assert (await client.get("/v1/admin/hooks")).json() == {"hooks": []}
    _refused(await client.delete("/v1/admin/hooks/ci"), 404, "no hook named 'ci'")
    _refused(await client.post("/v1/admin/hooks/ci/rotate"), 404, "no hook named 'ci'")


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/tokens"), ("POST", "/v1/tokens"),
                                              ("DELETE", "/v1/tokens/alice"), ("GET", "/v1/admin/hooks"),
                                              ("POST", "/v1/admin/hooks"), ("POST", "/v1/admin/hooks/ci/rotate"),
                                              ("DELETE", "/v1/admin/hooks/ci")])
async def test_a_chat_token_is_refused_tokens_and_hooks(bus: Bus, api, method: str, path: str) -> None:
    client = await api(await _chat_token(bus))
    answer = await client.request(method, path, json={"name": "mallory", "scope": "operator", "template": "x"})
    _refused(answer, 403, "managed with an operator token")
    assert [t.name for t in await TokenStore(bus.redis, bus.keys).list()] == ["alice"]


@pytest.mark.parametrize(("path", "body", "status", "words"), [
    ("/v1/tokens", {"name": "no spaces"}, 400, "name: String should match pattern"),
    ("/v1/tokens", {"name": "dave", "scope": "root"}, 400, "scope: Input should be 'chat' or 'operator'"),
    ("/v1/tokens", {"name": "dave", "agents": ["../x"]}, 400, "'../x' is not an agent's id"),
    ("/v1/tokens", {"name": "owner"}, 409, "is the configured token's"),
    ("/v1/tokens", {"name": "alice"}, 409, "a token named 'alice' exists"),
    ("/v1/admin/hooks", {"name": "Bad Name", "template": "x"}, 400, "name: String should match pattern"),
    ("/v1/admin/hooks", {"name": "ci"}, 400, "template: Field required"),
    ("/v1/admin/hooks", {"name": "ci", "template": "x", "deliver": "ftp://x"}, 400, "deliver:"),
    ("/v1/admin/hooks/ci/rotate", {"grace_s": -1}, 400, "grace_s: Input should be greater than or equal to 0")])
async def test_bad_token_and_hook_input_is_refused_saying_what_is_wrong(bus: Bus, api, path: str, body: Any,
                                                                        status: int, words: str) -> None:
    await _chat_token(bus)
    await HookStore(bus.redis, bus.keys).add("ci", agent="main", template="x", deliver=None)
    _refused(await (await api()).post(path, json=body), status, words)


async def test_hooks_are_managed_under_admin_and_need_a_token_there(api) -> None:
    anonymous = await api("")
    _refused(await anonymous.get("/v1/admin/hooks"), 401, "")
    _refused(await anonymous.post("/v1/admin/hooks", json={"name": "ci", "template": "x"}), 401, "")


# --- /v1/memory: search and recall ---


async def test_notes_are_searched_by_name_and_text_within_the_callers_own(bus: Bus, api) -> None:
    notes = LongTermMemory(bus.redis, bus.keys)
    await notes.write("main", "gift", "a red Scarf for Bob", owner="alice")
    await notes.write("main", "plants", "water the fern", owner="alice")
    await notes.write("main", "house-rules", "no wet scarf indoors", owner=SHARED)
    await notes.write("main", "scarf", "bob's own scarf", owner="bob")
    alice = await api(await _chat_token(bus, "alice"))
    found = (await alice.get("/v1/memory?q=SCARF")).json()
    assert found["q"] == "scarf" and [(n["key"], n["scope"]) for n in found["notes"]] == \
        [("gift", "own"), ("house-rules", "shared")]
    assert [n["key"] for n in (await alice.get("/v1/memory?q=fern")).json()["notes"]] == ["plants"]
    assert [n["key"] for n in (await alice.get("/v1/memory?q=%20")).json()["notes"]] == \
        ["gift", "plants", "house-rules"]  # a blank search is no search
    _refused(await alice.get("/v1/memory?q=" + "x" * 501), 400, "at most 500")


async def test_recall_finds_what_the_agents_search_does_for_the_caller_alone(bus: Bus, api, engine) -> None:
    await engine()
    notes = LongTermMemory(bus.redis, bus.keys)
    await notes.write("main", "gift", "a red scarf for Bob's birthday", owner="alice")
    await notes.write("main", "secret", "bob hides a scarf under the stairs", owner="bob")
    alice = await api(await _chat_token(bus, "alice"))
    found = (await alice.get("/v1/memory/recall?q=which%20scarf")).json()
    assert found["q"] == "which scarf" and found["agent"] == "main"
    assert [(h["source"], h["key"], h["scope"]) for h in found["hits"]] == [("note", "gift", "own")]
    assert "scarf" in found["hits"][0]["excerpt"]
    operator = await api()
    hers = (await operator.get("/v1/memory/recall?q=scarf&owner=bob")).json()["hits"]
    assert [h["key"] for h in hers] == ["secret"]
    await notes.write("main", "rules", "no wet scarf indoors", owner=SHARED)
    shared = (await operator.get("/v1/memory/recall?q=scarf&shared=1")).json()["hits"]
    assert [(h["key"], h["scope"]) for h in shared] == [("rules", "shared")]  # the shared notes alone
    _refused(await alice.get("/v1/memory/recall?q=scarf&owner=bob"), 403, "operator")
    _refused(await alice.get("/v1/memory/recall"), 400, "?q=")
    _refused(await alice.get("/v1/memory/recall?q=scarf&limit=51"), 400, "limit")
    for digits in ("%C2%B2", "9" * 5000):  # "²" passes str.isdigit and fails int(); so do 5,000 digits
        _refused(await alice.get(f"/v1/memory/recall?q=scarf&limit={digits}"), 400, "limit must be a whole number")


async def test_recall_with_no_hands_worker_says_so(bus: Bus) -> None:
    inbox = ReplyInbox(bus, "gw-recall", block_ms=100)
    await inbox.start()
    try:
        with pytest.raises(Refused) as refused:
            await PoolRecall(bus, inbox, timeout_s=0.3).recall("main", "scarf", owner="alice", limit=5)
    finally:
        await inbox.close()
    assert refused.value.code is ErrorCode.SERVICE_UNAVAILABLE and "no Hands worker" in refused.value.message


async def test_recall_counts_against_the_callers_messages_a_minute(bus: Bus, engine) -> None:
    await engine()
    async with gateway_clients(bus, limits={"burst": 1, "messages_per_minute": 1}) as client:
        alice = await client(await _chat_token(bus, "alice"))
        assert (await alice.get("/v1/memory/recall?q=scarf")).status_code == 200
        _refused(await alice.get("/v1/memory/recall?q=scarf"), 429, "messages a minute")
        assert (await alice.get("/v1/memory?q=scarf")).status_code == 200  # listing asks no worker: not counted


async def test_a_fork_costs_one_message_for_each_it_copies_up_to_a_burst(bus: Bus) -> None:
    from memory.sessions import SessionStore, TranscriptEntry

    sessions = SessionStore(bus.redis, bus.keys)
    assert await sessions.claim_and_number("alice/long", "alice") == 1
    for n in range(8):
        await sessions.append("alice/long", TranscriptEntry(role="user", content=f"question {n}"),
                              TranscriptEntry(role="assistant", content=f"answer {n}"))
    async with gateway_clients(bus, limits={"burst": 5, "messages_per_minute": 1}) as client:
        alice = await client(await _chat_token(bus, "alice"))
        made = await alice.post("/v1/sessions/long/fork", json={"at": 3, "name": "a"})
        assert made.status_code == 201 and made.json()["entries"] == 6, made.text  # 3 of the 5 taken
        _refused(await alice.post("/v1/sessions/long/fork", json={"at": 3, "name": "b"}), 429,
                 "this counts as 3", "messages_per_minute")
        assert not await sessions.exists("alice/b")
        _refused(await alice.post("/v1/sessions/long/fork", json={"at": 2, "name": "a"}), 409, "exists already")
        # The 409 cost nothing: 2 are left for this one.
        assert (await alice.post("/v1/sessions/long/fork", json={"at": 2, "name": "c"})).status_code == 201
        # A fork longer than a burst costs the whole burst: it waits for a full bucket, and is not refused for ever.
        refused = await alice.post("/v1/sessions/long/fork", json={"at": 8, "name": "d"})
        _refused(refused, 429, "this counts as 5")
        assert int(refused.headers["retry-after"]) <= 5 * 60


async def test_a_tokens_text_a_day_bounds_its_forks_and_an_openai_clients_history(bus: Bus) -> None:
    from memory.sessions import SessionStore, TranscriptEntry

    sessions = SessionStore(bus.redis, bus.keys)
    assert await sessions.claim_and_number("alice/long", "alice") == 1
    for n in range(8):  # ~25 KB in all, each entry ~1.55 KB
        await sessions.append("alice/long", TranscriptEntry(role="user", content=f"question {n} " + "q" * 1500),
                              TranscriptEntry(role="assistant", content=f"answer {n} " + "a" * 1500))
    brain = Presence(bus, "brain", "brain-silent", interval_s=0.5, details=lambda: {"agents": "main"})
    await brain.start()
    try:
        async with gateway_clients(bus, limits={"text_mb_per_day": 0.02}) as client:  # ~20 KB a day
            alice = await client(await _chat_token(bus, "alice"))
            made = await alice.post("/v1/sessions/long/fork", json={"at": 2, "name": "two"})
            assert made.status_code == 201 and made.json()["entries"] == 4, made.text  # ~6 KB of the day's
            refused = await alice.post("/v1/sessions/long/fork", json={"at": 6, "name": "six"})  # ~19 KB
            _refused(refused, 429, "text_mb_per_day")
            assert int(refused.headers["retry-after"]) > 60 and not await sessions.exists("alice/six")
            left = float(await bus.redis.hget(bus.keys.message_rate("alice"), "tokens"))
            assert 28 <= left < 29  # the refused fork took none of its 6 messages: both or neither
            history = [{"role": "user" if n % 2 == 0 else "assistant", "content": "h" * 2000} for n in range(8)]
            asked = await alice.post("/v1/chat/completions", json={
                "model": "pincer", "messages": [*history, {"role": "user", "content": "and now?"}]})
            _refused(asked, 429, "text_mb_per_day")
            assert int(asked.headers["retry-after"]) > 60
            assert sorted(await sessions.list_sessions(owner="alice")) == ["alice/long", "alice/two"]
    finally:
        await brain.stop()


async def test_the_sign_in_cookie_counts_only_from_the_gateways_own_pages(bus: Bus, api) -> None:
    signed = await (await api("")).post("/login", json={"token": await _chat_token(bus, "alice")})
    assert signed.status_code == 200, signed.text
    browser = await api("")
    cookie = {"Cookie": f"pincer_session={signed.cookies['pincer_session']}"}
    for site, status in (("same-origin", 200), ("none", 200), (None, 200),  # no header: not a browser
                         ("same-site", 401), ("cross-site", 401)):  # another port on localhost; another site
        headers = {**cookie, **({"Sec-Fetch-Site": site} if site else {})}
        answer = await browser.get("/v1/me", headers=headers)
        assert answer.status_code == status, (site, answer.text)
    assert (await browser.get("/", headers={**cookie, "Sec-Fetch-Site": "cross-site"})).status_code == 200
