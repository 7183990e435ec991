"""The transport on fakeredis: group delivery, ack with its reply, dead letters, request/reply."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis import exceptions as redis_errors

from bus.codec import decode
from bus.consumer import GroupConsumer, delivery
from bus.outage import QUICK_CUTOFFS
from bus.protocol import ChatCancel, ToolExecute, ToolsAvailable, ToolsList, now_ms
from bus.redis_client import NotReplicated
from bus.replies import ReplyInbox
from bus.settings import RedisSettings
from bus.streams import Bus
from tests.conftest import async_wait_until, nothing_pending
from tests.fakes import fake_bus as in_memory_bus


@pytest.fixture
async def fake_bus():
    bus = in_memory_bus()
    yield bus
    await bus.close()


def _execute(n: int) -> ToolExecute:
    return ToolExecute(call_id=f"c{n}", tool="t", reply_to="u:reply:b", deadline=now_ms() + 60_000)


async def _run(consumer: GroupConsumer):
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    return stop, task


def _recorder(seen: list[str]):
    """A handler that records the call ids it gets and answers nothing."""
    async def handler(message, _stream):
        seen.append(message.call_id)
        return []
    return handler


async def _consume_all(bus: Bus, stream: str, handler) -> int:
    """One consumer in burst mode: every entry there is handled and answered, none left pending."""
    consumer = GroupConsumer(bus, streams=[stream], group="g", consumer="w1", handler=handler, block_ms=50)
    handled = await consumer.burst()
    await nothing_pending(bus, stream, "g")
    return handled


async def test_group_delivers_each_entry_once_acks_after_replying(fake_bus: Bus) -> None:
    stream = fake_bus.keys.hands_requests
    for n in range(5):  # published before any consumer exists: the group starts at 0, nothing is lost
        await fake_bus.publish(stream, _execute(n))
    seen: list[str] = []

    async def handler(message, _stream):
        seen.append(message.call_id)
        return [("u:reply:b", ChatCancel(session_id=message.call_id))]

    stop, task = await _run(GroupConsumer(fake_bus, streams=[stream], group="g", consumer="w1", handler=handler,
                                          block_ms=50))
    await async_wait_until(lambda: len(seen) == 5, what="5 deliveries")
    await nothing_pending(fake_bus, stream, "g")
    stop.set()
    await task
    assert sorted(seen) == [f"c{n}" for n in range(5)]
    replies = await fake_bus.redis.xrange("u:reply:b")
    assert sorted(decode(f).session_id for _, f in replies) == sorted(seen)


async def _all_acked(bus: Bus, stream: str) -> bool:
    info = await bus.redis.xpending(stream, "g")
    return info["pending"] == 0


async def test_garbage_is_acked_dead_lettered_and_the_loop_goes_on(fake_bus: Bus) -> None:
    stream = fake_bus.keys.hands_requests
    await fake_bus.redis.xadd(stream, {b"type": b"tool:execute", b"data": b"\xc1not msgpack"})
    await fake_bus.redis.xadd(stream, {b"nonsense": b"1"})
    await fake_bus.redis.xadd(stream, {b"type": b"who:knows", b"data": b"\x80"})
    await fake_bus.publish(stream, _execute(9))
    seen: list[str] = []
    await _consume_all(fake_bus, stream, _recorder(seen))
    assert seen == ["c9"]
    dead = await fake_bus.redis.xrange(fake_bus.keys.dead)
    reasons = [fields[b"dead:reason"].decode() for _, fields in dead]
    assert len(dead) == 3
    assert "not msgpack" in reasons[0]
    assert "no 'type' field" in reasons[1]
    assert "unknown message type 'who:knows'" in reasons[2]
    assert dead[1][1][b"nonsense"] == b"1"  # the original fields are kept for inspection
    assert all(f[b"dead:source"] == stream.encode() for _, f in dead)


async def test_a_crashing_handler_dead_letters_the_message_and_keeps_serving(fake_bus: Bus) -> None:
    stream = fake_bus.keys.hands_requests
    await fake_bus.publish(stream, _execute(1))
    await fake_bus.publish(stream, _execute(2))
    seen: list[str] = []

    async def handler(message, _stream):
        if message.call_id == "c1":
            raise RuntimeError("bug")
        seen.append(message.call_id)
        return []

    await _consume_all(fake_bus, stream, handler)
    assert seen == ["c2"]
    dead = await fake_bus.redis.xrange(fake_bus.keys.dead)
    assert dead[0][1][b"dead:reason"] == b"handler crashed: RuntimeError: bug"


async def test_a_handler_cut_off_from_redis_runs_again_in_place_as_the_same_delivery(fake_bus: Bus) -> None:
    stream = fake_bus.keys.hands_requests
    await fake_bus.publish(stream, _execute(1))
    tries: list[int] = []

    async def handler(message, _stream):
        tries.append(delivery.get())
        if len(tries) == 1:  # Redis went away mid-handling (a restart): not the message's fault
            raise redis_errors.ConnectionError("Connection closed by server.")
        return []

    consumer = GroupConsumer(fake_bus, streams=[stream], group="g", consumer="w1", handler=handler, block_ms=50)
    stop, task = await _run(consumer)
    try:
        await async_wait_until(lambda: len(tries) == 2, what="the second run")
        assert tries == [1, 2]  # held and run again here, as a repeat: no takeover, no delivery counted
        await nothing_pending(fake_bus, stream, "g")
        assert await fake_bus.redis.xlen(fake_bus.keys.dead) == 0 and not consumer.holding[stream]
    finally:
        stop.set()
        await task


async def test_a_handler_cut_off_while_redis_takes_writes_goes_back_to_the_reaper(fake_bus: Bus) -> None:
    stream = fake_bus.keys.hands_requests
    await fake_bus.publish(stream, _execute(1))
    tries: list[int] = []

    async def handler(message, _stream):
        tries.append(delivery.get())
        raise redis_errors.ConnectionError("its own connection, not Redis")  # yet Redis takes writes

    consumer = GroupConsumer(fake_bus, streams=[stream], group="g", consumer="w1", handler=handler, block_ms=50)
    stop, task = await _run(consumer)
    try:
        await async_wait_until(lambda: not consumer.holding.get(stream) and tries, what="the entry let go")
        assert tries == [1] + [2] * (QUICK_CUTOFFS - 1)  # not run in place for ever
        pending = await fake_bus.redis.xpending(stream, "g")
        assert pending["pending"] == 1  # left for the reaper, which counts it as a delivery
    finally:
        stop.set()
        await task


async def test_a_handler_whose_own_socket_fails_leaves_its_entry_for_the_reaper_at_once(fake_bus: Bus) -> None:
    stream = fake_bus.keys.hands_requests
    await fake_bus.publish(stream, _execute(1))
    tries: list[int] = []

    async def handler(message, _stream):
        tries.append(delivery.get())
        raise ConnectionRefusedError("a service of its own, not Redis")  # an OSError: no rerun in place

    consumer = GroupConsumer(fake_bus, streams=[stream], group="g", consumer="w1", handler=handler, block_ms=50)
    stop, task = await _run(consumer)
    try:
        await async_wait_until(lambda: tries and not consumer.holding.get(stream), what="the entry let go")
        assert tries == [1] and (await fake_bus.redis.xpending(stream, "g"))["pending"] == 1
    finally:
        stop.set()
        await task


async def test_an_entry_taken_over_during_the_outage_is_not_run_again_here(fake_bus: Bus) -> None:
    stream = fake_bus.keys.hands_requests
    entry_id = await fake_bus.publish(stream, _execute(1))
    tries: list[int] = []

    async def handler(message, _stream):
        tries.append(delivery.get())
        if len(tries) == 1:  # meanwhile a reaper that saw no outage gave it to w2
            await fake_bus.redis.xclaim(stream, "g", "w2", min_idle_time=0, message_ids=[entry_id], justid=True)
            raise redis_errors.ConnectionError("Connection closed by server.")
        return []

    consumer = GroupConsumer(fake_bus, streams=[stream], group="g", consumer="w1", handler=handler, block_ms=50)
    stop, task = await _run(consumer)
    try:
        await async_wait_until(lambda: tries and not consumer.holding.get(stream), what="the entry let go")
        assert tries == [1]  # w2 runs and answers it, not w1 as well
        (row,) = await fake_bus.redis.xpending_range(stream, "g", min="-", max="+", count=10)
        assert row["consumer"] == b"w2"
    finally:
        stop.set()
        await task


async def test_a_stop_during_an_outage_does_not_wait_for_redis(
        fake_bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = fake_bus.keys.hands_requests
    await fake_bus.publish(stream, _execute(1))
    tries: list[int] = []

    async def handler(message, _stream):
        tries.append(delivery.get())
        raise redis_errors.ConnectionError("Connection closed by server.")

    async def away(*_args, **_kwargs):
        raise redis_errors.ConnectionError("Error 111 connecting. Connection refused.")

    consumer = GroupConsumer(fake_bus, streams=[stream], group="g", consumer="w1", handler=handler, block_ms=50,
                             concurrency=1)  # its one slot is held through the outage
    monkeypatch.setattr(fake_bus.batcher, "run", away)  # no write goes through
    stop, task = await _run(consumer)
    await async_wait_until(lambda: tries, what="the handler cut off")
    stop.set()
    await asyncio.wait_for(task, 30)  # ends: the held entry stays pending for whoever runs next
    assert tries == [1] and (await fake_bus.redis.xpending(stream, "g"))["pending"] == 1


async def test_a_read_that_fails_unexpectedly_is_logged_and_the_loop_reads_on(
        fake_bus: Bus, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    stream = fake_bus.keys.hands_requests
    consumer = GroupConsumer(fake_bus, streams=[stream], group="g", consumer="w1", handler=None, block_ms=50)
    read_once, failed = consumer._read_once, []

    async def flaky(*args, **kwargs):
        if not failed:  # a refusal no branch expects (say, a script's error): once
            failed.append(True)
            raise redis_errors.ResponseError("ERR something no one planned for")
        return await read_once(*args, **kwargs)

    monkeypatch.setattr(consumer, "_read_once", flaky)
    seen: list[str] = []
    consumer.handler = _recorder(seen)
    await fake_bus.publish(stream, _execute(1))
    stop, task = await _run(consumer)
    try:
        await async_wait_until(lambda: seen == ["c1"], what="the entry read after the failed read")
    finally:
        stop.set()
        await task
    assert any("reading u:hands:requests failed" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_two_consumers_share_one_group(fake_bus: Bus) -> None:
    stream = fake_bus.keys.hands_requests
    seen: dict[str, list[str]] = {"w1": [], "w2": []}

    def handler_for(name):
        async def handler(message, _stream):
            seen[name].append(message.call_id)
            await asyncio.sleep(0.01)
            return []
        return handler

    runs = [await _run(GroupConsumer(fake_bus, streams=[stream], group="g", consumer=n, handler=handler_for(n),
                                     block_ms=50, concurrency=1, batch=1)) for n in seen]
    for n in range(20):
        await fake_bus.publish(stream, _execute(n))
    await async_wait_until(lambda: len(seen["w1"]) + len(seen["w2"]) == 20, what="all 20")
    for stop, task in runs:
        stop.set()
        await task
    assert sorted(seen["w1"] + seen["w2"], key=lambda c: int(c[1:])) == [f"c{n}" for n in range(20)]
    assert seen["w1"] and seen["w2"]


async def test_restarted_consumer_handles_its_own_pending_entries_first(fake_bus: Bus) -> None:
    stream = fake_bus.keys.hands_requests
    await fake_bus.ensure_group(stream, "g")
    await fake_bus.publish(stream, _execute(1))
    # A previous life of w1 read the entry and died before acking it.
    await fake_bus.redis.xreadgroup("g", "w1", {stream: ">"}, count=10)
    seen: list[str] = []
    await _consume_all(fake_bus, stream, _recorder(seen))
    assert seen == ["c1"]


async def test_request_reply_matches_by_correlation_id_and_times_out(fake_bus: Bus) -> None:
    inbox = ReplyInbox(fake_bus, "brain-1", block_ms=50)
    await inbox.start()
    try:
        request = ToolsList(reply_to=inbox.stream)

        async def answer():
            await asyncio.sleep(0.05)
            await fake_bus.publish(inbox.stream, ToolsAvailable(request_id="someone-else", tools=[]))
            await fake_bus.publish(inbox.stream, ToolsAvailable(request_id=request.request_id, tools=[], digest="d"))

        answering = asyncio.create_task(answer())
        reply = await inbox.request(fake_bus.keys.hands_requests, request, request.request_id, timeout=5)
        await answering
        assert reply.digest == "d"
        sent = await fake_bus.redis.xrange(fake_bus.keys.hands_requests)
        assert decode(sent[0][1]) == request
        with pytest.raises(TimeoutError):
            await inbox.request(fake_bus.keys.hands_requests, ToolsList(reply_to=inbox.stream), "never", timeout=0.1)
    finally:
        await inbox.close()
    assert not await fake_bus.redis.exists(inbox.stream)


async def test_streams_are_capped(fake_bus: Bus) -> None:
    fake_bus.settings = RedisSettings(prefix="u:", reply_maxlen=100)
    stream = fake_bus.keys.hands_control
    for n in range(400):
        await fake_bus.publish(stream, ChatCancel(session_id=str(n)))
    assert await fake_bus.redis.xlen(stream) <= 200  # MAXLEN ~ 100: trimmed in whole nodes, never unbounded


async def test_a_reply_stream_keeps_nothing_older_than_its_age_and_lapses_unwritten(fake_bus: Bus) -> None:
    fake_bus.settings = RedisSettings(prefix="u:", reply_max_age_s=60)
    stream = fake_bus.keys.reply("x")
    old_ms = int(time.time() * 1000) - 61_000
    for n in range(3):  # what a turn said there a minute ago and more: read or not, it goes
        await fake_bus.redis.xadd(stream, {"text": f"my pin is 432{n}"}, id=f"{old_ms + n}-0")
    await fake_bus.publish(stream, ChatCancel(session_id="now"))
    kept = await fake_bus.redis.xrange(stream)
    assert [decode(fields) for _, fields in kept] == [ChatCancel(session_id="now")]
    assert 0 < await fake_bus.redis.pttl(stream) <= 60_000  # no write for the age: the whole stream lapses


async def test_entries_set_aside_free_their_slot_up_to_the_limit_and_always_return_it(fake_bus: Bus) -> None:
    stream = fake_bus.keys.hands_requests
    for n in range(4):
        await fake_bus.publish(stream, _execute(n))
    gate, started, aside = asyncio.Event(), [], []
    consumer = GroupConsumer(fake_bus, streams=[stream], group="g", consumer="w1", handler=None, concurrency=1,
                             aside=2, block_ms=50)

    async def handler(message, _stream):
        started.append(message.call_id)
        aside.append(consumer.set_aside())  # as if it had to wait for something else
        await gate.wait()
        if message.call_id == "c1":
            raise RuntimeError("fails while set aside")  # its slot must still come back
        await consumer.take_back()
        return []

    consumer.handler = handler
    stop, task = await _run(consumer)
    # One slot, two set asides: three entries start; the third keeps its slot, so the fourth waits.
    await async_wait_until(lambda: len(started) == 3, what="three entries started")
    await asyncio.sleep(0.2)
    assert started == ["c0", "c1", "c2"] and aside == [True, True, False]
    gate.set()
    await async_wait_until(lambda: len(started) == 4 and consumer.in_flight == 0, what="all handled")
    stop.set()
    await task
    assert consumer.waiting == 0 and consumer._slots.free == 1  # no slot lost or gained
    assert [f[b"dead:reason"] for _, f in await fake_bus.redis.xrange(fake_bus.keys.dead)] == [
        b"handler crashed: RuntimeError: fails while set aside"]


def _watched_writes(bus: Bus, failures: int = 0) -> list[list[str]]:
    """Records the commands of every write the batcher sends (a pipeline, or a lone command on its
    held connection); the first ``failures`` fail as if Redis were away."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    sent: list[list[str]] = []
    write = bus.batcher._write  # the one place every batched write goes through

    async def watched(pipe):
        sent.append([command[0][0] for command in pipe.command_stack])
        if len(sent) <= failures:
            raise RedisConnectionError("Redis away (test)")
        return await write(pipe)

    bus.batcher._write = watched
    return sent


async def test_a_reply_written_while_redis_is_away_is_retried_and_its_entry_held_until_then(fake_bus: Bus) -> None:
    stream = fake_bus.keys.hands_requests
    await fake_bus.publish(stream, _execute(1))
    consumer = GroupConsumer(fake_bus, streams=[stream], group="g", consumer="w1", concurrency=1, block_ms=50,
                             handler=lambda m, _s: _answer(m))
    attempts = _watched_writes(fake_bus, failures=2)
    stop, task = await _run(consumer)
    await async_wait_until(lambda: len(attempts) >= 1, what="the first write")
    assert consumer.in_flight == 1 and consumer.holding[stream] == {consumer_entry(consumer, stream)}
    await async_wait_until(lambda: len(attempts) >= 3, what="two retries after failures")
    await nothing_pending(fake_bus, stream, "g")  # acked with its reply, once Redis was back
    await async_wait_until(lambda: consumer.in_flight == 0, what="the entry released")
    assert attempts == [["XADD", "PEXPIRE", "XACK"]] * 3  # the reply and its ack together (one transaction), every time
    stop.set()
    await task
    replies = await fake_bus.redis.xrange("u:reply:b")
    assert [decode(f).session_id for _, f in replies] == ["c1"]  # written once, when Redis answered
    assert consumer._slots.free == 1  # its slot came back exactly once


@pytest.mark.parametrize("applied", [True, False], ids=["on-the-primary", "lost-in-a-failover"])
async def test_a_round_too_few_replicas_confirmed_is_written_once(fake_bus: Bus, applied: bool) -> None:
    """Under redis.min_replicas the primary has applied a round whose WAIT fell short: sending it again at once
    would add its reply twice. Once writes are confirmed again it stands, or is sent again if a failover lost it."""
    stream = fake_bus.keys.hands_requests
    await fake_bus.publish(stream, _execute(1))
    async def handler(message, _stream):
        fake_bus.send("u:events", ChatCancel(session_id="event"))  # another caller of the same write
        return await _answer(message)

    consumer = GroupConsumer(fake_bus, streams=[stream], group="g", consumer="w1", block_ms=50, concurrency=1,
                             handler=handler)
    sent: list[list[str]] = []
    write = fake_bus.batcher._write

    async def unconfirmed_once(pipe):
        sent.append([command[0][0] for command in pipe.command_stack])
        if len(sent) > 1:
            return await write(pipe)
        results = await write(pipe) if applied else [1] * len(pipe.command_stack)
        raise NotReplicated("0 of the 1 replicas redis.min_replicas asks for confirmed the write", results)

    fake_bus.batcher._write = unconfirmed_once
    stop, task = await _run(consumer)
    try:
        await async_wait_until(lambda: sent and consumer.in_flight == 0, what="the entry released")
        await nothing_pending(fake_bus, stream, "g")
        again = [["XADD", "PEXPIRE", "XACK"]] if not applied else []  # the round alone, not the event
        assert sent == [["XADD", "XADD", "PEXPIRE", "XACK"], ["PING"], *again]
        replies = await fake_bus.redis.xrange("u:reply:b")
        assert [decode(f).session_id for _, f in replies] == ["c1"]
        assert consumer._slots.free == 1  # its slot came back exactly once
    finally:
        stop.set()
        await task


def consumer_entry(consumer: GroupConsumer, stream: str) -> str:
    (entry,) = consumer.holding[stream]
    return entry


async def _answer(message):
    return [("u:reply:b", ChatCancel(session_id=message.call_id))]


async def test_drain_waits_for_replies_still_on_their_way(fake_bus: Bus) -> None:
    stream = fake_bus.keys.hands_requests
    await fake_bus.publish(stream, _execute(1))
    consumer = GroupConsumer(fake_bus, streams=[stream], group="g", consumer="w1", block_ms=50,
                             handler=lambda m, _s: _answer(m))
    attempts = _watched_writes(fake_bus, failures=1)  # the reply's first write fails: retried 0.1 s later
    stop, task = await _run(consumer)
    await async_wait_until(lambda: len(attempts) == 1, what="the first, failed write")
    stop.set()  # the handler is done; its reply is not in Redis yet
    await task
    assert consumer.in_flight == 0 and attempts == [["XADD", "PEXPIRE", "XACK"]] * 2
    assert await _all_acked(fake_bus, stream)


async def test_a_request_sent_while_redis_is_away_goes_out_once_it_is_back(fake_bus: Bus) -> None:
    inbox = ReplyInbox(fake_bus, "brain-1", block_ms=50)
    await inbox.start()
    try:
        attempts = _watched_writes(fake_bus, failures=2)
        request = ToolsList(reply_to=inbox.stream)

        async def answer():
            await async_wait_until(lambda: len(attempts) >= 3, what="the request sent on the third try")
            await fake_bus.publish(inbox.stream, ToolsAvailable(request_id=request.request_id, tools=[], digest="d"))

        answering = asyncio.create_task(answer())
        reply = await inbox.request(fake_bus.keys.hands_requests, request, request.request_id, timeout=5)
        await answering
        assert reply.digest == "d"
        assert [decode(f) for _, f in await fake_bus.redis.xrange(fake_bus.keys.hands_requests)] == [request]
    finally:
        await inbox.close()


async def test_a_request_redis_refuses_fails_at_once_with_the_reason(fake_bus: Bus) -> None:
    from redis.exceptions import ResponseError

    inbox = ReplyInbox(fake_bus, "brain-1", block_ms=50)
    await inbox.start()
    try:
        await fake_bus.redis.set("u:not-a-stream", "x")
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await inbox.request("u:not-a-stream", ToolsList(reply_to=inbox.stream), "r", timeout=5)
    finally:
        await inbox.close()


async def test_closing_an_inbox_wakes_its_blocking_read_instead_of_waiting_it_out(fake_bus: Bus) -> None:
    inbox = ReplyInbox(fake_bus, "brain-1", block_ms=30_000)
    await inbox.start()
    await asyncio.sleep(0.05)  # its XREAD is blocked now
    await asyncio.wait_for(inbox.close(), timeout=10)  # without the wake-up entry: the whole 30 s block
    assert not await fake_bus.redis.exists(inbox.stream)


async def test_a_rounds_replies_and_acks_go_out_in_one_transaction(fake_bus: Bus) -> None:
    stream = fake_bus.keys.hands_requests
    for n in range(10):  # as many as the consumer's 10 slots: one read
        await fake_bus.publish(stream, _execute(n))
    stacks = _watched_writes(fake_bus)
    await _consume_all(fake_bus, stream, lambda m, _s: _answer(m))
    assert len(stacks) >= 1
    # Read together, answered together; the caller's reply stream is given its lapse once.
    assert stacks[0] == ["XADD", "PEXPIRE", *["XADD"] * 9, "XACK"], stacks
    assert len(await fake_bus.redis.xrange("u:reply:b")) == 10
    assert 0 < await fake_bus.redis.pttl("u:reply:b") <= fake_bus.settings.reply_max_age_s * 1000


async def test_a_reply_refused_as_it_runs_is_acked_with_its_round_and_copied_to_dead(fake_bus: Bus, caplog) -> None:
    stream = fake_bus.keys.hands_requests
    for n in (1, 2, 3):
        await fake_bus.publish(stream, _execute(n))
    await fake_bus.redis.set("u:reply:broken", "not a stream")  # c3's reply is refused (WRONGTYPE)
    # c1 and c2 answer on one stream (in one round, c2's reply queues no lapse of its own): the refusal
    # is still told apart by each entry's own count of commands.

    async def answer(message, _stream):
        target = "u:reply:broken" if message.call_id == "c3" else "u:reply:b"
        return [(target, ChatCancel(session_id=message.call_id))]

    consumer = GroupConsumer(fake_bus, streams=[stream], group="g", consumer="w1", concurrency=3, block_ms=50,
                             handler=answer)
    stop, task = await _run(consumer)
    await async_wait_until(lambda: _stream_length(fake_bus, fake_bus.keys.dead, 1), what="the dead copy")
    await async_wait_until(lambda: consumer.in_flight == 0, what="every entry released")
    stop.set()
    await task
    assert await _all_acked(fake_bus, stream)  # no delivery could ever answer c3: its reply stream is broken
    [(_id, dead)] = await fake_bus.redis.xrange(fake_bus.keys.dead)
    assert decode(dead).call_id == "c3" and b"WRONGTYPE" in dead[b"dead:reason"]
    assert [decode(f).session_id for _, f in await fake_bus.redis.xrange("u:reply:b")] == ["c1", "c2"]
    assert "reply refused" in caplog.text
    assert consumer._slots.free == 3  # every slot came back


async def test_what_a_handler_sent_before_answering_is_never_overtaken_by_its_answer(fake_bus: Bus) -> None:
    stream = fake_bus.keys.hands_requests
    for n in range(10):
        await fake_bus.publish(stream, _execute(n))

    seen: list[str] = []

    async def handler(message, _stream):
        seen.append(message.call_id)
        fake_bus.send("u:reply:b", ChatCancel(session_id=f"progress {message.call_id}"))
        return [("u:reply:b", ChatCancel(session_id=f"result {message.call_id}"))]

    await _consume_all(fake_bus, stream, handler)
    assert len(seen) == 10
    await async_wait_until(lambda: _stream_length(fake_bus, "u:reply:b", 20), what="every event and answer")
    order = [decode(f).session_id for _, f in await fake_bus.redis.xrange("u:reply:b")]
    for n in range(10):
        assert order.index(f"progress c{n}") < order.index(f"result c{n}"), order


async def _stream_length(bus: Bus, stream: str, n: int) -> bool:
    return await bus.redis.xlen(stream) == n


async def test_a_burst_handles_what_is_there_and_what_its_handlers_publish_then_returns(fake_bus: Bus) -> None:
    stream = fake_bus.keys.hands_requests
    consumer = GroupConsumer(fake_bus, streams=[stream], group="g", consumer="w1", handler=None, block_ms=50)
    assert await consumer.burst() == 0  # nothing there: returns at once, no block to wait out
    seen: list[str] = []

    async def handler(message, _stream):
        seen.append(message.call_id)
        if message.call_id == "c1":  # a follow-up, published while the burst runs
            await fake_bus.publish(stream, _execute(99))
        return []

    consumer.handler = handler
    for n in range(3):
        await fake_bus.publish(stream, _execute(n))
    assert await consumer.burst() == 4
    assert sorted(seen) == ["c0", "c1", "c2", "c99"] and consumer.in_flight == 0
    await nothing_pending(fake_bus, stream, "g")
