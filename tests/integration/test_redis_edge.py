"""Redis's one edge: every way a command can fail on the bus's connections leaves as Pincer's RedisAway or
RedisRefused (still redis-py's own kinds underneath, which its pipelines and retries go on catching), and
the redis-py internals the bus relies on are where it expects them for the version installed."""

from __future__ import annotations

import socket

import pytest
import redis
from redis import exceptions as redis_errors

from bus.errors import PincerError
from bus.redis_client import HeldConnection, RedisAway, RedisRefused, _closed_by_server, _hiredis_reader, connect
from tests.conftest import async_wait_until

FAILING_SCRIPT = "return redis.error_reply('ERR the script says no')"


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_no_server_is_redis_away_a_pincer_error() -> None:
    client = connect(f"redis://127.0.0.1:{unused_port()}/0")
    try:
        with pytest.raises(RedisAway, match=r"(?i)connect") as caught:
            await client.get("k")
        assert isinstance(caught.value, PincerError) and isinstance(caught.value, redis_errors.ConnectionError)
        with pytest.raises(RedisAway):
            await HeldConnection(client).execute("PING")
    finally:
        await client.aclose()


async def test_refusals_are_redis_refused_by_command_script_pipeline_and_held_connection(redis_url: str) -> None:
    client = connect(redis_url)
    try:
        await client.set("edge:str", "x")
        with pytest.raises(RedisRefused, match="WRONGTYPE"):
            await client.lpush("edge:str", "y")
        with pytest.raises(RedisRefused, match="the script says no"):
            await client.register_script(FAILING_SCRIPT)()
        with pytest.raises(RedisRefused, match=r"(?i)no such key"):
            await client.xinfo_groups("edge:no-stream")
        pipe = client.pipeline(transaction=False)
        pipe.get("edge:str").lpush("edge:str", "y")
        value, refused = await pipe.execute(raise_on_error=False)
        assert value == b"x" and isinstance(refused, RedisRefused)
        held = HeldConnection(client)
        try:
            with pytest.raises(RedisRefused, match="WRONGTYPE"):
                await held.execute("LPUSH", "edge:str", "y")
            (result,) = await held.send([(("LPUSH", "edge:str", "y"), {})])
            assert isinstance(result, RedisRefused)
            assert await held.execute("GET", "edge:str") == b"x"  # the connection is still good
        finally:
            await held.aclose()
        # a script that is not loaded yet still goes out by EVAL: redis-py's NOSCRIPT is left as it is
        assert await client.register_script("return 7")() == 7
    finally:
        await client.delete("edge:str")
        await client.aclose()


async def test_the_redis_py_internals_the_bus_reads_are_there(redis_url: str) -> None:
    """The bus reads replies through the hiredis parser and sees a server's close without I/O: both rest
    on redis-py internals (also checked at the lowest pin: tests/e2e/test_lowest_pins.py)."""
    client = connect(redis_url)
    held = HeldConnection(client)
    try:
        assert await held.execute("PING") in (True, b"PONG")
        connection = held._connection
        assert connection is not None
        assert _hiredis_reader(connection) is not None, f"redis-py {redis.__version__}: the hiredis parser moved"
        assert not _closed_by_server(connection)
        await client.client_kill_filter(_id=int(await held.execute("CLIENT", "ID")))
        await async_wait_until(lambda: _closed_by_server(connection), timeout=5, what="the close seen without a read")
        # the next send reconnects instead of failing
        assert await held.execute("PING") in (True, b"PONG")
    finally:
        await held.aclose()
        await client.aclose()
