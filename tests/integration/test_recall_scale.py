"""Memory search with 10,000 identities on a real Redis: a new worker's first search reads only the asker's
scope (not everyone's notes and conversations), finds what that identity said, and the worker's index stays
within its bound however many identities are searched."""

from __future__ import annotations

import time

import msgpack
import pytest

from bus.streams import Bus
from memory.log import note_written, said
from memory.recall import Recall

PEOPLE = 10_000
NOTES, MESSAGES = 3, 6  # each identity's: 9 chunks
pytestmark = pytest.mark.timeout(300)


async def populate(bus: Bus) -> None:
    """Every identity's notes and one session, as the stores write them (hash, transcript, sessions index, log)."""
    now = int(time.time() * 1000)
    for first in range(0, PEOPLE, 500):
        async with bus.redis.pipeline(transaction=False) as pipe:
            for n in range(first, first + 500):
                person, session = f"p{n}", f"p{n}/chat"
                for k in range(NOTES):
                    text = f"{person} keeps item {k} in drawer {n * 7 + k}"
                    pipe.hset(bus.keys.memory("main", person), f"item-{k}",
                              msgpack.packb({"content": text, "updated": now}))
                    pipe.xadd(bus.keys.memory_log, note_written("main", person, f"item-{k}", text))  # type: ignore[arg-type]
                for m in range(MESSAGES):
                    text = f"{person} says line {m}: the boat is moored at pier {n}"
                    pipe.rpush(bus.keys.transcript(session), msgpack.packb(
                        {"role": "user" if m % 2 == 0 else "assistant", "content": text, "timestamp": now + m}))
                    pipe.xadd(bus.keys.memory_log, said(session, "user", text, now + m, f"{now}-{m}"))  # type: ignore[arg-type]
                pipe.zadd(bus.keys.sessions, {session: now})
            await pipe.execute()


async def test_a_new_worker_reads_only_the_askers_scope_and_stays_within_its_bound(bus: Bus) -> None:
    await populate(bus)
    assert await bus.redis.xlen(bus.keys.memory_log) == PEOPLE * (NOTES + MESSAGES)
    recall = Recall(bus.redis, bus.keys, embeddings=False, max_chunks=1_000)
    hits = await recall.search("main", "which drawer is item 2 in", owner="p7777")
    assert hits[0]["source"] == "note" and hits[0]["excerpt"] == f"p7777 keeps item 2 in drawer {7777 * 7 + 2}"
    assert recall.held() == ["n:main/p7777", "n:main/", "c:p7777"]  # one identity's, of 10,000
    assert await recall.size() == NOTES + MESSAGES
    boats = await recall.search("main", "where is the boat moored", owner="p42")
    assert {h["session"] for h in boats} == {"chat"} and all("p42 says" in h["excerpt"] for h in boats)
    for n in range(0, PEOPLE, 50):  # 200 identities asked about in turn
        assert (await recall.search("main", "drawer", owner=f"p{n}"))[0]["excerpt"].startswith(f"p{n} keeps")
    held = recall.held()
    assert await recall.size() <= 1_000 and held[-3:] == ["n:main/p9950", "n:main/", "c:p9950"]
    assert len(held) == 1 + 2 * (1_000 // (NOTES + MESSAGES))  # the shared notes, and the latest identities'
