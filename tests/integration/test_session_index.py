"""Each owner's list of sessions on a real Redis: a listing reads only the caller's, sessions written by an
older release (the pool's list alone) are listed before and after a catch-up, and a session that is deleted
or lapses leaves both lists."""

from __future__ import annotations

import contextlib
import time

import httpx

from bus.streams import Bus
from gateway.config import GatewaySettings
from gateway.server.app import Gateway
from gateway.tokens import TokenStore
from memory.session_index import SessionIndex
from memory.sessions import SessionStore, TranscriptEntry, session_keys
from tests.conftest import async_wait_until


async def spoken(store: SessionStore, session_id: str, text: str) -> None:
    """A session as a turn of this release leaves it: owned, and in both lists."""
    assert await store.claim_and_number(session_id, session_id.partition("/")[0]) is not None
    await store.append(session_id, TranscriptEntry(role="user", content=text))


async def spoken_by_an_older_release(bus: Bus, session_id: str, at: float) -> None:
    """What a release before the owners' lists leaves: the transcript, the owner and the pool's list only."""
    await bus.redis.rpush(bus.keys.transcript(session_id), b"\x80")
    await bus.redis.set(bus.keys.session_owner(session_id), session_id.partition("/")[0])
    await bus.redis.zadd(bus.keys.sessions, {session_id: at})


async def owners_list(bus: Bus, owner: str) -> list[str]:
    return [m.decode() for m in await bus.redis.zrevrange(bus.keys.sessions_of(owner), 0, -1)]


async def test_a_listing_reads_the_owners_own_list_newest_first(bus: Bus) -> None:
    store = SessionStore(bus.redis, bus.keys)
    await store.catch_up()  # a fresh pool: nothing to put, and from now on the owners' lists are read
    for session_id in ("alice/a", "bob/c", "alice/b"):
        await spoken(store, session_id, "hello")
    assert await owners_list(bus, "alice") == ["alice/b", "alice/a"]
    assert await owners_list(bus, "bob") == ["bob/c"]
    assert await store.list_sessions(owner="alice") == ["alice/b", "alice/a"]
    assert await store.list_sessions(owner="bob") == ["bob/c"]
    assert await store.list_sessions(owner="carol") == []
    assert await store.list_sessions() == ["alice/b", "bob/c", "alice/a"]  # an operator's ?owner=*: the pool's

    # The owner's list is what is read: a session only in the pool's list is not alice's to see ...
    await bus.redis.zrem(bus.keys.sessions_of("alice"), "alice/a")
    assert await store.list_sessions(owner="alice") == ["alice/b"]
    # ... and one in her list whose owner is someone else is not listed either
    await bus.redis.zadd(bus.keys.sessions_of("alice"), {"bob/c": time.time()})
    assert await store.list_sessions(owner="alice") == ["alice/b"]


async def test_sessions_an_older_release_wrote_are_listed_before_and_after_a_catch_up(bus: Bus) -> None:
    store = SessionStore(bus.redis, bus.keys)
    now = time.time()
    await spoken_by_an_older_release(bus, "alice/old", now - 30 * 86_400)
    await spoken_by_an_older_release(bus, "alice/recent", now - 60)
    await spoken_by_an_older_release(bus, "bob/his", now - 10)
    assert await owners_list(bus, "alice") == []
    # No catch-up has finished: the pool's list is read and filtered, so nothing is missing meanwhile
    assert await store.list_sessions(owner="alice") == ["alice/recent", "alice/old"]

    assert (await store.catch_up()).put == 3  # the first time: every session
    assert await owners_list(bus, "alice") == ["alice/recent", "alice/old"]
    assert await owners_list(bus, "bob") == ["bob/his"]
    assert await store.list_sessions(owner="alice") == ["alice/recent", "alice/old"]

    # An older process still running beside this release (a rolling upgrade) starts a session: the next
    # catch-up puts only what was active since the last one (less the writers' clock slack)
    await spoken_by_an_older_release(bus, "alice/during", time.time())
    assert await store.list_sessions(owner="alice") == ["alice/recent", "alice/old"]
    assert (await store.catch_up()).put == 3  # alice/during, alice/recent and bob/his are within the slack
    assert await store.list_sessions(owner="alice") == ["alice/during", "alice/recent", "alice/old"]

    # A catch-up never moves a session back: a newer time a writer gave it stands
    await spoken(store, "alice/old", "back again")
    newest = await bus.redis.zscore(bus.keys.sessions_of("alice"), "alice/old")
    await bus.redis.zadd(bus.keys.sessions, {"alice/old": newest - 100})
    await bus.redis.delete(bus.keys.sessions_indexed)
    await store.catch_up()
    assert await bus.redis.zscore(bus.keys.sessions_of("alice"), "alice/old") == newest


async def test_a_session_deleted_or_lapsed_leaves_both_lists(bus: Bus) -> None:
    store = SessionStore(bus.redis, bus.keys)
    await store.catch_up()
    for session_id in ("alice/a", "alice/b", "alice/c"):
        await spoken(store, session_id, "hello")
    await store.delete("alice/a")
    assert await bus.redis.zscore(bus.keys.sessions, "alice/a") is None
    assert "alice/a" not in await owners_list(bus, "alice")
    await bus.redis.delete(bus.keys.transcript("alice/b"), bus.keys.session_owner("alice/b"))  # lapsed: expired
    assert await store.list_sessions(owner="alice") == ["alice/c"]
    assert await owners_list(bus, "alice") == ["alice/c"]
    assert await bus.redis.zscore(bus.keys.sessions, "alice/b") is None
    assert await bus.redis.exists(*session_keys(bus.keys, "alice/b")) == 0  # what was left of it went too

    # One a catch-up finds lapsed (no one listed it) goes the same way, from both lists
    await bus.redis.delete(bus.keys.transcript("alice/c"), bus.keys.session_owner("alice/c"))
    caught = await store.catch_up()
    assert (caught.put, caught.dropped) == (0, 1)
    assert await owners_list(bus, "alice") == [] and await bus.redis.zcard(bus.keys.sessions) == 0
    assert await bus.redis.exists(*session_keys(bus.keys, "alice/c")) == 0

    # A session being made again under an entry left in the lists: its owner is there, its first message
    # not yet. Neither a listing nor a catch-up takes it for lapsed; only its stale entries go.
    for key in (bus.keys.sessions, bus.keys.sessions_of("alice")):
        await bus.redis.zadd(key, {"alice/again": time.time()})
    assert await store.claim_and_number("alice/again", "alice") == 1
    assert await store.list_sessions(owner="alice") == []
    assert (await store.catch_up()).dropped == 0
    assert await store.owner("alice/again") == "alice" and await store.next_seq("alice/again") == 2
    await store.append("alice/again", TranscriptEntry(role="user", content="back"))
    assert await store.list_sessions(owner="alice") == ["alice/again"]


async def test_sessions_from_before_owners_are_in_no_owners_list(bus: Bus) -> None:
    index = SessionIndex(bus.redis, bus.keys)
    for session_id in ("main", "alice/x"):
        await bus.redis.rpush(bus.keys.transcript(session_id), b"\x80")
        await bus.redis.zadd(bus.keys.sessions, {session_id: time.time()})
    assert (await index.catch_up(drop=SessionStore(bus.redis, bus.keys).drop_lapsed)).put == 1  # "main" names no
    # owner: no door reaches it, no list takes it
    assert await index.newest("main") == [] and await index.newest("alice") == ["alice/x"]


async def test_a_gateway_catches_the_owners_lists_up_as_it_starts(bus: Bus) -> None:
    await spoken_by_an_older_release(bus, "alice/trip", time.time())
    alice_token = await TokenStore(bus.redis, bus.keys).create("alice", scope="chat")
    gateway = Gateway(bus, GatewaySettings.model_validate({"token": "pincer_test_index_owner_token_0123456789"}),
                      instance_id="gw-index", heartbeat_s=0.5)
    app = gateway.app()
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(gateway.lifespan(app))
        client = await stack.enter_async_context(httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8780",
            headers={"Authorization": f"Bearer {alice_token}"}))
        await async_wait_until(lambda: bus.redis.exists(bus.keys.sessions_indexed), what="the first catch-up")
        assert await owners_list(bus, "alice") == ["alice/trip"]
        assert (await client.get("/v1/sessions")).json()["sessions"] == ["trip"]
