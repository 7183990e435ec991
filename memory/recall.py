"""Recall: search over an identity's notes and its past conversations, ranked by BM25.

Whatever should be findable (a note written or deleted, a person's message, the
agent's words in a turn) is also added to one Redis stream, ``memory:log``, in
the same round trip as the write itself (``memory/log.py``, which also removes
the copies a new version or a deletion makes stale). Each Hands worker keeps a local index
of that stream in SQLite's FTS5 (whose ``bm25()`` ranks, with the Porter
stemmer): a background task adds entries as they are written, and a search
first reads whatever arrived since, so it sees everything written before it.
The index lives in memory; a new worker builds it from the stream.

Scoping is in the query: an identity finds its own notes and the agent's shared
ones, and its own conversations, never another identity's. A conversation hit
whose session was deleted or lapsed is dropped (and forgotten, from the log too) when found.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sqlite3
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from bus.keys import Keys
from bus.log import kv
from bus.progress import Lines, Progress, Throttle
from bus.store import RedisStore
from memory.embedding import DenseIndex
from memory.embedding import load as load_embedder
from memory.log import MemoryLog, session_forgotten
from memory.log import note_deleted as note_deleted  # the log's entries, named where the index reads them
from memory.log import note_written as note_written
from memory.log import said as said

log = logging.getLogger("memory.recall")
CHUNK_CHARS = 1_000  # a long message is indexed in pieces of about this size
READ_BATCH = 2_000
SEARCH_BATCHES = 2  # a search indexes at most this many batches first (a tool call has seconds, not minutes)
BUILD_THROTTLE = Throttle()  # how often the first build from the log is said in the worker's log
RRF_K = 60  # reciprocal rank fusion's constant: how little a rank's position counts against being found at all
# Words a question is made of that say nothing of what it asks: left out of the query (BM25 would weigh them
# little anyway, but each one makes SQLite walk a long list of every chunk that holds it).
STOP_WORDS = frozenset([
    "a", "about", "an", "and", "are", "as", "at", "be", "been", "but", "by", "can", "could", "did", "do",
    "does", "for", "from", "had", "has", "have", "how", "i", "if", "in", "into", "is", "it", "its", "me", "my",
    "of", "on", "or", "our", "please", "should", "so", "some", "than", "that", "the", "their", "them", "then",
    "there", "these", "they", "this", "to", "us", "was", "we", "were", "what", "when", "where", "which", "who",
    "why", "will", "with", "would", "you", "your",
])
Fields = dict[str, str]

SCHEMA = """
CREATE VIRTUAL TABLE chunks USING fts5(text, kind UNINDEXED, owner UNINDEXED, agent UNINDEXED,
                                       place UNINDEXED, role UNINDEXED, at UNINDEXED, ref UNINDEXED,
                                       turn UNINDEXED, tokenize = 'porter unicode61');
CREATE TABLE refs (ref TEXT NOT NULL, row INTEGER NOT NULL, entry TEXT NOT NULL DEFAULT '');
CREATE INDEX refs_by_ref ON refs (ref);
"""
QUERY = """
SELECT rowid, kind, place, role, at, owner, snippet(chunks, 0, '', '', ' … ', 24), -bm25(chunks) FROM chunks
WHERE chunks MATCH ? AND ((kind = 'note' AND agent = ? AND (owner = ? OR owner = ''))
                          OR (kind = 'conversation' AND owner = ? AND ? != '' AND turn != ?))
ORDER BY bm25(chunks) LIMIT ?
"""


def _said(line: str) -> None:
    log.info("%s", line)


def _quiet(_line: str) -> None:
    """A build too small to report (one batch)."""


def _int(value: str | None) -> int:
    """A number from the log, which anyone with Redis may write: a malformed one reads as 0, never stops indexing."""
    try:
        return int(value or 0)
    except ValueError:
        return 0


def _scope(kind: str, agent: str, owner: str) -> str:
    """Which vectors a chunk is among: an identity's conversations, or one agent's notes of one owner."""
    return f"c:{owner}" if kind == "conversation" else f"n:{agent}/{owner}"


class _Index:
    """The FTS5 index, and the chunks' vectors when the embedding model is installed; used from one thread
    only (SQLite's connection is not shared)."""

    def __init__(self, embeddings: bool) -> None:
        self.db = sqlite3.connect(":memory:")
        self.db.executescript(SCHEMA)
        embedder = load_embedder() if embeddings else None
        self.dense = DenseIndex(embedder) if embedder is not None else None
        self._new: list[tuple[int, str, str, str]] = []  # chunks added in this batch, for their vectors
        self._rows = 0

    def apply(self, entries: Iterable[tuple[str, Fields]]) -> list[str]:
        """Index ``(entry id, fields)`` in order; the ids of the log entries they made stale (an earlier version
        of a note, a forgotten session's words), for the log to lose too."""
        db = self.db
        self._new = []
        stale: list[str] = []
        with db:
            for entry_id, entry in entries:
                op = entry.get("op")
                if op in ("put", "drop"):
                    stale += self._drop(entry.get("ref", ""))
                if op == "put":
                    text = entry.get("text", "")
                    for start in range(0, max(len(text), 1), CHUNK_CHARS):
                        self._rows += 1  # ids never reused (SQLite would reuse a deleted last one): vectors key on them
                        cursor = db.execute(
                            "INSERT INTO chunks (rowid, text, kind, owner, agent, place, role, at, ref, turn) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (self._rows, text[start:start + CHUNK_CHARS], entry.get("kind", ""), entry.get("owner", ""),
                             entry.get("agent", ""), entry.get("place", ""), entry.get("role", ""),
                             _int(entry.get("at")), entry.get("ref", ""), entry.get("turn", "")))
                        db.execute("INSERT INTO refs (ref, row, entry) VALUES (?, ?, ?)",
                                   (entry.get("ref", ""), cursor.lastrowid, entry_id))
                        self._new.append((int(cursor.lastrowid or 0), _scope(entry.get("kind", ""),
                                          entry.get("agent", ""), entry.get("owner", "")), entry.get("turn", ""),
                                          text[start:start + CHUNK_CHARS]))
                elif op == "forget":
                    place = entry.get("place", "")
                    gone = [r for (r,) in db.execute("SELECT rowid FROM chunks WHERE place = ? AND "
                                                     "kind = 'conversation'", (place,))]
                    stale += self._entries(gone)
                    db.executemany("DELETE FROM refs WHERE row = ?", [(r,) for r in gone])
                    db.executemany("DELETE FROM chunks WHERE rowid = ?", [(r,) for r in gone])
                    self._forget_vectors(gone)
        if self.dense is not None:
            self.dense.add(self._new)
        return list(dict.fromkeys(e for e in stale if e))

    def _drop(self, ref: str) -> list[str]:
        rows = [r for (r,) in self.db.execute("SELECT row FROM refs WHERE ref = ?", (ref,))]
        if not rows:
            return []
        stale = self._entries(rows)
        self.db.executemany("DELETE FROM chunks WHERE rowid = ?", [(r,) for r in rows])
        self.db.execute("DELETE FROM refs WHERE ref = ?", (ref,))
        self._forget_vectors(rows)
        return stale

    def _entries(self, rows: list[int]) -> list[str]:
        """The log entries these chunks were indexed from."""
        found: list[str] = []
        for start in range(0, len(rows), 500):
            part = rows[start:start + 500]
            found += [e for (e,) in self.db.execute(
                f"SELECT DISTINCT entry FROM refs WHERE row IN ({','.join('?' * len(part))})", part)]
        return found

    def _forget_vectors(self, rows: list[int]) -> None:
        """Chunks gone: their vectors too, and those not made yet (added earlier in this batch) never made."""
        gone = set(rows)
        self._new = [new for new in self._new if new[0] not in gone]
        if self.dense is not None:
            self.dense.remove(rows)

    def query(self, match: str, text: str, *, agent_id: str, owner: str, limit: int,
              turn: str) -> list[tuple[Any, ...]]:
        """Rows ``(kind, place, role, at, owner, excerpt, score)``, best first: BM25's, or (with the embedding
        model) BM25's and the nearest vectors' fused by reciprocal rank."""
        lexical = self.db.execute(QUERY, (match, agent_id, owner, owner, owner, turn, limit)).fetchall()
        if self.dense is None:
            return [row[1:] for row in lexical]
        scopes = list(dict.fromkeys([_scope("note", agent_id, owner), _scope("note", agent_id, ""),
                                     *([_scope("conversation", "", owner)] if owner else [])]))
        near = self.dense.nearest(text, scopes, limit, turn=turn)
        fused: dict[int, float] = {}
        for ranked in ([row[0] for row in lexical], near):
            for rank, rowid in enumerate(ranked):
                fused[rowid] = fused.get(rowid, 0.0) + 1 / (RRF_K + rank)
        rows = {row[0]: row for row in lexical}
        missing = [rowid for rowid in near if rowid not in rows]
        if missing:
            marks = ",".join("?" * len(missing))
            rows.update((row[0], row) for row in self.db.execute(
                f"SELECT rowid, kind, place, role, at, owner, substr(text, 1, 300), 0 FROM chunks "
                f"WHERE rowid IN ({marks})", missing))
        ordered = sorted((rowid for rowid in fused if rowid in rows), key=lambda r: -fused[r])
        return [(*rows[r][1:7], fused[r] * 100) for r in ordered[:limit]]

    def size(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM chunks").fetchone()[0])


class Recall:
    """This worker's index of the memory log, kept up to date, and the search over it."""

    def __init__(self, redis: RedisStore, keys: Keys, *, embeddings: bool = True,
                 on_built: Callable[[], Awaitable[None]] | None = None) -> None:
        self.redis, self.keys, self.embeddings = redis, keys, embeddings
        self.log = MemoryLog(redis, keys)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recall")
        self._index: _Index | None = None
        self._last = "0-0"  # the last log entry indexed
        self._lock = asyncio.Lock()
        # The first build from the log: its progress while it runs (None before it starts), then built.
        self.build: Progress | None = None
        self.built = False
        self._on_built = on_built

    def building(self) -> str:
        """How far the first build from the log has come ("4,000/10,000 entries", "(starting)"); empty once
        built."""
        if self.built:
            return ""
        return self.build.snapshot().amount() if self.build is not None else "(starting)"

    async def catch_up(self, *, batches: int | None = None) -> int:
        """Index the log entries written since the last one read (at most ``batches`` reads of READ_BATCH);
        how many. The lock is held per batch, so a search is not kept waiting by a long first build."""
        done, read = 0, 0
        while batches is None or read < batches:
            read += 1
            async with self._lock:
                if self.build is None:
                    await self._start_build()
                found = await self.redis.xrange(self.keys.memory_log, min=f"({self._last}", count=READ_BATCH)
                if not found:
                    await self._built()
                    return done
                entries = [(entry_id.decode(), {k.decode(): v.decode(errors="replace") for k, v in fields.items()})
                           for entry_id, fields in found]
                stale = await self._run(lambda batch=entries: self._ready().apply(batch))
                self._last = found[-1][0].decode()
                if stale:  # what a writer left in the log (an entry from before the log purged itself)
                    await self.redis.xdel(self.keys.memory_log, *stale)
                if not self.built and self.build is not None:
                    counted = self.build.done + len(found)
                    self.build.update(counted, total=max(counted, self.build.total or 0))
            done += len(found)
            if len(found) < READ_BATCH:
                async with self._lock:
                    await self._built()
                return done
        return done

    async def _start_build(self) -> None:
        """The first read: the log's length is the build's total; a log of more than one batch is reported."""
        total = int(await self.redis.xlen(self.keys.memory_log))
        quiet = total <= READ_BATCH  # built in a moment: nothing to watch
        self.build = Progress("indexing the memory log", total, Lines(_quiet if quiet else _said), noun="entries",
                              throttle=BUILD_THROTTLE)
        if not quiet:
            self.build.update(0)

    async def _built(self) -> None:
        """The log is read to its end: the first build is over (said once; the heartbeat told at once)."""
        if self.built or self.build is None:
            return
        self.built = True
        self.build.finish()
        if self._on_built is not None:
            try:
                await self._on_built()
            except Exception as exc:  # a heartbeat that failed: the next one says it
                log.info("memory index built; not told at once %s", kv(error=exc))

    async def run(self, stop: asyncio.Event, *, every_s: float = 0.5) -> None:
        """Keep the index up to date until ``stop`` (a failed read is retried at the next tick)."""
        while not stop.is_set():
            try:
                if await self.catch_up():
                    continue
            except Exception as exc:  # Redis away: searches catch up themselves when it is back
                log.warning("memory log not read %s", kv(error=exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
        self._thread.shutdown(wait=False)

    async def search(self, agent_id: str, query: str, *, owner: str, limit: int = 10,
                     turn: str = "") -> list[dict[str, Any]]:
        """``owner``'s notes (with the agent's shared ones) and conversations that match ``query``, best first;
        the words of turn ``turn`` (the one searching: they are what it is reading) left out."""
        found = re.findall(r"\w+", query.lower())
        words = [w for w in dict.fromkeys(found) if w not in STOP_WORDS][:64] or found[:64]
        if not words:
            return []
        # What was written before this search is indexed first, unless the worker is still building its index
        # (a new worker reading a long log): then the search answers from what is indexed so far.
        if await self.catch_up(batches=SEARCH_BATCHES) >= SEARCH_BATCHES * READ_BATCH:
            log.info("memory search answered while the index is still being built %s", kv(owner=owner))
        match = " OR ".join(f'"{w}"' for w in words)
        rows = await self._run(lambda: self._ready().query(match, query, agent_id=agent_id, owner=owner,
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
        count: int = await self._run(lambda: self._ready().size())
        return count

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
            stale = await self._run(lambda: self._ready().apply(("", session_forgotten(s)) for s in gone))
            await self.log.forget(*sorted(gone))  # the lapsed session's words leave the log, and every index
            if stale:
                await self.redis.xdel(self.keys.memory_log, *stale)
        return gone

    def _ready(self) -> _Index:
        if self._index is None:  # made in the index's own thread, where it is always used
            self._index = _Index(self.embeddings)
        return self._index

    async def _run(self, work: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, work)
