"""Auto-pipelining: many callers in one tick share a round trip, each gets its own result or error."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ResponseError

from bus.batching import Batcher
from bus.redis_client import NotReplicated
from tests.fakes import fake_redis


@pytest.fixture
async def redis():
    client = fake_redis()
    yield client
    await client.aclose()


@pytest.fixture
async def batcher(redis):
    writes = Batcher(redis)
    yield writes
    await writes.close()


async def test_callers_in_one_tick_share_one_round_trip_and_get_their_own_results(redis, batcher) -> None:
    executed = _counting_round_trips(redis)
    results = await asyncio.gather(*(batcher.run(lambda p, n=n: (p.set(f"k{n}", n), p.get(f"k{n}")))
                                     for n in range(50)))
    assert [r[1] for r in results] == [str(n).encode() for n in range(50)]
    assert executed == [102]  # 50 callers, 100 commands, one round trip: one MULTI ... EXEC


async def test_an_error_reaches_only_the_caller_whose_command_failed(redis, batcher) -> None:
    await redis.set("text", "x")
    good = batcher.run(lambda p: p.incr("n"))
    bad = batcher.run(lambda p: p.lpush("text", 1))  # wrong type
    results = await asyncio.gather(good, bad, return_exceptions=True)
    assert results[0] == [1]
    assert isinstance(results[1], ResponseError)
    assert await batcher.run(lambda p: p.incr("n")) == [2]  # and the batcher keeps working


async def test_an_unreachable_server_fails_every_waiting_caller() -> None:
    from redis.asyncio import Redis
    from redis.exceptions import ConnectionError as RedisConnectionError

    redis = Redis.from_url("redis://127.0.0.1:9/0")  # nothing listens on the discard port
    batcher = Batcher(redis)
    results = await asyncio.gather(batcher.run(lambda p: p.incr("a")), batcher.run(lambda p: p.incr("b")),
                                   return_exceptions=True)
    assert all(isinstance(r, RedisConnectionError) for r in results)
    await batcher.close()
    await redis.aclose()


async def test_a_callback_hears_every_result_refusals_included_and_last_queued_follows_the_queue(
    redis, batcher
) -> None:
    await redis.set("text", "x")
    heard: list = []

    def build(p) -> None:
        p.incr("n")
        p.lpush("text", 1)  # refused: wrong type

    batcher.send(build, done=heard.append)
    assert batcher.last_queued is build  # still open: whoever queued it may add to it
    assert await batcher.run(lambda p: p.get("n")) == [b"1"]
    assert batcher.last_queued is None  # taken by the flush
    assert heard[0][0] == 1 and isinstance(heard[0][1], ResponseError)


async def test_sent_writes_keep_their_order_with_awaited_ones_and_failures_are_logged(redis, batcher, caplog) -> None:
    for n in range(3):
        batcher.send(lambda p, n=n: p.rpush("order", f"event {n}"))
    await batcher.run(lambda p: p.rpush("order", "reply"))  # the awaited write goes after the events
    assert await redis.lrange("order", 0, -1) == [b"event 0", b"event 1", b"event 2", b"reply"]
    await redis.set("text", "x")
    batcher.send(lambda p: p.rpush("text", "not a list"))
    await batcher.run(lambda p: p.get("text"))
    await asyncio.sleep(0)
    assert "a write sent without waiting failed" in caplog.text


def _counting_round_trips(redis) -> list[int]:
    """The number of commands of every write sent on a connection of ``redis``'s pool."""
    executed: list[int] = []
    pool = redis.connection_pool
    take = pool.get_connection

    async def counting_connection(*args, **kwargs):
        connection = await take(*args, **kwargs)
        pack = connection.pack_commands

        def counted(commands):
            executed.append(len(commands))
            return pack(commands)

        connection.pack_commands = counted
        return connection

    pool.get_connection = counting_connection
    return executed


async def test_lone_commands_go_alone_and_their_callers_get_their_result_or_refusal(redis, batcher) -> None:
    await redis.set("text", "x")
    writes = _counting_round_trips(redis)
    assert await batcher.run(lambda p: p.incr("n")) == [1]
    try:
        await batcher.run(lambda p: p.lpush("text", 1))  # wrong type
        raise AssertionError("the refusal should reach its caller")
    except ResponseError as refused:
        assert "WRONGTYPE" in str(refused)
    heard: list = []
    batcher.send(lambda p: p.lpush("text", 1), done=heard.append)
    assert await batcher.run(lambda p: p.incr("n")) == [2]  # after the refused one, in order
    assert len(heard) == 1 and isinstance(heard[0][0], ResponseError)
    assert writes == [1, 1, 4]  # only the refused send and the incr queued with it shared a write (a transaction)


async def test_a_flush_redis_refuses_while_queueing_fails_every_caller_and_applies_nothing(redis, batcher) -> None:
    heard: list = []
    batcher.send(lambda p: p.incr("n"), done=heard.append)
    malformed = batcher.run(lambda p: p.execute_command("GET"))  # no key: refused before anything runs
    with pytest.raises(ResponseError, match="wrong number of arguments"):
        await malformed
    assert len(heard) == 1 and isinstance(heard[0], ResponseError)  # its neighbour hears it too
    assert await redis.get("n") is None  # the transaction was not applied
    assert await batcher.run(lambda p: p.incr("n")) == [1]  # and the batcher keeps working


async def test_lone_and_batched_writes_keep_their_order(redis, batcher) -> None:
    batcher.send(lambda p: p.rpush("order", "a"))
    await asyncio.sleep(0)  # its flush has taken it, alone
    for x in "bc":
        batcher.send(lambda p, x=x: p.rpush("order", x))
    await batcher.run(lambda p: p.rpush("order", "d"))
    assert await redis.lrange("order", 0, -1) == [b"a", b"b", b"c", b"d"]


async def test_an_unreachable_server_fails_a_lone_caller_too() -> None:
    from redis.asyncio import Redis
    from redis.exceptions import ConnectionError as RedisConnectionError

    redis = Redis.from_url("redis://127.0.0.1:9/0")
    batcher = Batcher(redis)
    try:
        await batcher.run(lambda p: p.incr("a"))
        raise AssertionError("the caller should hear that Redis is away")
    except RedisConnectionError:
        pass
    await batcher.close()
    await redis.aclose()


async def test_closing_sends_what_is_still_queued_first(redis, batcher) -> None:
    batcher.send(lambda p: p.rpush("events", "last delta"))
    batcher.send(lambda p: p.rpush("events", "reply"))
    await batcher.close()
    assert await redis.lrange("events", 0, -1) == [b"last delta", b"reply"]


async def test_a_write_too_few_replicas_confirmed_gives_each_caller_what_the_primary_applied_of_its_own(
        redis, batcher) -> None:
    write = batcher._write

    async def unconfirmed(pipe):
        raise NotReplicated("0 of the 1 replicas confirmed", await write(pipe))

    batcher._write = unconfirmed
    outcomes: list[object] = []
    batcher.send(lambda p: p.set("a", 1), done=outcomes.append)
    batcher.send(lambda p: (p.incr("n"), p.incr("n")), done=outcomes.append)
    with pytest.raises(NotReplicated) as awaited:
        await batcher.run(lambda p: p.get("a"))
    first, second = outcomes
    assert isinstance(first, NotReplicated) and first.applied == [True]
    assert isinstance(second, NotReplicated) and second.applied == [1, 2]
    assert awaited.value.applied == [b"1"]  # applied on the primary, all the same
