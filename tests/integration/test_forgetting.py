"""What is deleted is gone, on a real Redis: a note overwritten or deleted and a session deleted (or lapsed)
leave no copy in ``memory:log``; a worker already running forgets them, and a worker started later never
indexes them (its search does not find them). Entries from before the log purged itself leave it by age.""" 

from __future__ import annotations

import asyncio
import time

from bus.streams import Bus
from memory.log import note_written, said
from memory.longterm import SHARED, LongTermMemory
from memory.recall import Recall
from memory.sessions import SessionStore, TranscriptEntry
from tests.conftest import async_wait_until

PIN = "my bank pin is 4321"


async def log_text(bus: Bus) -> str:
    """Everything the memory log holds, as one string."""
    return " ".join(v.decode() for _, fields in await bus.redis.xrange(bus.keys.memory_log) for v in fields.values())


async def found(recall: Recall, query: str, owner: str = "ana") -> list[str]:
    return [h["excerpt"] for h in await recall.search("main", query, owner=owner)]


async def test_an_overwritten_then_deleted_note_leaves_no_copy_in_the_log_or_any_index(bus: Bus) -> None:
    running = Recall(bus.redis, bus.keys, embeddings=False)
    memory = LongTermMemory(bus.redis, bus.keys, recall=running)
    for owner in ("ana", SHARED):  # an identity's own notes and the agent's shared ones alike
        await memory.write("main", "bank", PIN, owner=owner)
        assert any("4321" in e for e in await found(running, "bank pin 4321"))  # indexed by the running worker
        await memory.write("main", "bank", "I changed banks; the card is new", owner=owner)
        assert "pin is 4321" not in await log_text(bus)  # the old version left the log as the new one came
        assert not any("4321" in e for e in await found(running, "bank pin 4321"))
        assert not any("4321" in e for e in await found(Recall(bus.redis, bus.keys, embeddings=False), "pin 4321"))
        await memory.write("main", "bank", "append: the new card's code is 8765", owner=owner, append=True)
        assert (await log_text(bus)).count("I changed banks") == 1  # one copy of a note: its latest
        assert await memory.delete("main", "bank", owner=owner)
        assert "changed banks" not in await log_text(bus) and "code is 8765" not in await log_text(bus)
        assert not any("8765" in e or "banks" in e for e in await found(running, "changed banks card code 8765"))
        fresh = Recall(bus.redis, bus.keys, embeddings=False)  # a worker started after: builds from the log
        assert await found(fresh, "bank pin 4321 changed banks card code 8765") == []
    assert not await bus.redis.exists(bus.keys.memory_log_notes)  # nothing kept for a note that is gone


async def test_a_deleted_session_leaves_nothing_in_the_log_or_any_index(bus: Bus) -> None:
    sessions = SessionStore(bus.redis, bus.keys)
    running = Recall(bus.redis, bus.keys, embeddings=False)
    await sessions.append("ana/monday", TranscriptEntry(role="user", content=f"Remember: {PIN}."),
                          TranscriptEntry(role="assistant", content="Noted, your pin is 4321."))
    await sessions.append("ana/tuesday", TranscriptEntry(role="user", content="The pin of the gym locker is 9911."))
    assert len(await found(running, "pin 4321")) >= 2
    await sessions.delete("ana/monday")
    text = await log_text(bus)  # the log's words (its entry ids and timestamps hold digits of their own)
    assert "pin is 4321" not in text and "locker is 9911" in text  # only that session's words go
    assert not any("4321" in e for e in await found(running, "pin 4321"))
    assert not any("4321" in e for e in await found(Recall(bus.redis, bus.keys, embeddings=False), "pin 4321"))
    assert not await bus.redis.exists(bus.keys.memory_log_session("ana/monday"))
    assert any("9911" in e for e in await found(Recall(bus.redis, bus.keys, embeddings=False), "locker pin"))


async def test_a_lapsed_session_found_by_a_search_leaves_the_log_too(bus: Bus) -> None:
    sessions = SessionStore(bus.redis, bus.keys)
    await sessions.append("ana/old", TranscriptEntry(role="user", content=f"Remember: {PIN}."))
    await bus.redis.delete(bus.keys.transcript("ana/old"))  # as its TTL would
    assert await found(Recall(bus.redis, bus.keys, embeddings=False), "pin 4321") == []
    assert "pin is 4321" not in await log_text(bus)


async def test_copies_an_older_release_left_in_the_log_leave_it_by_age(bus: Bus) -> None:
    # As an older Pincer wrote them: plain XADDs, no record of which entry is a note's live one (given a day's
    # age by their ids: a log cannot take entries older than its newest, so they are written first).
    day_ago = int(time.time() * 1000) - 86_400_000
    for n, version in enumerate((PIN, "the pin changed to 5555")):
        await bus.redis.xadd(bus.keys.memory_log, note_written("main", "ana", "bank", version),  # type: ignore[arg-type]
                             id=f"{day_ago}-{n}")
    await bus.redis.xadd(bus.keys.memory_log, said("ana/x", "user", "old words: 7777", 1, "1-0"),  # type: ignore[arg-type]
                         id=f"{day_ago}-2")
    await LongTermMemory(bus.redis, bus.keys).write("main", "bank", "the pin changed to 5555", owner="ana")
    worker = Recall(bus.redis, bus.keys, embeddings=False, log_keep_s=3_600)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop, every_s=0.05))
    try:
        async def purged() -> bool:
            text = await log_text(bus)
            return "pin is 4321" not in text and "words: 7777" not in text
        await async_wait_until(purged, timeout=10, what="the old copies gone from the log")
        assert "changed to 5555" in await log_text(bus)  # the note's latest version stays
    finally:
        stop.set()
        await running


async def test_a_session_spoken_in_for_months_keeps_only_the_ids_the_log_still_holds(bus: Bus) -> None:
    sessions = SessionStore(bus.redis, bus.keys)
    for n in range(40):
        await sessions.append("ana/daily", TranscriptEntry(role="user", content=f"day {n}: water the plants"))
    ids = [i.decode() for i in await bus.redis.lrange(bus.keys.memory_log_session("ana/daily"), 0, -1)]
    assert len(ids) == 40
    await bus.redis.xtrim(bus.keys.memory_log, minid=ids[30], approximate=False)  # days on: the log trimmed
    for n in range(40, 64):  # the 64th entry looks for ids the log no longer holds (every 32nd does)
        await sessions.append("ana/daily", TranscriptEntry(role="user", content=f"day {n}: water the plants"))
    kept = [i.decode() for i in await bus.redis.lrange(bus.keys.memory_log_session("ana/daily"), 0, -1)]
    assert kept[:10] == ids[30:] and len(kept) == 64 - 30
    await sessions.delete("ana/daily")  # and deleting it still takes every word it has left
    assert "water the plants" not in await log_text(bus)
