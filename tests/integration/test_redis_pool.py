"""The bus's connection pool: a burst past max_connections waits for a free connection instead of failing."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError

from bus.redis_client import HeldConnection, WaitingPool, connect
from tests.conftest import async_wait_until


async def all_in_use(redis, count: int = 4) -> None:  # type: ignore[no-untyped-def]
    await async_wait_until(lambda: len(redis.connection_pool._in_use_connections) == count, timeout=5,
                           what=f"{count} connections in use")


async def test_a_burst_past_the_pool_waits_and_every_command_succeeds(redis_url: str) -> None:
    redis = connect(redis_url, max_connections=4)
    try:
        # Four BLPOPs hold every connection for a moment; 50 GETs arrive meanwhile.
        blocked = [asyncio.ensure_future(redis.blpop([f"pool-test-{i}"], timeout=0.3)) for i in range(4)]
        await all_in_use(redis)
        answers = await asyncio.gather(*(redis.incr("pool-test-counter") for _ in range(50)))
        assert sorted(answers)[-1] - sorted(answers)[0] == 49
        assert await asyncio.gather(*blocked) == [None] * 4
        pool = redis.connection_pool
        assert isinstance(pool, WaitingPool) and len(pool._in_use_connections) + len(pool._available_connections) <= 4
        assert not pool._waiters
    finally:
        await redis.delete("pool-test-counter")
        await redis.aclose()


async def test_a_caller_cancelled_while_waiting_leaves_no_waiter_behind(redis_url: str) -> None:
    redis = connect(redis_url, max_connections=4)
    try:
        holders = [asyncio.ensure_future(redis.blpop([f"pool-hold-{i}"], timeout=0.5)) for i in range(4)]
        await all_in_use(redis)
        waiting = asyncio.ensure_future(redis.get("x"))
        await async_wait_until(lambda: len(redis.connection_pool._waiters) == 1, timeout=5, what="one waiter")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not redis.connection_pool._waiters
        await asyncio.gather(*holders)
        assert await redis.ping()
    finally:
        await redis.aclose()


async def test_no_connection_in_time_is_a_clear_error(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WaitingPool, "WAIT_S", 0.1)
    redis = connect(redis_url, max_connections=4)
    try:
        holders = [asyncio.ensure_future(redis.blpop([f"pool-slow-{i}"], timeout=1)) for i in range(4)]
        await all_in_use(redis)
        with pytest.raises(ConnectionError, match=r"redis\.max_connections"):
            await redis.get("x")
        await asyncio.gather(*holders)
    finally:
        await redis.aclose()


async def test_a_held_connection_the_server_closed_reconnects_before_sending(redis_url: str) -> None:
    """As after a Redis restart or failover: the next send goes out on a new connection, not into the old one."""
    redis = connect(redis_url)
    held = HeldConnection(redis)
    try:
        own_id = await held.execute("CLIENT", "ID")
        old = held._connection
        assert old is not None and isinstance(old._reader, asyncio.StreamReader)
        assert await redis.execute_command("CLIENT", "KILL", "ID", own_id) == 1  # the server closes it
        await async_wait_until(lambda: old._reader is not None and old._reader.at_eof(), what="the close seen")
        assert await held.execute("XADD", "after-close", "*", "k", "v")  # not "Connection closed by server"
        assert await redis.xlen("after-close") == 1
    finally:
        await held.aclose()
        await redis.aclose()
