"""Open connections and their credentials: one round trip checks them all; gone or too old, they end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from bus.streams import Bus
from gateway.server.connections import Connections, Credential, until_ended
from gateway.tokens import TokenStore, WebSessions, digest


async def test_a_revoked_token_or_ended_sign_in_ends_only_its_connections(bus: Bus) -> None:
    tokens = TokenStore(bus.redis, bus.keys, static="pcr_configured")
    web = WebSessions(bus.redis, bus.keys, tokens)
    alice, bob = await tokens.create("alice"), await tokens.create("bob")
    cookie = await web.sign_in(alice)
    assert cookie is not None
    watch = Connections(tokens, web, max_life_s=3600)
    with watch.opened(Credential(token_digest=digest(alice))) as bearer, \
            watch.opened(Credential(token_digest=digest(alice), web_session=cookie)) as browser, \
            watch.opened(Credential(token_digest=digest(bob))) as others, \
            watch.opened(Credential(token_digest=digest("pcr_configured"))) as configured, \
            watch.opened(None) as unnamed:
        await watch.check()
        assert not any(c.ended.is_set() for c in (bearer, browser, others, configured))
        assert unnamed.reason == "revoked"  # a connection no credential names never outlives a check
        await web.end(cookie)
        await watch.check()
        assert browser.reason == "revoked" and bearer.reason is None
        await tokens.revoke("alice")
        await watch.check()
        assert bearer.reason == "revoked" and bearer.code.value == "UNAUTHENTICATED" and "revoked" in bearer.why
        assert others.reason is None and configured.reason is None
    assert not watch._open  # closed connections leave nothing behind


async def test_a_connection_ends_at_its_maximum_lifetime(bus: Bus) -> None:
    tokens = TokenStore(bus.redis, bus.keys)
    watch = Connections(tokens, WebSessions(bus.redis, bus.keys, tokens), max_life_s=0.05, check_s=0.02)
    token = await tokens.create("alice")
    await watch.start()
    try:
        with watch.opened(Credential(token_digest=digest(token))) as connection:
            await asyncio.wait_for(connection.ended.wait(), 10)
            assert connection.reason == "expired" and "max_connection_s" in connection.why
    finally:
        await watch.close()


async def test_a_stream_stops_when_its_connection_ends_and_its_source_is_closed() -> None:
    closed = asyncio.Event()
    taken = []

    async def source() -> AsyncIterator[int]:
        try:
            async with asyncio.timeout(30):  # held across yields: the source must stay in one task
                for n in range(1000):
                    yield n
                    await asyncio.sleep(0)
        finally:
            closed.set()

    watch = Connections(None, None, max_life_s=60)  # type: ignore[arg-type]  # no credential is checked here
    with watch.opened(Credential(token_digest="x")) as connection:
        async for item in until_ended(source(), connection):
            taken.append(item)
            if item == 5:
                connection.end("revoked")
    assert taken == [0, 1, 2, 3, 4, 5]
    await asyncio.wait_for(closed.wait(), 5)


async def _keys(bus: Bus, kind: str) -> int:
    return len([k async for k in bus.redis.scan_iter(match=f"{bus.keys.prefix}{{tokens}}:{kind}:*")])


async def test_a_token_keeps_a_bounded_number_of_sign_ins_and_revoking_it_ends_them_all(bus: Bus) -> None:
    from gateway.tokens import MOST_BROWSERS, MOST_CODES

    tokens = TokenStore(bus.redis, bus.keys)
    web = WebSessions(bus.redis, bus.keys, tokens)
    alice, bob = await tokens.create("alice"), await tokens.create("bob")
    cookies = [await web.sign_in(alice) for _ in range(MOST_BROWSERS + 5)]
    assert all(cookies) and await _keys(bus, "web") == MOST_BROWSERS
    assert [await web.identify(c or "") is not None for c in cookies] == [False] * 5 + [True] * MOST_BROWSERS
    codes = [await web.link(alice) for _ in range(MOST_CODES + 3)]
    assert await _keys(bus, "login") == MOST_CODES  # the oldest three codes were ended
    assert await web.redeem(codes[0] or "") is None
    kept = await web.redeem(codes[-1] or "")  # a redeemed code is a new session: the oldest session ends
    assert kept is not None and await web.identify(kept) is not None and await web.identify(cookies[5] or "") is None
    await web.end(kept)  # signing out gives its place back: the next sign-in ends nobody
    assert await web.sign_in(alice) is not None and await web.identify(cookies[6] or "") is not None
    bobs = await web.sign_in(bob)
    assert await tokens.revoke("alice")
    assert await _keys(bus, "web") == 1 and await _keys(bus, "login") == 0  # only bob's is left
    assert not await bus.redis.exists(bus.keys.sign_ins_of(digest(alice)))
    assert await web.identify(bobs or "") is not None
