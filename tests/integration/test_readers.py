"""Held connections: blocking readers hold one each for their life and give it back when they
stop; the batcher holds one for its writes, replaces it when it breaks, and sends a flush of
several commands as one transaction; replies come out as redis-py's pipelines give them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import ResponseError

from bus.codec import decode
from bus.consumer import GroupConsumer
from bus.protocol import ToolCancel, ToolExecute, ToolResult, now_ms
from bus.redis_client import _hiredis_reader
from bus.replies import ReplyInbox
from bus.streams import Bus
from tests.conftest import async_wait_until


def _in_use(bus: Bus) -> int:
    """Connections of the bus's pool taken and not given back (redis-py's public count)."""
    return sum(count for count, attributes in bus.redis.connection_pool.get_connection_count()
               if "used" in attributes.values())


async def _echo(message, _stream):
    assert isinstance(message, ToolExecute)
    return [(message.reply_to, ToolResult(call_id=message.call_id, success=True, data=message.args,
                                          metadata={"tool_name": message.tool}))]


async def test_a_closed_inbox_gives_its_read_connection_back(bus: Bus) -> None:
    stop = asyncio.Event()
    consumer = GroupConsumer(bus, streams=[bus.keys.hands_requests], group="hands", consumer="c1", handler=_echo,
                             block_ms=200)
    running = asyncio.create_task(consumer.run(stop))
    held = 0
    try:
        for round_ in range(12):
            inbox = ReplyInbox(bus, f"asker-{round_}", block_ms=200)
            await inbox.start()
            call = ToolExecute(tool="echo", args={"n": round_}, reply_to=inbox.stream, deadline=now_ms() + 10_000)
            reply = await inbox.request(bus.keys.hands_requests, call, call.call_id, timeout=10)
            assert isinstance(reply, ToolResult) and reply.data == {"n": round_}
            await inbox.close()
            # The consumer's reader and the batcher's write connection stay taken; an inbox
            # that kept its reader's would leave one more in use every round.
            if round_ == 0:
                held = _in_use(bus)
            assert _in_use(bus) == held, round_
    finally:
        stop.set()
        await running
    assert _in_use(bus) == held - 1  # the stopped consumer gave its reader's back too
    await bus.batcher.close()
    assert _in_use(bus) == 0


async def test_the_batchers_writes_go_on_after_redis_drops_its_connection(bus: Bus) -> None:
    await bus.publish("events", ToolCancel(call_id="a"))
    assert _in_use(bus) == 1  # the batcher's
    held = bus.batcher._held._connection
    assert held is not None and await bus.redis.client_kill_filter(_type="normal", skipme=True) >= 1
    # Once the close is seen, the next write goes out on a new connection instead of failing on the old one
    # (a write the close cuts short fails its callers: tests/unit/test_batching.py).
    await async_wait_until(lambda: held._reader is None or held._reader.at_eof(), what="the close seen")
    await asyncio.gather(bus.publish("events", ToolCancel(call_id="b")), bus.publish("events", ToolCancel(call_id="c")))
    assert [decode(fields).call_id for _id, fields in await bus.redis.xrange("events")] == ["a", "b", "c"]
    assert _in_use(bus) == 1
    await bus.batcher.close()
    assert _in_use(bus) == 0


async def test_a_consumer_whose_group_vanished_recreates_it_and_answers_again(bus: Bus) -> None:
    stop = asyncio.Event()
    consumer = GroupConsumer(bus, streams=[bus.keys.hands_requests], group="hands", consumer="c1", handler=_echo,
                             block_ms=100)
    running = asyncio.create_task(consumer.run(stop))
    inbox = ReplyInbox(bus, "asker", block_ms=200)
    await inbox.start()

    async def ask(n: int) -> None:
        call = ToolExecute(tool="echo", args={"n": n}, reply_to=inbox.stream, deadline=now_ms() + 10_000)
        reply = await inbox.request(bus.keys.hands_requests, call, call.call_id, timeout=10)
        assert isinstance(reply, ToolResult) and reply.data == {"n": n}

    try:
        await ask(1)
        await bus.redis.xgroup_destroy(bus.keys.hands_requests, "hands")  # as a Redis without persistence restarts
        await ask(2)  # the reader's NOGROUP refusal reached the consumer, which made the group again
        assert [g["name"] for g in await bus.redis.xinfo_groups(bus.keys.hands_requests)] == [b"hands"]
    finally:
        await inbox.close()
        stop.set()
        await running


async def test_a_read_cut_short_never_leaves_its_reply_for_the_next_command(bus: Bus) -> None:
    reader = bus.reader()
    waiting = asyncio.create_task(reader.execute("BLPOP", "queue", 5))

    async def blocked() -> bool:  # Redis lists the client as blocked in BLPOP
        return any(c.get("cmd") == "blpop" and "b" in c.get("flags", "") for c in await bus.redis.client_list())
    await async_wait_until(blocked, timeout=10, what="the BLPOP blocking in Redis")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    # The connection was dropped; Redis notices a closed socket on its next turn, and until then
    # it would still hand the item to the BLPOP (to a socket nobody reads): wait for that fact.
    await async_wait_until(lambda: _not(blocked()), timeout=10, what="Redis seeing the BLPOP's connection gone")
    await bus.redis.lpush("queue", "item")
    # Had the connection been kept, the BLPOP would have taken the item and its reply would
    # now answer the PING.
    assert await reader.execute("PING") is True  # redis-py's PING callback: PONG came back
    assert await bus.redis.lrange("queue", 0, -1) == [b"item"]
    await reader.aclose()


async def test_a_held_connection_gives_the_results_a_redis_py_pipeline_gives(bus: Bus) -> None:
    """Replies are read straight from the hiredis parser and given redis-py's callbacks, not
    through ``Redis.parse_response``: the same results, refusals among them, as ``Pipeline.execute``,
    as a plain pipeline and as a transaction."""

    def build(transaction: bool):
        pipe = bus.redis.pipeline(transaction=transaction)
        pipe.xadd("events", {b"k": b"v"}, id="1-1")
        pipe.set("once", "v", nx=True)  # a callback: True, then None
        pipe.set("once", "v", nx=True)
        pipe.hset("h", mapping={"a": "1"})
        pipe.hgetall("h")  # a callback: pairs to a dict
        pipe.xadd("text", {b"k": b"v"})  # refused as it runs: WRONGTYPE
        pipe.xrange("events")  # a callback: (id, fields) pairs
        pipe.xack("events", "nogroup", "1-1")
        pipe.zrange("z", 0, -1, withscores=True)  # an option the callback takes
        return pipe

    def shown(results):
        return [type(r) if isinstance(r, Exception) else r for r in results]

    for transaction in (False, True):
        await bus.redis.delete("events", "once", "h", "z")
        await bus.redis.set("text", "x")
        await bus.redis.zadd("z", {"m": 1.5})
        expected = await build(transaction).execute(raise_on_error=False)
        await bus.redis.delete("events", "once", "h")
        held = bus.reader()
        try:
            got = await held.send(build(transaction).command_stack, transaction=transaction)
            assert _hiredis_reader(held._connection) is not None  # the fast path was taken
        finally:
            await held.aclose()
        assert shown(got) == shown(expected), transaction
        assert got[1] is True and got[2] is None and got[4] == {b"a": b"1"} and "WRONGTYPE" in str(got[5])
        assert got[8] == [(b"m", 1.5)]


async def test_a_transaction_redis_refuses_while_queueing_raises_and_applies_nothing(bus: Bus) -> None:
    await bus.redis.delete("counter")
    held = bus.reader()
    try:
        with pytest.raises(ResponseError, match="wrong number of arguments"):
            await held.send([(("INCR", "counter"), {}), (("GET",), {})], transaction=True)
        assert await held.execute("PING") is True  # the connection stays usable
    finally:
        await held.aclose()
    assert await bus.redis.get("counter") is None


async def test_a_round_redis_refuses_while_queueing_it_is_not_applied_and_stays_pending(bus: Bus, caplog) -> None:
    """Out of memory (noeviction), Redis refuses the round's commands as they are queued: neither
    the reply nor the ack lands (the ack would have, outside a transaction), so the entry stays
    pending for the reaper instead of being acknowledged with its answer lost."""
    stream = bus.keys.hands_requests
    go = asyncio.Event()

    async def answer_when_told(message, _stream):
        await go.wait()
        return [("answers", ToolCancel(call_id=message.call_id))]

    stop = asyncio.Event()
    consumer = GroupConsumer(bus, streams=[stream], group="hands", consumer="c1", handler=answer_when_told,
                             block_ms=100)
    running = asyncio.create_task(consumer.run(stop))
    await bus.publish(stream, ToolCancel(call_id="c1"))
    limits = await bus.redis.config_get("maxmemory*")
    try:
        await async_wait_until(lambda: consumer.in_flight, what="the call in its handler")
        await bus.redis.config_set("maxmemory-policy", "noeviction")
        await bus.redis.config_set("maxmemory", 1)
        go.set()
        await async_wait_until(lambda: not consumer.in_flight, what="its round written or refused")
    finally:
        await bus.redis.config_set("maxmemory", limits["maxmemory"])
        await bus.redis.config_set("maxmemory-policy", limits["maxmemory-policy"])
        stop.set()
        await running
    assert "reply not written" in caplog.text and "maxmemory" in caplog.text
    assert await bus.redis.xlen("answers") == 0
    assert (await bus.redis.xpending(stream, "hands"))["pending"] == 1


async def _not(condition: Any) -> bool:
    return not await condition
