"""Retention on a real Redis: a session idle past its keep leaves Redis for a file in the data dir (still
listed, readable, exportable and restorable by its owner only); a pass killed between writing the file
and removing the keys is finished by the next, nothing lost and nothing twice; old dead letters and
alerts are trimmed; one Gateway of the pool does it (a lease)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bus.settings import RetentionSettings
from bus.streams import Bus
from gateway.config import GatewaySettings
from gateway.server.app import Gateway
from gateway.tokens import TokenStore
from memory.archive import SessionArchive
from memory.flight import FlightRecorder
from memory.retention import DAY_S, GONE_WORKER_S, Archiver, RetentionLoop, sweep
from memory.sessions import SessionStore, TranscriptEntry
from tests.conftest import async_wait_until

OWNER_TOKEN = "pincer_test_owner_token_for_retention_0123456789"
LATER = 100 * DAY_S  # past the default 90 days


class Killed(BaseException):
    """What a kill -9 between the file and the removal would leave: the steps after it never run."""


def session_keys(bus: Bus, session_id: str) -> list[str]:
    k = bus.keys
    return [k.transcript(session_id), k.session_seq(session_id), k.session_owner(session_id),
            k.session_events(session_id), k.session_events_seq(session_id), k.session_record(session_id),
            k.session_record_parts(session_id), k.session_about(session_id)]


async def memory_log_text(bus: Bus) -> str:
    return " ".join(v.decode() for _, fields in await bus.redis.xrange(bus.keys.memory_log) for v in fields.values())


async def talk(bus: Bus, session_id: str, owner: str, *texts: str) -> None:
    """A session as a turn leaves it: owned, numbered, titled, with events and a flight record."""
    sessions = SessionStore(bus.redis, bus.keys)
    assert await sessions.claim_and_number(session_id, owner) is not None
    await sessions.append(session_id, *[TranscriptEntry(role="user", content=t) for t in texts])
    await bus.redis.xadd(bus.keys.session_events(session_id), {"k": "reply", "d": "{}"})
    await bus.redis.set(bus.keys.session_events_seq(session_id), 1)
    await FlightRecorder(bus.redis, bus.keys, keep_s=3600).model_call(
        session_id, "m1", messages=[{"role": "user", "content": texts[0]}], tools=[], params={},
        response={"content": "ok"})


def later(bus: Bus, tmp_path: Path, *, days: float = LATER / DAY_S) -> Archiver:
    return Archiver(bus, SessionArchive(tmp_path / "archive"), clock=lambda: time.time() + days * DAY_S)


async def test_an_idle_session_moves_to_its_file_and_leaves_redis_whole(bus: Bus, tmp_path: Path) -> None:
    await talk(bus, "alice/old", "alice", "my locker code is 7781", "and the bike lock is 2290")
    archiver = later(bus, tmp_path)
    await talk(bus, "alice/fresh", "alice", "what is on today")
    await bus.redis.zadd(bus.keys.sessions, {"alice/fresh": time.time() + LATER})  # spoke just now, "later"
    swept = await sweep(archiver, RetentionSettings())
    assert swept.archived == 1
    assert await bus.redis.exists(*session_keys(bus, "alice/old")) == 0
    assert await bus.redis.zscore(bus.keys.sessions, "alice/old") is None
    assert "locker code" not in await memory_log_text(bus)  # forgotten the one way deletion forgets
    assert await bus.redis.exists(bus.keys.transcript("alice/fresh"))  # not idle: untouched
    found = archiver.read("alice", "alice/old")
    assert found is not None
    assert [e.content for e in found.entries] == ["my locker code is 7781", "and the bike lock is 2290"]
    assert found.about["title"] == "my locker code is 7781" and found.about["messages"] == 1
    assert any('"kind"' in line and "model" in line for line in found.record)  # its flight record too
    path = archiver.archive.path("alice", "alice/old")
    assert path.stat().st_mode & 0o777 == 0o600
    assert (await sweep(archiver, RetentionSettings())).archived == 0  # nothing more to do


async def test_a_pass_killed_between_file_and_removal_is_finished_once(bus: Bus, tmp_path: Path) -> None:
    await talk(bus, "alice/old", "alice", "one", "two", "three")
    archiver = later(bus, tmp_path)

    async def kill() -> None:
        raise Killed

    with pytest.raises(Killed):
        await archiver.archive_one("alice/old", after_write=kill)
    on_disk = archiver.read("alice", "alice/old")
    assert on_disk is not None and [e.content for e in on_disk.entries] == ["one", "two", "three"]
    assert await bus.redis.exists(bus.keys.transcript("alice/old"))  # nothing removed yet: nothing lost
    restarted = later(bus, tmp_path)  # a new Gateway takes the lease and sweeps
    assert (await sweep(restarted, RetentionSettings())).archived == 1
    again = restarted.read("alice", "alice/old")
    assert again is not None and [e.content for e in again.entries] == ["one", "two", "three"]  # not twice
    assert await bus.redis.exists(*session_keys(bus, "alice/old")) == 0


async def test_a_pass_killed_after_removing_the_keys_is_finished_by_the_next(bus: Bus, tmp_path: Path) -> None:
    await talk(bus, "alice/old", "alice", "my locker code is 7781")
    archiver = later(bus, tmp_path)
    gathered = await archiver.gather("alice/old")
    assert gathered is not None
    archiver.archive.write(gathered)
    await bus.redis.delete(*session_keys(bus, "alice/old"))  # the keys went, then the kill: listed, words kept
    assert "locker code" in await memory_log_text(bus)
    assert (await sweep(archiver, RetentionSettings())).archived == 0
    assert await bus.redis.zscore(bus.keys.sessions, "alice/old") is None
    assert "locker code" not in await memory_log_text(bus)
    found = archiver.read("alice", "alice/old")
    assert found is not None and [e.content for e in found.entries] == ["my locker code is 7781"]


async def test_a_session_spoken_to_as_it_is_archived_stays_and_its_file_merges_later(bus: Bus,
                                                                                      tmp_path: Path) -> None:
    await talk(bus, "alice/old", "alice", "one")
    await bus.redis.zadd(bus.keys.sessions, {"alice/old": time.time() - LATER})  # last spoke 100 days ago
    sessions = SessionStore(bus.redis, bus.keys)
    archiver = Archiver(bus, SessionArchive(tmp_path / "archive"))

    async def message_arrives() -> None:  # between the file and the removal
        await sessions.append("alice/old", TranscriptEntry(role="user", content="two"))

    assert not await archiver.archive_one("alice/old", after_write=message_arrives)
    assert [e.content for e in await sessions.load("alice/old")] == ["one", "two"]  # nothing removed
    assert (await sweep(archiver, RetentionSettings())).archived == 0  # spoken to today: not idle
    assert (await sweep(later(bus, tmp_path), RetentionSettings())).archived == 1  # idle again, later
    found = archiver.read("alice", "alice/old")
    assert found is not None and [e.content for e in found.entries] == ["one", "two"]


async def test_an_unreadable_session_is_left_and_the_others_archived(bus: Bus, tmp_path: Path) -> None:
    await talk(bus, "alice/a", "alice", "one")
    await bus.redis.rpush(bus.keys.transcript("alice/a"), b"not msgpack of an entry")
    await bus.redis.zadd(bus.keys.sessions, {"alice/a": time.time() - 2 * LATER})  # the longest idle: first
    await talk(bus, "alice/b", "alice", "two")
    assert (await sweep(later(bus, tmp_path), RetentionSettings())).archived == 1
    assert await bus.redis.exists(bus.keys.transcript("alice/a"))  # kept where it is, said in the log
    assert not await bus.redis.exists(bus.keys.transcript("alice/b"))


async def test_one_pass_archives_batch_after_batch_past_the_unreadable_ones(bus: Bus, tmp_path: Path) -> None:
    for n in range(7):
        await talk(bus, f"alice/s{n}", "alice", f"message {n}")
    for n in (0, 1):  # the two longest idle cannot be read: each batch starts past them
        await bus.redis.rpush(bus.keys.transcript(f"alice/s{n}"), b"not msgpack of an entry")
        await bus.redis.zadd(bus.keys.sessions, {f"alice/s{n}": time.time() - 2 * LATER})
    swept = await sweep(later(bus, tmp_path), RetentionSettings(batch=2))
    assert swept.archived == 5  # three batches of two (and a short one), not one batch an interval
    assert [await bus.redis.exists(bus.keys.transcript(f"alice/s{n}")) for n in range(7)] == [1, 1, 0, 0, 0, 0, 0]


async def test_a_pass_deletes_what_is_left_of_a_lapsed_session_and_lists_the_rest(bus: Bus, tmp_path: Path) -> None:
    await talk(bus, "alice/brief", "alice", "my locker code is 7781")
    await talk(bus, "alice/kept", "alice", "still here")
    assert "locker code" in await memory_log_text(bus)
    await bus.redis.delete(bus.keys.transcript("alice/brief"), bus.keys.session_owner("alice/brief"))  # lapsed
    swept = await sweep(Archiver(bus, SessionArchive(tmp_path / "archive")), RetentionSettings())
    assert swept.lapsed == 1 and swept.archived == 0
    assert await bus.redis.exists(*session_keys(bus, "alice/brief")) == 0
    assert "locker code" not in await memory_log_text(bus)
    assert await bus.redis.zscore(bus.keys.sessions, "alice/brief") is None
    assert await SessionStore(bus.redis, bus.keys).list_sessions(owner="alice") == ["alice/kept"]


async def test_the_streams_of_hands_workers_gone_for_an_hour_are_deleted(bus: Bus, tmp_path: Path) -> None:
    hour_ago_ms = int((time.time() - 2 * GONE_WORKER_S) * 1000)
    workers = ("gone-empty", "gone-quiet", "gone-lately", "late-beat", "live")
    for worker in workers:
        await bus.redis.xgroup_create(bus.keys.hands_worker(worker), "hands", id="0", mkstream=True)
    await bus.redis.xadd(bus.keys.hands_worker("gone-quiet"), {"d": "x"}, id=f"{hour_ago_ms}-0")
    await bus.redis.xadd(bus.keys.hands_worker("gone-lately"), {"d": "a call handed on just now"})
    beating = {"live": time.time() + 30}  # its heartbeat is fresh
    await bus.redis.zadd(bus.keys.alive("hands"), beating)
    archiver = Archiver(bus, SessionArchive(tmp_path / "archive"))

    # The first pass only suspects them: "late-beat" missed this pass's heartbeat check (a Redis blip)
    assert (await sweep(archiver, RetentionSettings())).worker_streams == 0
    await bus.redis.zadd(bus.keys.alive("hands"), {"late-beat": time.time() + 30})
    swept = await sweep(archiver, RetentionSettings())  # the next pass: the ones gone in both go
    assert swept.worker_streams == 2
    left = {w for w in workers if await bus.redis.exists(bus.keys.hands_worker(w))}
    assert left == {"gone-lately", "late-beat", "live"}


async def test_old_dead_letters_and_alerts_are_trimmed_new_ones_kept(bus: Bus, tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    for stream in (bus.keys.dead, bus.keys.alerts):
        await bus.redis.xadd(stream, {"n": "old"}, id=f"{now_ms - 40 * DAY_S * 1000}-0")
        await bus.redis.xadd(stream, {"n": "new"}, id=f"{now_ms}-0")
    swept = await sweep(Archiver(bus, SessionArchive(tmp_path / "archive")), RetentionSettings())
    assert (swept.dead_letters, swept.alerts) == (1, 1)
    for stream in (bus.keys.dead, bus.keys.alerts):
        assert [f[b"n"] for _, f in await bus.redis.xrange(stream)] == [b"new"]
    kept = RetentionSettings(dead_letter_days=None, alert_days=None)
    await bus.redis.delete(bus.keys.dead)
    await bus.redis.xadd(bus.keys.dead, {"n": "old"}, id="1-0")
    assert (await sweep(Archiver(bus, SessionArchive(tmp_path / "archive")), kept)).dead_letters == 0
    assert await bus.redis.xlen(bus.keys.dead) == 1


async def test_one_gateway_of_the_pool_sweeps(bus: Bus, tmp_path: Path) -> None:
    await talk(bus, "alice/old", "alice", "one")
    settings = RetentionSettings(interval_s=1)
    loops = [RetentionLoop(later(bus, tmp_path / name), settings, holder=name) for name in ("gw-a", "gw-b")]
    for loop in loops:
        await loop.start()
    try:
        await async_wait_until(lambda: _gone(bus, "alice/old"), what="the session archived")
        holder = (await bus.redis.get(bus.keys.retention_lease)).decode()
        assert [loop.lease.held for loop in loops] == [holder == "gw-a", holder == "gw-b"]
        written = [p for p in tmp_path.rglob("*.jsonl")]
        assert len(written) == 1 and holder in str(written[0])  # archived by the holder alone
    finally:
        for loop in loops:
            await loop.close()


async def _gone(bus: Bus, session_id: str) -> bool:
    return not await bus.redis.exists(bus.keys.transcript(session_id))


@pytest.fixture
async def api(bus: Bus, tmp_path: Path) -> AsyncIterator[Any]:
    """``api(token)``: a client of an in-process Gateway whose data dir holds the archive."""
    async with contextlib.AsyncExitStack() as stack:
        gateway = Gateway(bus, GatewaySettings.model_validate({"token": OWNER_TOKEN}), instance_id="gw-ret",
                          heartbeat_s=0.5, archive=SessionArchive(tmp_path / "archive"))
        app = gateway.app()
        await stack.enter_async_context(gateway.lifespan(app))

        async def client(token: str = OWNER_TOKEN) -> httpx.AsyncClient:
            return await stack.enter_async_context(httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8780",
                headers={"Authorization": f"Bearer {token}"}))

        yield client


async def test_an_archived_session_is_listed_read_and_restored_by_its_owner_only(api: Any, bus: Bus,
                                                                                  tmp_path: Path) -> None:
    tokens = TokenStore(bus.redis, bus.keys)
    alice, bob = [await api(await tokens.create(name, scope="chat")) for name in ("alice", "bob")]
    await talk(bus, "alice/trip", "alice", "plan the Lisbon trip")
    await talk(bus, "bob/trip", "bob", "bob's own trip")
    await talk(bus, "alice/today", "alice", "today")
    archiver = later(bus, tmp_path)
    assert await archiver.archive_one("alice/trip") and await archiver.archive_one("bob/trip")

    listed = (await alice.get("/v1/sessions")).json()
    assert set(listed["sessions"]) == {"today", "trip"}
    shown = {d["id"]: d for d in listed["details"]}
    assert shown["trip"]["archived"] is True and shown["trip"]["title"] == "plan the Lisbon trip"
    assert "archived" not in shown["today"]
    read = await alice.get("/v1/sessions/trip")
    assert read.status_code == 200 and read.json()["archived"] is True
    assert [e["content"] for e in read.json()["entries"]] == ["plan the Lisbon trip"] and read.json()["record"]

    assert "trip" in (await bob.get("/v1/sessions")).json()["sessions"]  # his own
    assert (await bob.get("/v1/sessions/trip")).json()["entries"][0]["content"] == "bob's own trip"
    assert (await bob.get("/v1/sessions/trip?owner=alice")).status_code in (403, 404)
    for hostile in ("..%2F..%2Falice%2Ftrip", "..", "alice%2Ftrip", "%2E%2E%2Falice%2Ftrip"):
        answer = await bob.get(f"/v1/sessions/{hostile}")
        assert answer.status_code in (400, 404), (hostile, answer.text)
        assert "Lisbon" not in answer.text
    assert (await bob.post("/v1/sessions/trip/restore?owner=alice")).status_code in (403, 404)
    assert (await bob.delete("/v1/sessions/trip?owner=alice")).status_code in (403, 404)
    assert archiver.read("alice", "alice/trip") is not None  # bob's tries changed nothing of alice's

    operator = await api()
    everyone = (await operator.get("/v1/sessions?owner=*")).json()["sessions"]
    assert {"alice/trip", "bob/trip", "alice/today"} <= set(everyone)

    restored = await alice.post("/v1/sessions/trip/restore")
    assert restored.status_code == 200, restored.text
    assert [e.content for e in await SessionStore(bus.redis, bus.keys).load("alice/trip")] == ["plan the Lisbon trip"]
    assert await SessionStore(bus.redis, bus.keys).owner("alice/trip") == "alice"
    assert archiver.read("alice", "alice/trip") is None
    again = (await alice.get("/v1/sessions")).json()["details"]
    assert [d for d in again if d["id"] == "trip"] and all("archived" not in d for d in again)

    assert await archiver.archive_one("alice/today")
    assert (await alice.delete("/v1/sessions/today")).json()["deleted"] is True  # its file goes
    assert archiver.read("alice", "alice/today") is None
    assert "today" not in (await alice.get("/v1/sessions")).json()["sessions"]
    assert (await alice.get("/v1/sessions/today")).status_code == 404


async def test_restoring_an_archived_session_counts_its_text_in_the_owners_day(bus: Bus, tmp_path: Path) -> None:
    token = await TokenStore(bus.redis, bus.keys).create("alice", scope="chat")
    await talk(bus, "alice/big", "alice", "x" * 30_000)  # ~30 KB, and as much again in its flight record
    archiver = later(bus, tmp_path)
    assert await archiver.archive_one("alice/big")
    settings = GatewaySettings.model_validate({"token": OWNER_TOKEN, "limits": {"text_mb_per_day": 0.1}})  # ~100 KB
    gateway = Gateway(bus, settings, instance_id="gw-ret", heartbeat_s=0.5,
                      archive=SessionArchive(tmp_path / "archive"))
    app = gateway.app()
    async with gateway.lifespan(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8780",
            headers={"Authorization": f"Bearer {token}"}) as alice:
        assert (await alice.post("/v1/sessions/big/restore")).status_code == 200  # ~60 KB of the day's
        assert await archiver.archive_one("alice/big")
        refused = await alice.post("/v1/sessions/big/restore")
        assert refused.status_code == 429 and "text_mb_per_day" in refused.json()["error"]["message"], refused.text
        assert int(refused.headers["retry-after"]) > 60
        assert archiver.read("alice", "alice/big") is not None  # nothing written back, its file kept
        assert not await bus.redis.exists(bus.keys.transcript("alice/big"), bus.keys.session_owner("alice/big"))
