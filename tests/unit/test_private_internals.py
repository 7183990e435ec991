"""Private internals of other libraries Pincer relies on, checked for the shape it relies on.

Each is used for speed on a hot path and sits under a version pin; when a
release changes one, this fails here, plainly, instead of somewhere deep.
"""

from __future__ import annotations

import asyncio
import inspect


def test_redis_py_reads_replies_through_a_hiredis_parser() -> None:
    # bus.redis_client.HeldConnection reads straight from connection._parser.read_response.
    import hiredis  # noqa: F401 - a dependency; without it the parser is redis-py's Python one
    from redis._parsers import _AsyncHiredisParser
    from redis.asyncio.connection import AbstractConnection, Connection
    connection = Connection()
    assert isinstance(connection._parser, _AsyncHiredisParser)
    assert inspect.iscoroutinefunction(_AsyncHiredisParser.read_response)
    assert type(connection).read_response is AbstractConnection.read_response
    from bus.redis_client import _hiredis_reader, connect  # the bus's own connections (translating) too
    assert _hiredis_reader(connect("redis://127.0.0.1:1/0").connection_pool.make_connection()) is not None


def test_redis_py_connections_keep_their_stream_reader_in_reader() -> None:
    # bus.redis_client.HeldConnection asks connection._reader.at_eof() whether Redis closed it.
    from redis.asyncio.connection import AbstractConnection, Connection
    assert "_reader" in AbstractConnection.__slots__
    assert Connection()._reader is None  # set to an asyncio.StreamReader on connect (integration: test_redis_pool)
    assert inspect.signature(asyncio.StreamReader.at_eof).parameters.keys() == {"self"}


def test_redis_py_pipelines_queue_args_and_options_in_command_stack() -> None:
    # bus.batching sends a pipeline's command_stack itself: (args, options) pairs.
    import redis.asyncio as aioredis

    pipe = aioredis.Redis().pipeline(transaction=False)
    pipe.xadd("s", {b"k": b"v"}, maxlen=10, approximate=True)
    ((args, options),) = pipe.command_stack
    assert args[0] == "XADD" and args[1] == "s" and isinstance(options, dict)


def test_redis_py_pools_say_when_a_connection_is_free() -> None:
    # bus.redis_client.WaitingPool waits on can_get_connection() and wakes on release().
    from redis.asyncio.connection import ConnectionPool

    pool = ConnectionPool(max_connections=2)
    assert pool.can_get_connection() is True and pool.max_connections == 2
    assert inspect.iscoroutinefunction(ConnectionPool.release)


def test_pydantic_models_expose_their_core_validator_and_serializer() -> None:
    # bus.protocol encodes and decodes through them directly (half the cost of model_dump / validate).
    from bus.protocol import ChatCancel

    message = ChatCancel.__pydantic_validator__.validate_python({"type": "chat:cancel", "session_id": "s"})
    assert isinstance(message, ChatCancel)
    dumped = ChatCancel.__pydantic_serializer__.to_python(message, mode="json", exclude_none=True)
    assert dumped == {"type": "chat:cancel", "session_id": "s", "by": ""}
