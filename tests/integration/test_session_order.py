"""A session's turns run one at a time across Brains, in the Gateway's order; other sessions do not wait."""

from __future__ import annotations

import asyncio

from brain.session_order import SessionOrder
from bus.protocol import ChatMessage
from bus.redis_client import RedisAway
from bus.streams import Bus
from tests.conftest import async_wait_until


def message(session: str, seq: int | None) -> ChatMessage:
    return ChatMessage(session_id=session, text="hi", reply_to="r", seq=seq)


async def test_two_brains_keep_order_within_a_session_and_overlap_across(bus: Bus) -> None:
    brains = [SessionOrder(bus, f"brain{i}", lease_s=5, wait_s=30) for i in range(2)]
    log: list[str] = []

    async def turn(brain: int, session: str, seq: int, delay: float = 0) -> None:
        await asyncio.sleep(delay)
        async with brains[brain].turn(message(session, seq)):
            log.append(f"start {session}{seq}")
            await asyncio.sleep(0.05)
            log.append(f"end {session}{seq}")

    # The later messages reach the Brains first; they still run after the earlier ones.
    await asyncio.gather(turn(0, "a", 3), turn(1, "a", 2, 0.01), turn(0, "a", 1, 0.02), turn(1, "b", 1, 0.03))
    a = [line for line in log if line.endswith(("a1", "a2", "a3"))]
    assert a == ["start a1", "end a1", "start a2", "end a2", "start a3", "end a3"]
    assert log.index("start b1") < log.index("end a1")  # another session ran meanwhile
    await bus.batcher.run(lambda pipe: pipe.ping())  # the releases went with the writes before this one
    assert await bus.redis.get(bus.keys.session_done("a")) == b"3"
    assert not await bus.redis.exists(bus.keys.session_lease("a"))

    await bus.redis.expire(bus.keys.session_done("b"), 600)  # a session that lapses (an unnamed one)
    await turn(0, "b", 2)
    await bus.batcher.run(lambda pipe: pipe.ping())
    assert await bus.redis.get(bus.keys.session_done("b")) == b"2"
    assert 0 < await bus.redis.ttl(bus.keys.session_done("b")) <= 600  # its count still lapses with it


async def test_the_release_goes_with_the_next_write_and_is_sent_again_while_redis_is_away(bus: Bus) -> None:
    order = SessionOrder(bus, "b", lease_s=30, wait_s=30)
    sent, failed = bus.batcher.send, []

    def away_once(build, *, done=None):  # the first write of the release meets Redis away
        if not failed:
            failed.append(build)
            done(RedisAway("connection lost"))
            return
        sent(build, done=done)

    async with order.turn(message("s", 1)):
        bus.batcher.send = away_once  # type: ignore[method-assign]
    assert failed and await bus.redis.exists(bus.keys.session_lease("s"))  # not given back yet
    await async_wait_until(lambda: bus.redis.get(bus.keys.session_done("s")), what="the release sent again")
    assert await bus.redis.get(bus.keys.session_done("s")) == b"1"
    assert not await bus.redis.exists(bus.keys.session_lease("s"))


async def test_a_dead_brains_lease_expires_and_the_next_turn_goes_on(bus: Bus) -> None:
    order = SessionOrder(bus, "survivor", lease_s=1, wait_s=30)
    # A Brain took the lease for message 1 and died: nobody renews it.
    await bus.redis.set(bus.keys.session_lease("s"), "dead-brain:m1", px=1000)
    started = asyncio.get_running_loop().time()
    async with order.turn(message("s", 1)):
        waited = asyncio.get_running_loop().time() - started
    assert waited >= 0.5  # it waited for the lease to lapse, it did not take it over
    assert await bus.redis.get(bus.keys.session_done("s")) == b"1"


async def test_the_lease_is_renewed_while_a_long_turn_runs(bus: Bus) -> None:
    order = SessionOrder(bus, "b", lease_s=1, wait_s=30)
    other = SessionOrder(bus, "c", lease_s=1, wait_s=30)
    log: list[str] = []

    async def long_turn() -> None:
        async with order.turn(message("s", None)):
            log.append("long start")
            await asyncio.sleep(2.5)  # more than twice the lease
            log.append("long end")

    async def second() -> None:
        await async_wait_until(lambda: bus.redis.exists(bus.keys.session_lease("s")), what="the long turn's lease")
        async with other.turn(message("s", None)):
            log.append("second start")

    await asyncio.gather(long_turn(), second())
    assert log == ["long start", "long end", "second start"]


async def test_a_message_whose_predecessor_never_came_goes_on_after_the_wait(bus: Bus) -> None:
    order = SessionOrder(bus, "b", lease_s=5, wait_s=0.3)
    async with order.turn(message("s", 5)):  # 1-4 were lost before any Brain saw them
        pass
    assert await bus.redis.get(bus.keys.session_done("s")) == b"5"


async def test_a_turn_whose_lease_another_brain_took_stops_and_leaves_the_entry_to_it(bus: Bus) -> None:
    from bus.consumer import GroupConsumer

    order = SessionOrder(bus, "stalled", lease_s=1, wait_s=30)
    seen: list[str] = []

    async def handler(msg, _stream):
        async with order.turn(msg) as lease:
            await bus.redis.set(bus.keys.session_lease("s"), "other-brain:m", px=60_000)  # taken while we stalled
            await asyncio.sleep(0.6)  # the renewer notices
            seen.append("checked")
            lease.check()
        return []

    consumer = GroupConsumer(bus, streams=[bus.keys.brain_inbox], group="brain", consumer="stalled",
                             handler=handler, block_ms=100)
    await bus.publish(bus.keys.brain_inbox, message("s", None))
    stop = asyncio.Event()
    running = asyncio.create_task(consumer.run(stop))
    await async_wait_until(lambda: seen, timeout=10, what="the stalled turn checking its lease")
    stop.set()
    await running  # the consumer drains: the handler has finished, without acknowledging
    assert seen == ["checked"]
    pending = await bus.redis.xpending(bus.keys.brain_inbox, "brain")
    assert pending["pending"] == 1  # not acknowledged: the Brain holding the lease answers it
    assert not await bus.redis.xlen(bus.keys.dead)  # and not dead-lettered
    assert await bus.redis.get(bus.keys.session_lease("s")) == b"other-brain:m"  # its lease untouched
