"""Long-term memory: an agent's named notes, shared by every worker through Redis."""

from __future__ import annotations

from typing import Any

import msgpack

from bus.errors import PincerError
from bus.keys import Keys
from bus.protocol import now_ms
from bus.store import RedisStore

Notes = list[dict[str, Any]]  # the method named list would shadow the builtin in annotations


class NoteRefused(PincerError, ValueError):
    """The note would pass a limit; nothing was stored. The message says which."""


class LongTermMemory:
    def __init__(self, redis: RedisStore, keys: Keys, *, max_chars: int = 100_000, max_notes: int = 1_000) -> None:
        self.redis, self.keys = redis, keys
        self.max_chars, self.max_notes = max_chars, max_notes

    async def write(self, agent_id: str, key: str, content: str, *, append: bool = False) -> str:
        """Store a note (or add to it); returns the note's full content. Limits are checked before
        anything is stored: a refused write leaves the note as it was."""
        existing = await self.read(agent_id, key)
        if append and existing:
            content = f"{existing}\n{content}"
        if len(content) > self.max_chars:
            raise NoteRefused(f"note {key!r} would be {len(content):,} characters; the limit is {self.max_chars:,}")
        if existing is None and await self.redis.hlen(self.keys.memory(agent_id)) >= self.max_notes:
            raise NoteRefused(f"the agent already keeps {self.max_notes:,} notes; update or replace one")
        note = msgpack.packb({"content": content, "updated": now_ms()}, use_bin_type=True)
        await self.redis.hset(self.keys.memory(agent_id), key, note)
        return content

    async def read(self, agent_id: str, key: str) -> str | None:
        raw = await self.redis.hget(self.keys.memory(agent_id), key)
        return None if raw is None else msgpack.unpackb(raw, raw=False)["content"]

    async def list(self, agent_id: str) -> Notes:
        notes = await self.redis.hgetall(self.keys.memory(agent_id))
        listed = []
        for key, raw in sorted(notes.items()):
            note = msgpack.unpackb(raw, raw=False)
            first_line = note["content"].strip().split("\n", 1)[0]
            preview = first_line[:120] + ("…" if len(first_line) > 120 or "\n" in note["content"].strip() else "")
            listed.append({"key": key.decode(), "chars": len(note["content"]), "updated": note["updated"],
                           "preview": preview})
        return listed

    async def search(self, agent_id: str, query: str, *, limit: int = 10) -> Notes:
        """Notes whose key or text contains every word of the query (case-insensitive), best first."""
        words = [w.lower() for w in query.split() if w]
        found = []
        for key, raw in (await self.redis.hgetall(self.keys.memory(agent_id))).items():
            content = msgpack.unpackb(raw, raw=False)["content"]
            haystack = f"{key.decode()} {content}".lower()
            if all(w in haystack for w in words):
                score = sum(haystack.count(w) for w in words)
                found.append({"key": key.decode(), "score": score, "excerpt": content[:300]})
        return sorted(found, key=lambda n: (-n["score"], n["key"]))[:limit]

    async def delete(self, agent_id: str, key: str) -> bool:
        return bool(await self.redis.hdel(self.keys.memory(agent_id), key))
