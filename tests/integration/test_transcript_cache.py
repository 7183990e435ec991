"""A Brain's transcripts as it last read them: each read fetches only what was added, and any other change
to the list (deleted, made again, restored shorter) is read afresh, on a real Redis; a turn's first reads
(the transcript, the tools' digest, the notes) go with the step that takes the session."""

from __future__ import annotations

import asyncio

from brain.catalog import ToolCatalog
from brain.llm import Completion
from brain.session_order import SessionOrder
from bus.protocol import ChatMessage, ChatReply
from bus.streams import Bus
from memory.longterm import LongTermMemory
from memory.sessions import SessionStore, TranscriptEntry
from memory.transcript_cache import held_bytes
from tests.conftest import async_wait_until
from tests.integration.brain_fakes import FakeLLM


def said(text: str, role: str = "user") -> TranscriptEntry:
    return TranscriptEntry(role=role, content=text, metadata={"message_id": text})  # type: ignore[arg-type]


async def contents(store: SessionStore, session_id: str) -> list[str | None]:
    return [entry.content for entry in await store.load(session_id)]


async def test_a_read_fetches_only_what_the_session_gained_since(bus: Bus) -> None:
    cached, plain = SessionStore(bus.redis, bus.keys, cache_bytes=2**20), SessionStore(bus.redis, bus.keys)
    await plain.append("s", said("one"), said("two", "assistant"))
    first = await cached.load("s")
    await plain.append("s", said("three"))  # another Brain's turn, say
    fetched: list[tuple[object, ...]] = []
    lrange = bus.redis.lrange

    async def counted(key: str, start: int, end: int) -> list[bytes]:
        fetched.append((start, end))
        return await lrange(key, start, end)

    bus.redis.lrange = counted  # type: ignore[method-assign]  # the whole-list read; the pipeline's is apart
    try:
        second = await cached.load("s")
    finally:
        bus.redis.lrange = lrange  # type: ignore[method-assign]
    assert [e.content for e in second] == ["one", "two", "three"] == await contents(plain, "s")
    assert fetched == []  # no whole read: the head was checked and the tail fetched in one pipeline
    assert second[0] is first[0] and second[1] is first[1]  # the entries held, not parsed again
    assert second[1].marks is first[1].marks  # ... nor their marks
    second.append(said("not kept"))  # a caller's list is its own
    assert await contents(cached, "s") == ["one", "two", "three"]


async def test_a_session_made_again_or_shortened_is_read_afresh(bus: Bus) -> None:
    cached, plain = SessionStore(bus.redis, bus.keys, cache_bytes=2**20), SessionStore(bus.redis, bus.keys)
    await plain.append("s", said("a"), said("b"), said("c"))
    assert await contents(cached, "s") == ["a", "b", "c"]
    await bus.redis.delete(bus.keys.transcript("s"))  # deleted, then made again with as many entries and more
    await plain.append("s", said("x"), said("y"), said("z"), said("w"))
    assert await contents(cached, "s") == ["x", "y", "z", "w"]
    await bus.redis.delete(bus.keys.transcript("s"))  # ... with fewer (a backup from before, a lost tail)
    await plain.append("s", said("x"), said("y"))
    assert await contents(cached, "s") == ["x", "y"]
    await bus.redis.delete(bus.keys.transcript("s"))  # ... gone
    assert await contents(cached, "s") == []
    assert cached.cache is not None and len(cached.cache) == 0
    # The same head, a different last entry held: read afresh too.
    await plain.append("s", said("p"), said("q"))
    assert await contents(cached, "s") == ["p", "q"]
    await bus.redis.lset(bus.keys.transcript("s"), 1, (await bus.redis.lrange(bus.keys.transcript("s"), 0, 0))[0])
    assert await contents(cached, "s") == ["p", "p"]


async def test_the_cache_holds_at_most_its_bytes_oldest_read_dropped_first(bus: Bus) -> None:
    plain = SessionStore(bus.redis, bus.keys)
    for session in ("a", "b", "c"):
        await plain.append(session, said(session * 400))
    one = held_bytes(await bus.redis.lrange(bus.keys.transcript("a"), 0, 0))
    cached = SessionStore(bus.redis, bus.keys, cache_bytes=2 * one)
    for session in ("a", "b", "a", "c"):  # "b" is the one read longest ago when "c" comes
        await cached.load(session)
    assert cached.cache is not None and cached.cache.size <= 2 * one
    assert cached.cache.get("a") is not None and cached.cache.get("c") is not None and cached.cache.get("b") is None
    await plain.append("big", said("z" * 3 * one))
    assert await contents(cached, "big") == ["z" * 3 * one]  # bigger than the whole cache: read, not held
    assert cached.cache.get("big") is None and cached.cache.get("a") is not None


async def test_the_transcript_is_read_in_the_same_step_as_the_session_is_taken(bus: Bus) -> None:
    cached, plain = SessionStore(bus.redis, bus.keys, cache_bytes=2**20), SessionStore(bus.redis, bus.keys)
    order = SessionOrder(bus, "b", lease_s=30, wait_s=30)
    await plain.append("s", said("one"), said("two", "assistant"))
    for seq, expected in ((1, ["one", "two"]), (2, ["one", "two", "three"])):  # a whole read, then the tail
        read = cached.reading("s")
        async with order.turn(ChatMessage(session_id="s", text="hi", reply_to="r", seq=seq), carry=read.build) as lease:
            assert await bus.redis.get(bus.keys.session_lease("s"))  # taken with the read
            found = read.read(lease.carried)
        assert found is not None and [e.content for e in found] == expected
        await plain.append("s", said("three"))
        await bus.batcher.run(lambda pipe: pipe.ping())  # the session given back
    read = cached.reading("s")
    await bus.redis.delete(bus.keys.transcript("s"))  # made again under what the Brain holds
    await plain.append("s", said("x"))
    async with order.turn(ChatMessage(session_id="s", text="hi", reply_to="r", seq=3), carry=read.build) as lease:
        assert lease.carried is not None and read.read(lease.carried) is None  # the caller reads it whole
    assert await contents(cached, "s") == ["x"]


async def test_a_turn_that_waits_for_the_session_does_not_read_the_transcript_at_every_try(bus: Bus) -> None:
    order = SessionOrder(bus, "b", lease_s=30, wait_s=30)
    await SessionStore(bus.redis, bus.keys).append("s", said("one"))
    tries: list[int] = []

    def carry(pipe) -> None:
        tries.append(1)
        pipe.lrange(bus.keys.transcript("s"), 0, -1)

    runs, run = [], bus.batcher.run

    async def counted(build):  # each try is one batched run
        runs.append(build)
        return await run(build)

    bus.batcher.run = counted  # type: ignore[method-assign]
    await bus.redis.set(bus.keys.session_done("s"), 0)  # message 2 waits for message 1
    turn = order.turn(ChatMessage(session_id="s", text="hi", reply_to="r", seq=2), carry=carry)
    waiting = asyncio.create_task(turn.__aenter__())
    await async_wait_until(lambda: len(runs) >= 3, what="several tries while the session is busy")
    await bus.redis.set(bus.keys.session_done("s"), 1)
    lease = await asyncio.wait_for(waiting, 10)
    await turn.__aexit__(None, None, None)
    assert tries == [1] and lease.carried is None  # sent with the first try only: the turn reads for itself


async def test_a_turns_first_reads_go_with_the_session_taking_and_see_what_changed_before_it(
        bus: Bus, pool, chat, monkeypatch) -> None:
    llm = FakeLLM(lambda _messages: Completion(text="ok", model="fake"))
    await pool(llm)
    assert isinstance((await chat("first", sender="owner"))[-1], ChatReply)  # the tools heard: notes offered
    await LongTermMemory(bus.redis, bus.keys).write("main", "pin", "the pin is 4321", owner="owner")
    alone: list[str] = []  # reads a turn made on their own, not with the session's taking
    listed, digest = LongTermMemory.list, ToolCatalog._read_digest

    async def spied_list(memory, *args, **kwargs):
        alone.append("notes")
        return await listed(memory, *args, **kwargs)

    async def spied_digest(catalog):
        alone.append("digest")
        return await digest(catalog)

    monkeypatch.setattr(LongTermMemory, "list", spied_list)
    monkeypatch.setattr(ToolCatalog, "_read_digest", spied_digest)
    assert isinstance((await chat("second", sender="owner"))[-1], ChatReply)
    shown = " ".join(str(m.get("content")) for m in llm.seen[-1] if m["role"] == "system")
    assert "pin: the pin is 4321" in shown  # the note written between the turns, read with the session
    assert [m["content"] for m in llm.seen[-1] if m["role"] == "user"] == ["first", "second"]
    assert alone == []
    await bus.redis.delete(bus.keys.tools_digest)  # the tools changed (a new digest): listed again, read alone
    assert isinstance((await chat("third", sender="owner"))[-1], ChatReply)
    assert alone == []
