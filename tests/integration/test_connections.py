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
