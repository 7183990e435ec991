"""Recall: search over an identity's notes and its past conversations, ranked by BM25.

Each Hands worker keeps an index per scope (one agent's notes for one identity, with
the agent's shared notes, and that identity's conversations) in SQLite's FTS5 (whose
``bm25()`` ranks, with the Porter stemmer), built on demand from what Redis keeps: the
notes' hashes and the identity's transcripts. Scopes not searched lately are evicted
once the worker holds more than ``max_chunks`` chunks, so its memory grows with the
people it serves at once, not with everyone the pool ever served; a new worker has
nothing to build before its first search but that one identity's scope.

Whatever should be findable (a note written or deleted, a person's message, the
agent's words in a turn) is also added to one Redis stream, ``memory:log``, in the
same round trip as the write itself (``memory/log.py``). The log is the index's feed
of changes: a worker reads it from where it started, applies each entry to the scopes
it holds and skips the rest, and a search first reads whatever arrived since, so it
sees everything written before it. The log keeps ``log_keep_s`` of changes.

Scoping is in the query: an identity finds its own notes and the agent's shared
ones, and its own conversations, never another identity's. A conversation hit
whose session was deleted or lapsed is dropped (and forgotten, from the log too) when found.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import msgpack

from bus import heap
from bus.keys import Keys
from bus.log import kv
from bus.progress import Lines, Progress, Throttle
from bus.store import RedisStore
from bus.text import text
from memory.embedding import load as load_embedder
from memory.index import Fields, Index, int_of, unit_of, units_of, wanted
from memory.log import MemoryLog, session_forgotten
from memory.log import note_deleted as note_deleted  # the log's entries, named where the index reads them
from memory.log import note_written as note_written
from memory.log import said as said
from memory.session_index import SessionIndex

log = logging.getLogger("memory.recall")
READ_BATCH = 2_000
SEARCH_BATCHES = 2  # a search indexes at most this many batches first (a tool call has seconds, not minutes)
BUILD_THROTTLE = Throttle()  # how often a long build of one scope is said in the worker's log
MAX_CHUNKS = 50_000  # chunks a worker holds (1.2 KB each, 2 KB with vectors) before evicting the least recent
LOG_KEEP_S = 86_400  # the change feed's reach: a worker that falls further behind rebuilds what it holds
# Words a question is made of that say nothing of what it asks: left out of the query (BM25 would weigh them
# little anyway, but each one makes SQLite walk a long list of every chunk that holds it).
STOP_WORDS = frozenset([
    "a", "about", "an", "and", "are", "as", "at", "be", "been", "but", "by", "can", "could", "did", "do",
    "does", "for", "from", "had", "has", "have", "how", "i", "if", "in", "into", "is", "it", "its", "me", "my",
    "of", "on", "or", "our", "please", "should", "so", "some", "than", "that", "the", "their", "them", "then",
    "there", "these", "they", "this", "to", "us", "was", "we", "were", "what", "when", "where", "which", "who",
    "why", "will", "with", "would", "you", "your",
])


def _said(line: str) -> None:
    log.info("%s", line)


def _quiet(_line: str) -> None:
    """A build too small to report (one batch)."""


def _ms(entry_id: str) -> int:
    return _id(entry_id)[0]


def _id(entry_id: str | bytes | None) -> tuple[int, int]:
    """A stream entry id, comparable."""
    ms, _, seq = (text(entry_id) if entry_id else "0-0").partition("-")
    return int_of(ms), int_of(seq)


class Recall:
    """This worker's index of the units searched lately, kept up to date from the log, and the search."""

    def __init__(self, redis: RedisStore, keys: Keys, *, embeddings: bool = True, max_chunks: int = MAX_CHUNKS,
                 log_keep_s: float = LOG_KEEP_S, on_built: Callable[[], Awaitable[None]] | None = None) -> None:
        self.redis, self.keys, self.embeddings = redis, keys, embeddings
        self.max_chunks, self.log_keep_s = max_chunks, log_keep_s
        self.log = MemoryLog(redis, keys)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recall")
        self._index: Index | None = None  # made in its own thread, where SQLite is used
        # The units loaded, least recently searched first (changed under the lock only).
        self._units: OrderedDict[str, None] = OrderedDict()
        self._last: str | None = None  # the last log entry read; None: not started (it starts at the log's end)
        self._lock = asyncio.Lock()
        self.build: Progress | None = None  # a long build of one scope, while it runs
        self._on_built = on_built

    def building(self) -> str:
        """How far the build of a large scope has come ("4,000/10,000 entries"); empty when none runs."""
        return self.build.snapshot().amount() if self.build is not None else ""

    async def catch_up(self, *, batches: int | None = None) -> int:
        """Apply the log entries written since the last one read (at most ``batches`` reads of READ_BATCH) to the
        scopes held; how many were read. A new worker starts at the log's end: what came before is in the
        notes and transcripts a scope is built from."""
        done, read = 0, 0
        while batches is None or read < batches:
            read += 1
            async with self._lock:
                if self._last is None or await self._fell_behind(self._last):
                    self._last = await self._log_end()
                    self._units.clear()  # whatever they missed: read again when searched
                    await self._run(self._reset)
                    return done
                found = await self.redis.xrange(self.keys.memory_log, min=f"({self._last}", count=READ_BATCH)
                if not found:
                    return done
                entries = [(entry_id.decode(), {k.decode(): v.decode(errors="replace") for k, v in fields.items()})
                           for entry_id, fields in found]
                stale = await self._run(lambda batch=entries: self._apply(batch))
                self._last = found[-1][0].decode()
                if stale:  # what a writer left in the log (an entry from before the log purged itself)
                    await self.redis.xdel(self.keys.memory_log, *stale)
            done += len(found)
            if len(found) < READ_BATCH:
                return done
        return done

    async def _log_end(self) -> str:
        last = await self.redis.xrevrange(self.keys.memory_log, count=1)
        return str(last[0][0].decode()) if last else "0-0"

    async def _fell_behind(self, last: str) -> bool:
        """The log was trimmed past the last entry read (a worker stopped longer than the log keeps)."""
        if not self._units or _ms(last) > time.time() * 1000 - self.log_keep_s * 500:
            return False
        try:
            info = await self.redis.xinfo_stream(self.keys.memory_log)
        except Exception:  # no log at all: nothing written, nothing missed
            return False
        first, newest = info.get("first-entry"), _id(info.get("last-generated-id"))
        return _id(first[0]) > _id(last) if first else newest > _id(last)

    def _apply(self, entries: list[tuple[str, Fields]]) -> list[str]:
        """The entries that change what is loaded, applied (in the index's thread)."""
        changes = [(entry_id, entry) for entry_id, entry in entries if wanted(entry, self._units)]
        return self._ready().apply(changes) if changes else []

    def _ready(self) -> Index:
        if self._index is None:
            embedder = load_embedder() if self.embeddings else None
            self.embeddings = embedder is not None
            self._index = Index(embedder)
        return self._index

    def _reset(self) -> None:
        self._index = None

    async def run(self, stop: asyncio.Event, *, every_s: float = 0.5, trim_every_s: float = 60.0) -> None:
        """Keep the scopes held up to date until ``stop``, and the log within ``log_keep_s`` (a failed read is
        retried at the next tick)."""
        trimmed = 0.0
        while not stop.is_set():
            try:
                if time.monotonic() - trimmed > trim_every_s:
                    await self.trim()
                    await self._run(heap.release)  # what evictions and batches freed leaves the worker's RSS
                    trimmed = time.monotonic()
                if await self.catch_up():
                    continue
            except Exception as exc:  # Redis away: searches catch up themselves when it is back
                log.warning("memory log not read %s", kv(error=exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
        self._thread.shutdown(wait=False)

    async def trim(self) -> None:
        """Drop the log's entries older than ``log_keep_s``: what they changed is in the notes and transcripts."""
        oldest = int(time.time() * 1000 - self.log_keep_s * 1000)
        await self.redis.xtrim(self.keys.memory_log, minid=oldest, approximate=False)

    async def search(self, agent_id: str, query: str, *, owner: str, limit: int = 10,
                     turn: str = "") -> list[dict[str, Any]]:
        """``owner``'s notes (with the agent's shared ones) and conversations that match ``query``, best first;
        the words of turn ``turn`` (the one searching: they are what it is reading) left out."""
        found = re.findall(r"\w+", query.lower())
        words = [w for w in dict.fromkeys(found) if w not in STOP_WORDS][:64] or found[:64]
        if not words:
            return []
        # What was written before this search is applied first, unless the feed is far behind (a burst of
        # writes): then the search answers from what is applied so far.
        if await self.catch_up(batches=SEARCH_BATCHES) >= SEARCH_BATCHES * READ_BATCH:
            log.info("memory search answered while the index catches up %s", kv(owner=owner))
        index = await self._loaded(agent_id, owner)
        match = " OR ".join(f'"{w}"' for w in words)
        rows = await self._run(lambda: index.query(match, query, agent_id=agent_id, owner=owner,
                                                   limit=limit * 2, turn=turn or "-"))
        gone = await self._lapsed({place for kind, place, *_ in rows if kind == "conversation"})
        hits: list[dict[str, Any]] = []
        for kind, place, role, at, whose, excerpt, score in rows:
            if place in gone and kind == "conversation":
                continue
            when = datetime.fromtimestamp(int(at) / 1000, UTC).isoformat(timespec="seconds")
            hit: dict[str, Any] = {"source": kind, "when": when, "score": round(float(score), 3), "excerpt": excerpt}
            if kind == "note":
                hit.update(key=place, scope="own" if whose else "shared")
            else:
                hit.update(session=place.partition("/")[2], said_by="person" if role == "user" else "agent")
            hits.append(hit)
        return hits[:limit]

    async def size(self) -> int:
        """Chunks held."""
        return self._index.chunks if self._index is not None else 0

    def held(self) -> list[str]:
        """The units loaded, least recently searched first: ``n:<agent>/<owner>`` notes (owner "": the shared
        ones), ``c:<owner>`` conversations."""
        return list(self._units)

    async def _loaded(self, agent_id: str, owner: str) -> Index:
        """The index, holding what this search reads (now the most recently used), each missing unit read from
        the notes and transcripts."""
        units = units_of(agent_id, owner)
        async with self._lock:
            missing = [unit for unit in units if unit not in self._units]
            if missing:
                await self._build(agent_id, owner, missing)
            for unit in units:
                self._units[unit] = None
                self._units.move_to_end(unit)
            index: Index = await self._run(self._ready)
            for unit in await self._run(lambda: self._evict(keep=units)):
                del self._units[unit]
        return index

    async def _build(self, agent_id: str, owner: str, missing: list[str]) -> None:
        """Read the missing units from what Redis keeps (under the lock: the feed adds nothing meanwhile, and
        what it adds later is applied on top, each version replacing the one read here). Each unit is held
        from here on, so the feed keeps it up."""
        notes: list[tuple[str, Fields]] = []
        for unit in missing:
            if unit.startswith("n:"):
                notes += await self._notes(agent_id, unit.partition("/")[2])
        sessions = await self._sessions(owner) if unit_of("conversation", "", owner) in missing else []
        for unit in missing:
            self._units[unit] = None
        index: Index = await self._run(self._ready)
        total = len(notes) + sum(length for _, length in sessions)
        self.build = Progress(f"indexing the memory of {owner or 'the shared notes'}", total,
                              Lines(_said if total > READ_BATCH else _quiet), noun="entries", throttle=BUILD_THROTTLE)
        try:
            if total > READ_BATCH:
                self.build.update(0)
            if notes:
                await self._run(lambda: index.apply(notes))
                self.build.update(len(notes))
            for session_id, length in sessions:
                for start in range(0, length, READ_BATCH):
                    raw = await self.redis.lrange(self.keys.transcript(session_id), start, start + READ_BATCH - 1)
                    said_here = _transcript_entries(session_id, raw)
                    await self._run(lambda batch=said_here: index.apply(batch))
                    self.build.update(self.build.done + len(raw))
            self.build.finish()
        finally:
            reported, self.build = total > READ_BATCH, None
        if reported and self._on_built is not None:
            try:
                await self._on_built()
            except Exception as exc:  # a heartbeat that failed: the next one says it
                log.info("memory scope built; not told at once %s", kv(error=exc))

    def _evict(self, *, keep: list[str]) -> list[str]:
        """The units searched longest ago leave while more than ``max_chunks`` are held; which (in the thread)."""
        index, gone = self._ready(), []
        for unit in list(self._units):
            if index.chunks <= self.max_chunks:
                break
            if unit not in keep:
                index.evict(unit)
                gone.append(unit)
        return gone

    async def _notes(self, agent_id: str, whose: str) -> list[tuple[str, Fields]]:
        """The agent's notes of ``whose`` ("": its shared ones), as log entries."""
        entries: list[tuple[str, Fields]] = []
        for key, raw in (await self.redis.hgetall(self.keys.memory(agent_id, whose))).items():
            note = _unpacked(raw)
            if isinstance(note.get("content"), str):
                fields = note_written(agent_id, whose, key.decode(errors="replace"), note["content"])
                entries.append(("", {**fields, "at": str(int_of(str(note.get("updated") or 0)))}))
        return entries

    async def _sessions(self, owner: str) -> list[tuple[str, int]]:
        """``owner``'s sessions and their transcripts' lengths."""
        if not owner:
            return []
        found = await SessionIndex(self.redis, self.keys).newest(owner)
        async with self.redis.pipeline(transaction=False) as pipe:
            for session_id in found:
                pipe.llen(self.keys.transcript(session_id))
                pipe.exists(self.keys.memory_log_session(session_id))
            read = await pipe.execute()
        lengths, logged = read[::2], read[1::2]
        lapsed = [s for s, n, words in zip(found, lengths, logged, strict=True) if not n and words]
        if lapsed:  # their transcripts are gone: so are their words from the log
            await self.log.forget(*lapsed)
        return [(s, int(n)) for s, n in zip(found, lengths, strict=True) if n]

    async def _lapsed(self, sessions: set[str]) -> set[str]:
        """The sessions among ``sessions`` whose transcript is gone; forgotten from the index."""
        if not sessions:
            return set()
        ordered = sorted(sessions)
        async with self.redis.pipeline(transaction=False) as pipe:
            for session_id in ordered:
                pipe.exists(self.keys.transcript(session_id))
            exists = await pipe.execute()
        gone = {s for s, there in zip(ordered, exists, strict=True) if not there}
        if gone:
            async with self._lock:
                stale = await self._run(lambda: self._apply([("", session_forgotten(s)) for s in sorted(gone)]))
            await self.log.forget(*sorted(gone))  # the lapsed session's words leave the log, and every index
            if stale:
                await self.redis.xdel(self.keys.memory_log, *stale)
        return gone

    async def _run(self, work: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, work)


def _unpacked(raw: bytes) -> dict[str, Any]:
    """A note as stored (msgpack), or nothing for what anyone with Redis wrote otherwise."""
    try:
        value = msgpack.unpackb(raw, raw=False)
    except Exception:  # malformed: never stops a build
        return {}
    return value if isinstance(value, dict) else {}


def _transcript_entries(session_id: str, raw: list[bytes]) -> list[tuple[str, Fields]]:
    """What of a transcript's entries memory search finds, as log entries."""
    entries: list[tuple[str, Fields]] = []
    for n, item in enumerate(raw):
        entry = _unpacked(item)
        content, at = entry.get("content"), int_of(str(entry.get("timestamp") or 0))
        metadata = entry.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        fields = said(session_id, str(entry.get("role") or ""), content if isinstance(content, str) else None, at,
                      f"{at}-{n}", str(metadata.get("message_id") or ""))
        if fields is not None:
            entries.append(("", fields))
    return entries
