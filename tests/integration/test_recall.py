"""Memory search on a real Redis: an identity finds its notes, the shared notes and its earlier conversations,
ranked by BM25, each hit saying where and when; never another identity's; deleted or lapsed things are gone;
a worker started later builds its index from the log."""

from __future__ import annotations

import asyncio

import pytest

from bus.streams import Bus
from memory.embedding import load as load_embedder
from memory.longterm import SHARED, LongTermMemory
from memory.recall import Recall
from memory.sessions import SessionStore, TranscriptEntry
from tests.conftest import async_wait_until


async def said(bus: Bus, session_id: str, *lines: tuple[str, str]) -> None:
    await SessionStore(bus.redis, bus.keys).append(session_id, *(TranscriptEntry(role=role, content=text)  # type: ignore[arg-type]
                                                                  for role, text in lines))


@pytest.mark.parametrize("embeddings", [False, True], ids=["bm25", "hybrid"])
async def test_an_earlier_conversation_is_found_from_a_later_one_by_its_identity_only(bus: Bus,
                                                                                     embeddings: bool) -> None:
    recall = Recall(bus.redis, bus.keys, embeddings=embeddings)
    await said(bus, "ana/monday", ("user", "My locker at the gym is number 4312, please remember it."),
               ("assistant", "Noted: locker 4312."))
    await said(bus, "ana/tuesday", ("user", "What should I cook tonight?"), ("assistant", "Try a lentil soup."))
    await said(bus, "ben/monday", ("user", "My locker is 77 at the gym."))
    hits = await recall.search("main", "which gym locker was mine", owner="ana")
    assert [(h["source"], h["session"]) for h in hits][:2] == [("conversation", "monday")] * 2
    assert "4312" in hits[0]["excerpt"] and hits[0]["when"].startswith("20")
    assert {h["said_by"] for h in hits[:2]} == {"person", "agent"}
    assert all("77" not in h["excerpt"] for h in hits)  # Ben's words are not Ana's to find
    assert [h["session"] for h in await recall.search("main", "locker", owner="ben")] == ["monday"]
    assert await recall.search("main", "locker", owner="carol") == []


async def test_the_embedding_model_finds_what_shares_no_word_with_the_question(bus: Bus) -> None:
    assert load_embedder() is not None, "the test extra installs wordllama (pincer[memory])"
    facts = {"teeth": "My dentist is Dr. Moreau on Hill Street.", "bike": "My bike is locked in the shed.",
             "soup": "Lentil soup with cumin was a hit at dinner."}
    for name, fact in facts.items():
        await said(bus, f"ana/{name}", ("user", fact))
    questions = {"teeth": "who fixes my teeth?", "bike": "where did I park my bicycle?"}
    lexical, hybrid = Recall(bus.redis, bus.keys, embeddings=False), Recall(bus.redis, bus.keys)
    for name, question in questions.items():
        assert not any(h["session"] == name for h in await lexical.search("main", question, owner="ana"))
        found = await hybrid.search("main", question, owner="ana", limit=1)
        assert found[0]["session"] == name, (question, found)
    assert await hybrid.search("main", "who fixes my teeth?", owner="ben") == []  # still only Ana's


async def test_notes_rank_with_conversations_and_shared_notes_reach_everyone(bus: Bus) -> None:
    recall = Recall(bus.redis, bus.keys, embeddings=False)  # BM25's order, exactly
    memory = LongTermMemory(bus.redis, bus.keys, recall=recall)
    await memory.write("main", "allergies", "Ana is allergic to peanuts and shellfish.", owner="ana")
    await memory.write("main", "house-rules", "No peanuts in the house: a guest is allergic.", owner=SHARED)
    await memory.write("other-agent", "peanuts", "Not this agent's note.", owner="ana")
    await said(bus, "ana/dinner", ("user", "Plan a dinner without peanuts please."))
    hits = await memory.search("main", "peanuts allergic", owner="ana")
    assert [(h["source"], h.get("key") or h.get("session")) for h in hits] == [
        ("note", "allergies"), ("note", "house-rules"), ("conversation", "dinner")]
    assert [h["scope"] for h in hits if h["source"] == "note"] == ["own", "shared"]
    ben = await memory.search("main", "peanuts", owner="ben")
    assert [(h["source"], h["key"], h["scope"]) for h in ben] == [("note", "house-rules", "shared")]


async def test_what_was_changed_deleted_or_lapsed_is_not_found(bus: Bus) -> None:
    recall = Recall(bus.redis, bus.keys)
    memory = LongTermMemory(bus.redis, bus.keys, recall=recall)
    sessions = SessionStore(bus.redis, bus.keys)
    await memory.write("main", "car", "The car is a blue Volvo.", owner="ana")
    await memory.write("main", "car", "The car is a red Fiat now.", owner="ana")
    assert [h["excerpt"] for h in await memory.search("main", "car", owner="ana")] == ["The car is a red Fiat now."]
    assert not any("Volvo" in h["excerpt"] for h in await memory.search("main", "blue volvo", owner="ana"))
    await memory.delete("main", "car", owner="ana")
    assert not any("Fiat" in h["excerpt"] for h in await memory.search("main", "red fiat car", owner="ana"))
    await said(bus, "ana/secret", ("user", "The safe's combination is zebra-9."))
    await said(bus, "ana/fleeting", ("user", "The zebra crossing by the school is closed."))
    assert len([h for h in await recall.search("main", "zebra", owner="ana") if "zebra" in h["excerpt"]]) == 2
    await sessions.delete("ana/secret")
    await bus.redis.delete(bus.keys.transcript("ana/fleeting"))  # as when an unnamed session lapses
    assert not any("zebra" in h["excerpt"] for h in await recall.search("main", "zebra crossing", owner="ana"))


async def test_a_worker_started_later_indexes_only_whom_it_is_asked_about_and_keeps_it_up(bus: Bus) -> None:
    memory = LongTermMemory(bus.redis, bus.keys)  # a writer without an index, as the Brain and Gateway are
    await bus.redis.xadd(bus.keys.memory_log, {"op": "put", "kind": "conversation", "at": "not a number",
                                               "text": "a malformed entry", "owner": "ana", "place": "ana/x"})
    await bus.redis.xadd(bus.keys.memory_log, {"nonsense": "entirely"})
    await bus.redis.hset(bus.keys.memory("main", "ana"), "garbage", b"\xc1 not msgpack")  # anyone with Redis
    for n in range(30):
        await memory.write("main", f"note-{n}", f"fact number {n} about the garden", owner="ana")
        await memory.write("main", f"note-{n}", f"ben's fact {n} about the garden", owner="ben")
    await said(bus, "ana/earlier", ("user", "The garden gate squeaks."), ("assistant", "Oil it."))
    late = Recall(bus.redis, bus.keys, embeddings=False)
    stop = asyncio.Event()
    running = asyncio.create_task(late.run(stop, every_s=0.05))
    try:
        hits = await late.search("main", "garden gate", owner="ana", limit=40)
        assert hits[0]["source"] == "conversation" and hits[0]["session"] == "earlier"
        assert len([h for h in hits if h["source"] == "note"]) == 30 and not any("ben" in h["excerpt"] for h in hits)
        assert late.held() == ["n:main/ana", "n:main/", "c:ana"]  # Ben's not read
        assert await late.size() == 32  # Ana's 30 notes and 2 messages
        await said(bus, "ana/plans", ("user", "Plant tulips in the garden in October."))
        await async_wait_until(lambda: _indexed(late, 33), timeout=20, what="a new message indexed as it is written")
        hits = await late.search("main", "tulips garden", owner="ana")
        assert hits[0]["source"] == "conversation" and hits[0]["session"] == "plans"
        assert await late.size() == 33  # read from the feed and by the search: indexed once
    finally:
        stop.set()
        await running


async def test_the_least_recently_searched_scopes_leave_past_the_bound_and_come_back_whole(bus: Bus) -> None:
    memory = LongTermMemory(bus.redis, bus.keys)
    for person in ("ana", "ben", "carol"):
        for n in range(400):
            await memory.write("main", f"n{n}", f"{person} keeps fact {n} about boats", owner=person)
    recall = Recall(bus.redis, bus.keys, embeddings=False, max_chunks=1_000)
    for person in ("ana", "ben", "carol"):
        assert len(await recall.search("main", "boats", owner=person, limit=500)) == 400
    assert "n:main/ana" not in recall.held() and await recall.size() == 800  # Ana's, searched longest ago, left
    await memory.write("main", "n0", "ana now keeps a canoe", owner="ana")  # while her scope is away
    hits = await recall.search("main", "canoe boats", owner="ana", limit=500)
    assert hits[0]["excerpt"] == "ana now keeps a canoe" and len(hits) == 400
    assert "n:main/ben" not in recall.held() and await recall.size() == 800  # back, and Ben's went instead


async def test_a_feed_trimmed_past_a_stopped_worker_makes_it_read_its_scopes_again(bus: Bus) -> None:
    memory = LongTermMemory(bus.redis, bus.keys)
    await memory.write("main", "pet", "The dog is called Rex.", owner="ana")
    recall = Recall(bus.redis, bus.keys, embeddings=False, log_keep_s=600)
    assert len(await recall.search("main", "dog", owner="ana")) == 1
    recall._last = "1-0"  # as if stopped long before the log's oldest entry: what changed meanwhile is lost
    await memory.write("main", "pet", "The cat is called Tom.", owner="ana")
    await bus.redis.xtrim(bus.keys.memory_log, maxlen=0)  # the change trimmed away unread
    hits = await recall.search("main", "cat dog", owner="ana")
    assert [h["excerpt"] for h in hits] == ["The cat is called Tom."]


async def test_the_log_keeps_log_keep_s_of_changes(bus: Bus) -> None:
    await bus.redis.xadd(bus.keys.memory_log, {"op": "drop", "ref": "note:main/ana/old"}, id="1000-0")  # 1970
    await LongTermMemory(bus.redis, bus.keys).write("main", "new", "kept", owner="ana")
    await Recall(bus.redis, bus.keys, embeddings=False, log_keep_s=600).trim()
    assert [f[b"ref"] for _, f in await bus.redis.xrange(bus.keys.memory_log)] == [b"note:main/ana/new"]


async def _indexed(recall: Recall, n: int) -> bool:
    return await recall.size() >= n
