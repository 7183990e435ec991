"""The reaper on a real Redis: takeover, poison entries, gone consumers, trimming, drain and hand-back."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest
from redis import exceptions as redis_errors

from bus.codec import decode
from bus.consumer import GroupConsumer, delivery
from bus.outage import QUICK_CUTOFFS
from bus.presence import Presence
from bus.protocol import ChatMessage, ChatReply, Message
from bus.reaper import Reaper, trim_delivered
from bus.redis_client import NotReplicated
from bus.settings import RedisSettings
from bus.streams import Bus
from tests.conftest import async_wait_until, nothing_pending

GROUP = "workers"


@pytest.fixture
def pool_bus(bus: Bus) -> Bus:
    settings = RedisSettings(prefix=bus.keys.prefix, claim_idle_s=0.3, reap_interval_s=0.1, max_deliveries=2,
                             drain_timeout_s=0.2)
    return dataclasses.replace(bus, settings=settings)


def message(text: str) -> ChatMessage:
    return ChatMessage(session_id="s", text=text, reply_to="pincer-test:replies")


class Worker:
    """A consumer whose handler records what it saw (and the delivery count), optionally slowly."""

    def __init__(self, bus: Bus, stream: str, name: str, *, delay: float = 0.0,
                 on_poison: Any = None) -> None:
        self.seen: list[tuple[str, int]] = []
        self.delay = delay
        self.consumer = GroupConsumer(bus, streams=[stream], group=GROUP, consumer=name, handler=self.handle,
                                      block_ms=100)
        self.reaper = Reaper(bus, self.consumer, bus.settings, on_poison=on_poison)
        self.presence = Presence(bus, GROUP, name, interval_s=0.2)
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def handle(self, msg: Message, _stream: str) -> list:
        assert isinstance(msg, ChatMessage)
        self.seen.append((msg.text, delivery.get()))
        await asyncio.sleep(self.delay)
        return []

    async def start(self) -> Worker:
        await self.presence.start()
        await self.reaper.start()
        self.task = asyncio.create_task(self.consumer.run(self.stop))
        return self

    async def close(self) -> None:
        self.stop.set()
        if self.task:
            await self.task
        await self.reaper.close()
        await self.presence.stop()


async def grab_and_die(bus: Bus, stream: str, name: str, count: int = 1) -> list[str]:
    """A consumer that reads entries and dies without acknowledging them."""
    await bus.ensure_group(stream, GROUP)
    got = await bus.redis.xreadgroup(GROUP, name, {stream: ">"}, count=count)
    return [raw.decode() for raw, _ in got[0][1]]


async def test_a_dead_consumers_entry_is_taken_over_and_the_consumer_forgotten(pool_bus: Bus) -> None:
    stream = pool_bus.keys.hands_requests
    await pool_bus.publish(stream, message("orphan"))
    await grab_and_die(pool_bus, stream, "dead-worker")
    live = await Worker(pool_bus, stream, "live").start()
    try:
        await async_wait_until(lambda: live.seen, what="the orphan taken over")
        assert live.seen == [("orphan", 2)]  # handled as a redelivery
        await nothing_pending(pool_bus, stream, GROUP)

        async def forgotten() -> bool:
            names = [c["name"] for c in await pool_bus.redis.xinfo_consumers(stream, GROUP)]
            return b"dead-worker" not in names and "dead-worker" not in names

        await async_wait_until(forgotten, what="the dead consumer removed from the group")
    finally:
        await live.close()


async def test_a_gone_consumer_still_holding_work_is_not_forgotten_before_its_work_is_claimed(
        pool_bus: Bus) -> None:
    stream = pool_bus.keys.hands_requests
    await pool_bus.publish(stream, message("held"))
    await grab_and_die(pool_bus, stream, "dead-worker")
    reaper_only = Worker(pool_bus, stream, "live")
    await reaper_only.presence.start()
    try:
        await reaper_only.reaper._forget_gone(stream)  # no claim first: its entry is still pending
        names = [c["name"] for c in await pool_bus.redis.xinfo_consumers(stream, GROUP)]
        assert b"dead-worker" in names or "dead-worker" in names
        assert (await pool_bus.redis.xpending(stream, GROUP))["pending"] == 1
    finally:
        await reaper_only.presence.stop()


async def test_poison_entries_go_to_dead_after_max_deliveries_and_the_caller_hears(pool_bus: Bus) -> None:
    stream = pool_bus.keys.brain_inbox
    answered: list[Message] = []

    async def on_poison(msg: Message) -> list:
        answered.append(msg)
        return [("pincer-test:replies", ChatReply(session_id="s", message_id=msg.message_id, text="gave up"))]

    poison = message("kills every worker")
    await pool_bus.publish(stream, poison)
    (entry_id,) = await grab_and_die(pool_bus, stream, "first")  # it took it and died ...
    await pool_bus.redis.xclaim(stream, GROUP, "second", min_idle_time=0, message_ids=[entry_id])  # ... so did this
    live = await Worker(pool_bus, stream, "live", on_poison=on_poison).start()
    try:
        await async_wait_until(lambda: answered, what="the poison answered")
        # on_poison is asked first; its answer, then the dead letter, are written after it returns.
        dead = await async_wait_until(lambda: pool_bus.redis.xrange(pool_bus.keys.dead), what="the poison in dead")
        assert len(dead) == 1 and b"delivered 3 times" in dead[0][1][b"dead:reason"]
        assert decode(dead[0][1]).message_id == poison.message_id  # kept whole, to retry
        assert live.seen == []  # never handed to the handler again
        await nothing_pending(pool_bus, stream, GROUP)
        replies = await pool_bus.redis.xrange("pincer-test:replies")
        assert decode(replies[-1][1]).text == "gave up"
    finally:
        await live.close()
        await pool_bus.redis.delete("pincer-test:replies")


async def test_redis_away_mid_handling_is_no_delivery_and_the_entry_runs_again_where_it_was(pool_bus: Bus) -> None:
    """A handler that meets Redis away (a failover whose replica does not confirm writes yet) keeps its entry:
    renewed, never claimed, so the outage does not count toward max_deliveries (2 here), and it runs again in
    the same consumer once writes go through. Each failed run outlasts claim_idle_s (0.3 s): before, every
    one was a takeover, and the second made the entry poison. (Redis here takes the next write at once, so
    fewer failures than QUICK_CUTOFFS: more would be a handler failing on its own, left to the reaper.)"""
    stream = pool_bus.keys.brain_inbox
    poisoned: list[Message] = []

    async def on_poison(msg: Message) -> list:
        poisoned.append(msg)
        return []

    worker = Worker(pool_bus, stream, "holder", on_poison=on_poison)
    handle = worker.handle
    failures = QUICK_CUTOFFS - 1

    async def away_a_while(msg: Message, stream_: str) -> list:
        await handle(msg, stream_)
        if len(worker.seen) <= failures:
            await asyncio.sleep(0.4)
            raise NotReplicated("0 of the 1 replicas redis.min_replicas asks for confirmed the write")
        return []

    worker.consumer.handler = away_a_while
    await worker.start()
    try:
        await pool_bus.publish(stream, message("through the failover"))
        await async_wait_until(lambda: len(worker.seen) == failures, what="the last failed run")
        (pending,) = await pool_bus.redis.xpending_range(stream, GROUP, min="-", max="+", count=10)
        assert pending["consumer"] == b"holder" and pending["times_delivered"] == 1
        await nothing_pending(pool_bus, stream, GROUP)
        # run here each time; the handler sees each rerun as a repeat, though Redis counted one delivery
        assert worker.seen == [("through the failover", 1)] + [("through the failover", 2)] * failures
        assert not poisoned and not await pool_bus.redis.xrange(pool_bus.keys.dead)
    finally:
        await worker.close()


async def test_an_entry_taken_over_from_a_slow_holder_is_not_taken_back_by_its_renewal(pool_bus: Bus) -> None:
    """A holder too slow to renew (a stalled process) loses its entry to a takeover: its next renewal must leave
    it with the taker (an XCLAIM would take it back, and both would run it), and its drain must not hand it back."""
    bus = dataclasses.replace(pool_bus, settings=pool_bus.settings.model_copy(update={"claim_idle_s": 30.0}))
    stream = bus.keys.hands_requests
    entry_id = await bus.publish(stream, message("slow"))
    slow = await Worker(bus, stream, "slow", delay=60).start()
    try:
        await async_wait_until(lambda: slow.seen, what="the slow holder running it")
        await bus.redis.xclaim(stream, GROUP, "taker", min_idle_time=0, message_ids=[entry_id], justid=True)
        await async_wait_until(lambda: entry_id not in slow.consumer.holding[stream], what="the holder letting go")
        assert await bus.pending_to(stream, GROUP, entry_id) == ("taker", 1)
    finally:
        await slow.close()
    assert await bus.pending_to(stream, GROUP, entry_id) == ("taker", 1)


async def test_after_a_pass_that_found_redis_away_nothing_is_claimed_for_claim_idle_s(
        pool_bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    """Live holders could not renew while Redis was away: they get claim_idle_s from when it is back to renew
    before a claim (counted from the failed pass instead, a holder whose own passes were slower to come back
    lost its entry: the two-Brain outage in tests/e2e/test_chaos.py)."""
    stream = pool_bus.keys.hands_requests
    await pool_bus.publish(stream, message("orphan"))
    (entry_id,) = await grab_and_die(pool_bus, stream, "dead-worker")
    await pool_bus.redis.xclaim(stream, GROUP, "dead-worker", min_idle_time=0, message_ids=[entry_id], idle=60_000,
                                justid=True)  # long idle already: claimable at the first pass that may claim
    live = Worker(pool_bus, stream, "live")
    renew, away_at, back_at = live.reaper._renew, [], []

    async def away_once(stream_: str) -> None:
        if not away_at:
            away_at.append(time.monotonic())
            raise redis_errors.ConnectionError("Connection closed by server.")
        back_at.append(time.monotonic())
        await renew(stream_)

    monkeypatch.setattr(live.reaper, "_renew", away_once)
    await live.start()
    try:
        await async_wait_until(lambda: live.seen, timeout=5, what="the orphan taken over")
        # claim_idle_s from the pass that reached Redis again (back_at is read just after that pass's PING)
        assert time.monotonic() - back_at[0] >= pool_bus.settings.claim_idle_s - 0.01
        assert live.seen == [("orphan", 2)]
    finally:
        await live.close()


async def test_trimming_keeps_everything_pending_or_undelivered(pool_bus: Bus) -> None:
    stream = pool_bus.keys.hands_requests
    ids = [await pool_bus.publish(stream, message(f"m{i}")) for i in range(10)]
    await pool_bus.ensure_group(stream, GROUP)
    await pool_bus.ensure_group(stream, "slow-group")  # a second group that has read nothing yet
    assert await trim_delivered(pool_bus.redis, stream, approximate=False) == 0
    await pool_bus.redis.xgroup_setid(stream, "slow-group", ids[7])  # it has been given m0..m7
    read = await pool_bus.redis.xreadgroup(GROUP, "c", {stream: ">"}, count=6)  # m0..m5 given
    await pool_bus.redis.xack(stream, GROUP, *[raw for raw, _ in read[0][1] if raw.decode() not in ids[3:5]])
    # GROUP: m3 and m4 pending, m6.. never given; slow-group: m8.. never given. Keep from m3.
    assert await trim_delivered(pool_bus.redis, stream, approximate=False) == 3
    left = [raw.decode() for raw, _ in await pool_bus.redis.xrange(stream)]
    assert left == ids[3:]


async def test_sigterm_drain_finishes_quick_work_and_hands_back_the_rest(pool_bus: Bus) -> None:
    stream = pool_bus.keys.hands_requests
    slow = await Worker(pool_bus, stream, "slow", delay=30).start()
    await pool_bus.publish(stream, message("long job"))
    await async_wait_until(lambda: slow.seen, what="the slow worker took it")
    await slow.close()  # SIGTERM: drain_timeout_s 0.2, then hand back
    pending = await pool_bus.redis.xpending_range(stream, GROUP, min="-", max="+", count=10)
    assert len(pending) == 1 and pending[0]["time_since_delivered"] >= 3000  # marked idle for takeover
    other = await Worker(pool_bus, stream, "other").start()
    try:
        await async_wait_until(lambda: other.seen, timeout=5, what="the handed-back entry taken over")
        assert other.seen == [("long job", 2)]
    finally:
        await other.close()


async def test_one_reaper_of_the_pool_works_per_interval(pool_bus: Bus) -> None:
    stream = pool_bus.keys.hands_requests
    workers = [Worker(pool_bus, stream, f"w{i}") for i in range(3)]
    turns = [await w.reaper._my_turn(stream) for w in workers]
    assert turns == [True, False, False]
    await async_wait_until(lambda: workers[2].reaper._my_turn(stream), timeout=10,
                           what="the turn passing once the interval is over")


