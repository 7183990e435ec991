"""One reader per Gateway for every followed session: many clients, slow clients, nothing missed or doubled."""

from __future__ import annotations

import asyncio

from bus.protocol import ChatDelta
from bus.streams import Bus
from gateway.server.fanout import QUEUE, WAKE_KEEP_S, Fanout
from gateway.turns.events import Event, SessionEvents


def delta(session: str, n: int) -> ChatDelta:
    return ChatDelta(session_id=session, message_id="m", text=f"t{n}")


async def take(subscription, count: int) -> list[str]:
    texts: list[str] = []
    async for item in subscription.events():
        assert isinstance(item, Event), item
        texts.append(item.data["text"])
        if len(texts) == count:
            return texts
    return texts


async def test_more_clients_than_redis_connections_all_get_every_event(bus: Bus) -> None:
    log = SessionEvents(bus, keep=1000, keep_s=600)
    fanout = Fanout(bus, log, instance_id="g-many", block_ms=500)
    clients = bus.settings.max_connections + 72  # a blocking read each would have stalled past the pool
    try:
        readers = [asyncio.create_task(take(fanout.subscribe(f"many-{n % 3}", "0-0"), 5)) for n in range(clients)]
        for n in range(5):
            for session in range(3):
                await log.append(f"many-{session}", delta(f"many-{session}", n))
        got = await asyncio.wait_for(asyncio.gather(*readers), 30)
        assert all(texts == ["t0", "t1", "t2", "t3", "t4"] for texts in got)
        assert 0 < await bus.redis.ttl(fanout.wake_key) <= WAKE_KEEP_S  # a Gateway killed -9 leaves none for good
    finally:
        await fanout.close()


async def test_a_slow_client_catches_up_from_the_log_with_nothing_missed_or_doubled(bus: Bus) -> None:
    log = SessionEvents(bus, keep=5000, keep_s=600)
    fanout = Fanout(bus, log, instance_id="g-slow", block_ms=500)
    try:
        slow = fanout.subscribe("slow", "0-0")
        fast = fanout.subscribe("slow", "0-0")
        slow_events = slow.events()
        first = await anext_after(slow_events, log, "slow", 0)  # live now, then not reading for a while
        fast_reader = asyncio.create_task(take(fast, QUEUE * 3))
        for n in range(1, QUEUE * 3):
            await log.append("slow", delta("slow", n))
        assert await asyncio.wait_for(fast_reader, 30) == [f"t{n}" for n in range(QUEUE * 3)]
        rest = [first] + [(await anext(slow_events)).data["text"] for _ in range(QUEUE * 3 - 1)]  # type: ignore[union-attr]
        assert rest == [f"t{n}" for n in range(QUEUE * 3)]  # its queue overflowed; the log filled the gap
        assert not slow.live or slow.queue.qsize() <= QUEUE
    finally:
        await fanout.close()


async def anext_after(events, log: SessionEvents, session: str, n: int) -> str:
    await log.append(session, delta(session, n))
    item = await asyncio.wait_for(anext(events), 10)
    return item.data["text"]
