"""The stores on a real Redis (their log writes are Lua scripts, which the fake does not run): what they keep,
read back and refuse."""

from __future__ import annotations

import pytest

from bus.streams import Bus
from memory.longterm import SHARED, LongTermMemory, NoteRefused
from memory.sessions import SessionStore, TranscriptEntry


async def test_long_term_notes_round_trip_search_and_limits(bus: Bus) -> None:
    memory = LongTermMemory(bus.redis, bus.keys, max_chars=40, max_notes=2)
    assert await memory.write("main", "todo", "buy milk", owner="ana") == "buy milk"
    assert await memory.write("main", "todo", "call Ana", owner="ana", append=True) == "buy milk\ncall Ana"
    await memory.write("main", "trip", "Lisbon in May", owner="ana")
    assert [n["key"] for n in await memory.list("main", owner="ana")] == ["todo", "trip"]
    assert [n["key"] for n in await memory.search("main", "ana milk", owner="ana")] == ["todo"]
    with pytest.raises(NoteRefused, match="you already keep 2 notes"):
        await memory.write("main", "third", "x", owner="ana")
    with pytest.raises(NoteRefused, match="the limit is 40"):
        await memory.write("main", "todo", "y" * 41, owner="ana")
    assert await memory.read("main", "todo", owner="ana") == ("buy milk\ncall Ana", "own")  # refused: unchanged
    assert await memory.read("other", "todo", owner="ana") is None  # agents keep separate notes
    assert await memory.delete("main", "todo", owner="ana") and not await memory.delete("main", "todo", owner="ana")


async def test_notes_are_their_writers_and_shared_notes_everyones(bus: Bus) -> None:
    memory = LongTermMemory(bus.redis, bus.keys)
    await memory.write("main", "gift", "Ana wants a red scarf", owner="ben")
    await memory.write("main", "wifi", "the password is on the fridge", owner=SHARED)
    await memory.write("main", "wifi", "my hotspot is ana-phone", owner="ana")
    assert await memory.read("main", "gift", owner="ana") is None  # Ben's note is not Ana's
    assert await memory.search("main", "scarf", owner="ana") == []
    assert [(n["key"], n["scope"]) for n in await memory.search("main", "scarf", owner="ben")] == [("gift", "own")]
    assert await memory.read("main", "wifi", owner="ana") == ("my hotspot is ana-phone", "own")  # hers first
    assert await memory.read("main", "wifi", owner="ben") == ("the password is on the fridge", "shared")
    assert [(n["key"], n["scope"]) for n in await memory.list("main", owner="ana")] == [("wifi", "own")]
    assert [(n["key"], n["scope"]) for n in await memory.list("main", owner="ben")] == [("gift", "own"),
                                                                                       ("wifi", "shared")]
    assert [n["key"] for n in await memory.list("main", owner=SHARED)] == ["wifi"]


async def test_transcripts_append_load_list_and_delete(bus: Bus) -> None:
    store = SessionStore(bus.redis, bus.keys)
    await store.append("s1", TranscriptEntry(role="user", content="hi"),
                       TranscriptEntry(role="assistant", content="hello", metadata={"final": True}))
    await store.append("s2", TranscriptEntry(role="user", content="yo"))
    assert [e.content for e in await store.load("s1")] == ["hi", "hello"]
    assert await store.ownership("s1") == ("", True)  # a transcript with no owner key: operators' only
    assert await store.next_seq("s1") == 1 and await store.next_seq("s1") == 2
    assert sorted(await store.list_sessions()) == ["s1", "s2"]
    await store.delete("s1")
    assert not await store.exists("s1") and await store.list_sessions() == ["s2"]
    assert await store.ownership("s1") == (None, False)
