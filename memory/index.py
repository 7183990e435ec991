"""The search index of what a Hands worker has loaded: SQLite FTS5 over chunks of notes and words said.

Every row belongs to a unit (``memory/recall.py`` loads and evicts units whole):
one agent's notes of one identity (``n:<agent>/<owner>``; owner "" for its shared
notes) or one identity's conversations (``c:<owner>``). Rows are ranked by BM25 with
the Porter stemmer and, when the embedding model is installed, fused with the
nearest vectors by reciprocal rank. Used from one thread only (SQLite's
connection is not shared).
"""

from __future__ import annotations

import sqlite3
import zlib
from collections.abc import Iterable
from typing import Any

from memory.embedding import DenseIndex, Embedder
from memory.session_ids import owner_in

Fields = dict[str, str]
CHUNK_CHARS = 1_000  # a long message is indexed in pieces of about this size
RRF_K = 60  # reciprocal rank fusion's constant: how little a rank's position counts against being found at all

SCHEMA = """
CREATE VIRTUAL TABLE chunks USING fts5(text, kind UNINDEXED, owner UNINDEXED, agent UNINDEXED,
                                       place UNINDEXED, role UNINDEXED, at UNINDEXED, ref UNINDEXED,
                                       turn UNINDEXED, tokenize = 'porter unicode61');
CREATE TABLE refs (ref TEXT NOT NULL, row INTEGER NOT NULL, entry TEXT NOT NULL DEFAULT '', unit TEXT NOT NULL,
                   place TEXT NOT NULL);
CREATE INDEX refs_by_ref ON refs (ref);
CREATE INDEX refs_by_unit ON refs (unit);
CREATE INDEX refs_by_place ON refs (place);
"""
QUERY = """
SELECT rowid, kind, place, role, at, owner, snippet(chunks, 0, '', '', ' … ', 24), -bm25(chunks) FROM chunks
WHERE chunks MATCH ? AND ((kind = 'note' AND agent = ? AND (owner = ? OR owner = ''))
                          OR (kind = 'conversation' AND owner = ? AND ? != '' AND turn != ?))
ORDER BY bm25(chunks) LIMIT ?
"""


def int_of(value: str | None) -> int:
    """A number from the log, which anyone with Redis may write: a malformed one reads as 0, never stops indexing."""
    try:
        return int(value or 0)
    except ValueError:
        return 0


def unit_of(kind: str, agent: str, owner: str) -> str:
    """What a chunk is loaded and evicted with (and which vectors it is among): an identity's conversations, or
    one agent's notes of one owner (owner "": its shared notes)."""
    return f"c:{owner}" if kind == "conversation" else f"n:{agent}/{owner}"


def units_of(agent: str, owner: str) -> list[str]:
    """What a search by ``owner`` of ``agent``'s memory reads: its notes, the shared ones, its conversations."""
    return list(dict.fromkeys([unit_of("note", agent, owner), unit_of("note", agent, ""),
                               *([unit_of("conversation", "", owner)] if owner else [])]))


def _ref(entry: Fields) -> str:
    """What a new version replaces: a note's ref; for words said, their content and place, so the same message
    read from its transcript (a scope's build) and from the log (the feed) is indexed once."""
    if entry.get("kind") != "conversation":
        return entry.get("ref", "")
    text = entry.get("text", "")
    return f"said:{entry.get('place', '')}:{entry.get('at', '')}:{entry.get('role', '')}:{zlib.crc32(text.encode())}"


def wanted(entry: Fields, units: dict[str, None]) -> bool:
    """Whether a log entry changes what is loaded: a put or forget of a unit held (a drop finds its ref or not)."""
    op = entry.get("op")
    if op == "drop":
        return True
    if op == "forget":
        return unit_of("conversation", "", owner_in(entry.get("place", ""))) in units
    return op == "put" and unit_of(entry.get("kind", ""), entry.get("agent", ""), entry.get("owner", "")) in units


class Index:
    """The FTS5 index of every unit loaded, and the chunks' vectors when the embedding model is installed; used
    from one thread only (SQLite's connection is not shared)."""

    def __init__(self, embedder: Embedder | None) -> None:
        self.db = sqlite3.connect(":memory:")
        self.db.executescript(SCHEMA)
        self.dense = DenseIndex(embedder) if embedder is not None else None
        self._new: list[tuple[int, str, str, str]] = []  # chunks added in this batch, for their vectors
        self._rows = 0
        self.chunks = 0  # held now (what eviction weighs)

    def apply(self, entries: Iterable[tuple[str, Fields]]) -> list[str]:
        """Index ``(entry id, fields)`` in order; the ids of the log entries they made stale (an earlier version
        of a note, a forgotten session's words), for the log to lose too."""
        db = self.db
        self._new = []
        stale: list[str] = []
        with db:
            for entry_id, entry in entries:
                op, ref = entry.get("op"), _ref(entry)
                if op in ("put", "drop"):
                    stale += self._drop(ref)
                if op == "put":
                    text = entry.get("text", "")
                    for start in range(0, max(len(text), 1), CHUNK_CHARS):
                        self._rows += 1  # ids never reused (SQLite would reuse a deleted last one): vectors key on them
                        self.chunks += 1
                        unit = unit_of(entry.get("kind", ""), entry.get("agent", ""), entry.get("owner", ""))
                        cursor = db.execute(
                            "INSERT INTO chunks (rowid, text, kind, owner, agent, place, role, at, ref, turn) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (self._rows, text[start:start + CHUNK_CHARS], entry.get("kind", ""), entry.get("owner", ""),
                             entry.get("agent", ""), entry.get("place", ""), entry.get("role", ""),
                             int_of(entry.get("at")), ref, entry.get("turn", "")))
                        db.execute("INSERT INTO refs (ref, row, entry, unit, place) VALUES (?, ?, ?, ?, ?)",
                                   (ref, cursor.lastrowid, entry_id, unit, entry.get("place", "")))
                        self._new.append((int(cursor.lastrowid or 0), unit, entry.get("turn", ""),
                                          text[start:start + CHUNK_CHARS]))
                elif op == "forget":
                    place = entry.get("place", "")
                    gone = [r for (r,) in db.execute("SELECT row FROM refs WHERE place = ? AND unit = ?",
                                                     (place, unit_of("conversation", "", owner_in(place))))]
                    stale += self._entries(gone)
                    db.executemany("DELETE FROM refs WHERE row = ?", [(r,) for r in gone])
                    db.executemany("DELETE FROM chunks WHERE rowid = ?", [(r,) for r in gone])
                    self.chunks -= len(gone)
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
        self.chunks -= len(rows)
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

    def evict(self, unit: str) -> None:
        """A unit's chunks and vectors leave (it is read again from Redis when next searched)."""
        rows = [r for (r,) in self.db.execute("SELECT row FROM refs WHERE unit = ?", (unit,))]
        with self.db:
            self.db.executemany("DELETE FROM chunks WHERE rowid = ?", [(r,) for r in rows])
            self.db.execute("DELETE FROM refs WHERE unit = ?", (unit,))
        self.chunks -= len(rows)
        if self.dense is not None:
            self.dense.drop(unit)

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
        near = self.dense.nearest(text, units_of(agent_id, owner), limit, turn=turn)
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
