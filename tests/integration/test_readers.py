"""Blocking readers hold one connection each for their life and give it back when they stop."""

from __future__ import annotations

import asyncio

from bus.protocol import ToolExecute, ToolResult, now_ms
from bus.replies import ReplyInbox
from bus.streams import Bus, GroupConsumer


def _in_use(bus: Bus) -> int:
    """Connections of the bus's pool taken and not given back (redis-py's public count)."""
    return sum(count for count, attributes in bus.redis.connection_pool.get_connection_count()
               if "used" in attributes.values())


async def test_a_closed_inbox_gives_its_read_connection_back(bus: Bus) -> None:
    async def echo(message, _stream):
        assert isinstance(message, ToolExecute)
        return [(message.reply_to, ToolResult(call_id=message.call_id, success=True, data=message.args,
                                              metadata={"tool_name": message.tool}))]

    stop = asyncio.Event()
    consumer = GroupConsumer(bus, streams=[bus.keys.hands_requests], group="hands", consumer="c1", handler=echo,
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
            # The consumer's reader and the batcher's lone-write connection stay taken; an inbox
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
