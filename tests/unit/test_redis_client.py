"""The bus's Redis connections pack commands with hiredis, byte for byte as redis-py's own packer."""

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from bus.redis_client import connect

COMMANDS = [
    ("XADD", "pincer:hands:requests", "MAXLEN", "~", 10_000, "*", b"type", b"tool:execute", b"data", b"\x81\xa1a\x01"),
    ("CLIENT SETNAME", "worker-1"),  # a command name with a space goes out as two words
    (b"CONFIG GET", b"maxmemory"),
    ("SET", "k", 1.5, "PX", 2000),
    ("SET", "k", memoryview(b"view")),
    ("SET", "k", bytearray(b"array")),
    ("SET", "ключ", "значение"),  # text as UTF-8
]


@pytest.mark.parametrize("command", COMMANDS, ids=[str(c[0]) for c in COMMANDS])
def test_packs_as_redis_py_does(command):
    ours = connect("redis://127.0.0.1:6379/0").connection_pool.make_connection()
    theirs = Connection()
    assert type(ours).__name__ == "HiredisConnection"
    assert b"".join(ours.pack_command(*command)) == b"".join(bytes(p) for p in theirs.pack_command(*command))


def test_bad_arguments_raise_redis_py_data_error():
    ours = connect("redis://127.0.0.1:6379/0").connection_pool.make_connection()
    with pytest.raises(DataError):
        ours.pack_command("SET", "k", None)
    with pytest.raises(DataError):
        ours.pack_command("SET", "k", {"a": 1})


def test_unix_socket_urls_keep_their_connection_kind():
    pool = connect("unix:///tmp/redis.sock").connection_pool
    assert pool.connection_class.__name__ == "HiredisUnixDomainSocketConnection"


def test_no_socket_timeout_but_keepalive_on_tcp_and_a_connect_timeout_everywhere():
    import socket

    tcp = connect("redis://127.0.0.1:6379/0").connection_pool.make_connection()
    assert tcp.socket_timeout is None and tcp.socket_connect_timeout == 5
    assert tcp.socket_keepalive and tcp.socket_keepalive_options.get(socket.TCP_KEEPIDLE) == 10
    unix = connect("unix:///tmp/redis.sock").connection_pool.make_connection()
    assert unix.socket_timeout is None and unix.socket_connect_timeout == 5


def test_a_socket_timeout_asked_for_in_the_url_is_honoured():
    conn = connect("redis://127.0.0.1:6379/0?socket_timeout=3").connection_pool.make_connection()
    assert conn.socket_timeout == 3
