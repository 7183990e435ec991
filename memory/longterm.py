"""Long-term memory: named notes, shared by every worker through Redis.

Notes belong to the identity that wrote them (``owner``: a token's name, a
chat user's ``telegram:123``), one set per agent; each agent also has shared
notes (owner ``SHARED``), which owners of the pool write and every identity
reads. A read, list or search sees the caller's own notes and the shared
ones, its own first; nobody sees another identity's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import msgpack

from bus.carry import Carried
from bus.codec import pack
from bus.errors import PincerError
from bus.keys import Keys
from bus.protocol import now_ms
from bus.store import RedisStore
from memory.log import MemoryLog

if TYPE_CHECKING:  # only named: the Brain keeps notes and searches none (Hands' memory tools hold the index)
    from memory.recall import Recall

Notes = list[dict[str, Any]]  # the method named list would shadow the builtin in annotations
Scope = Literal["own", "shared"]
Places = list[tuple[Scope, str]]
SHARED = ""  # the owner of an agent's shared notes


class NoteRefused(PincerError, ValueError):
    """The note would pass a limit; nothing was stored. The message says which."""


class LongTermMemory:
    def __init__(self, redis: RedisStore, keys: Keys, *, max_chars: int = 100_000, max_notes: int = 1_000,
                 recall: Recall | None = None) -> None:
        self.redis, self.keys, self.recall = redis, keys, recall
        self.log = MemoryLog(redis, keys)
        self.max_chars, self.max_notes = max_chars, max_notes

    async def write(self, agent_id: str, key: str, content: str, *, owner: str, append: bool = False) -> str:
        """Store a note of ``owner``'s (``SHARED``: the agent's shared notes), or add to it; returns its full
        content. Limits are checked before anything is stored: a refused write leaves the note as it was."""
        where = self.keys.memory(agent_id, owner)
        raw = await self.redis.hget(where, key)
        existing = None if raw is None else _content(raw)
        if append and existing:
            content = f"{existing}\n{content}"
        if len(content) > self.max_chars:
            raise NoteRefused(f"note {key!r} would be {len(content):,} characters; the limit is {self.max_chars:,}")
        if existing is None and await self.redis.hlen(where) >= self.max_notes:
            whose = "the shared notes hold" if owner == SHARED else "you already keep"
            raise NoteRefused(f"{whose} {self.max_notes:,} notes; update or replace one")
        note = pack({"content": content, "updated": now_ms()})
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(where, key, note)
            self.log.note_written(pipe, agent_id, owner, key, content)  # its earlier version leaves the log
            await pipe.execute()
        return content

    async def read(self, agent_id: str, key: str, *, owner: str) -> tuple[str, Scope] | None:
        """The note ``owner`` means by ``key`` (its own, else the shared one of that name) and whose it is."""
        for scope, where in self._scopes(agent_id, owner):
            raw = await self.redis.hget(where, key)
            if raw is not None:
                return _content(raw), scope
        return None

    async def list(self, agent_id: str, *, owner: str, holding: str = "") -> Notes:
        """``owner``'s notes and the shared ones (a shared note named like one of its own is hidden by it);
        ``holding``: only those whose name or text holds it, ignoring case."""
        listing = self.listing(agent_id, owner=owner, holding=holding)
        async with self.redis.pipeline(transaction=False) as pipe:
            listing.build(pipe)
            held = await pipe.execute()  # both scopes in one round trip: every turn lists them
        return listing.read(held)

    def listing(self, agent_id: str, *, owner: str, holding: str = "") -> Carried[Notes]:
        """``list``'s read as pipeline commands, for a caller that sends them with its own (a turn's first
        reads, with the session's taking)."""
        scopes = self._scopes(agent_id, owner)

        def build(pipe: Any) -> None:
            for _, where in scopes:
                pipe.hgetall(where)

        return Carried(build, len(scopes), lambda held: _listed(scopes, held, holding.lower()))


    async def search(self, agent_id: str, query: str, *, owner: str, limit: int = 10, turn: str = "") -> Notes:
        """What matches ``query`` among ``owner``'s notes and the shared ones, and (with a recall index) its past
        conversations, best first. Without an index: the notes whose key or text holds every word."""
        if self.recall is not None:
            return await self.recall.search(agent_id, query, owner=owner, limit=limit, turn=turn)
        words = [w.lower() for w in query.split() if w]
        found = []
        seen: set[str] = set()
        for scope, where in self._scopes(agent_id, owner):
            for raw_key, raw in (await self.redis.hgetall(where)).items():
                key = raw_key.decode()
                if key in seen:
                    continue
                seen.add(key)
                content = _content(raw)
                haystack = f"{key} {content}".lower()
                if all(w in haystack for w in words):
                    score = sum(haystack.count(w) for w in words)
                    found.append({"source": "note", "key": key, "scope": scope, "score": score,
                                  "excerpt": content[:300]})
        return sorted(found, key=lambda n: (-n["score"], n["key"]))[:limit]

    async def delete(self, agent_id: str, key: str, *, owner: str) -> bool:
        """Delete ``owner``'s note (``SHARED``: the shared one) and every copy of it in the memory log; whether
        there was one."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hdel(self.keys.memory(agent_id, owner), key)
            self.log.note_deleted(pipe, agent_id, owner, key)
            deleted, _ = await pipe.execute()
        return bool(deleted)

    def _scopes(self, agent_id: str, owner: str) -> Places:
        own: Places = [] if owner == SHARED else [("own", self.keys.memory(agent_id, owner))]
        return [*own, ("shared", self.keys.memory(agent_id))]


def _content(raw: bytes) -> str:
    content: str = msgpack.unpackb(raw, raw=False)["content"]
    return content


def _listed(scopes: Places, held: list[dict[bytes, bytes]], holding: str) -> Notes:
    listed: Notes = []
    seen: set[str] = set()
    for (scope, _), notes in zip(scopes, held, strict=True):
        for raw_key, raw in sorted(notes.items()):
            key = raw_key.decode()
            if key in seen:
                continue
            seen.add(key)
            note = msgpack.unpackb(raw, raw=False)
            if holding and holding not in key.lower() and holding not in note["content"].lower():
                continue
            first_line = note["content"].strip().split("\n", 1)[0]
            preview = first_line[:120] + ("…" if len(first_line) > 120 or "\n" in note["content"].strip()
                                          else "")
            listed.append({"key": key, "scope": scope, "chars": len(note["content"]), "updated": note["updated"],
                           "preview": preview})
    return listed
