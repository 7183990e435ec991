"""A model request's parts (its messages, its tool list), each named by the digest of its canonical JSON so
the flight record stores it once per session (memory/flight.py), and the memory of which parts each
session's hash holds, so each is sent once, not at every model call."""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import Any

from bus.identity import ByIdentity, kept, known
from bus.scripts import lua


def digest(value: Any) -> str:
    """A part's name: the SHA-256 of its canonical JSON (the same part is stored once)."""
    return name_of(canonical(value))


def name_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def canonical(value: Any) -> str:
    return _CANONICAL.encode(value)  # one encoder: json.dumps with options makes one per call


PART_NAME = "record part"  # what a ``Keeping`` message keeps its name as


class Parts:
    """What one turn has digested: each message is hashed once (by identity: a turn never changes a message
    it sent), however many of the turn's requests carry it."""

    def __init__(self) -> None:
        self._named: ByIdentity[Any, tuple[str, str]] = ByIdentity(_KNOWN.named)  # its name, its canonical JSON

    def __len__(self) -> int:
        return len(self._named)

    def digest(self, value: Any) -> str:
        return kept(value, PART_NAME, lambda: self._named(value)[0])  # its text is made again only if sent

    def names(self, messages: list[Any]) -> list[str]:
        """Each message's name: most were named in earlier turns and keep it, read without a call."""
        return [known(m).get(PART_NAME) or self.digest(m) for m in messages]

    def text(self, value: Any) -> str:
        """``value``'s canonical JSON, made once with its name."""
        return self._named(value)[1]


class KnownMessages:
    """Names of the messages of recent turns, by content, for the whole process: each turn sends its session's
    history again as new objects, and naming it again (its canonical JSON) grew with every turn. Only plain
    messages (every value a short string) are kept, at most ``size`` of them, the oldest dropped first: at
    most ~8 MB held (each kept as its key and its JSON), ~1 MB for messages of a few hundred characters."""

    def __init__(self, size: int = 2048, longest: int = 2048) -> None:
        self.size, self.longest = size, longest
        self._names: dict[tuple[tuple[str, str], ...], tuple[str, str]] = {}

    def named(self, value: Any) -> tuple[str, str]:
        key = self._key(value)
        hit = self._names.get(key) if key is not None else None
        if hit is not None:
            return hit
        text = canonical(value)
        named = (name_of(text), text)
        if key is not None:
            if len(self._names) >= self.size:
                del self._names[next(iter(self._names))]
            self._names[key] = named
        return named

    def _key(self, value: Any) -> tuple[tuple[str, str], ...] | None:
        if not isinstance(value, dict):
            return None
        items = value.items()
        if not all(isinstance(k, str) and isinstance(v, str) and len(v) <= self.longest for k, v in items):
            return None
        return tuple(sorted(items))


_KNOWN = KnownMessages()


_NONE: frozenset[str] = frozenset()


class StoredParts:
    """The parts each session's hash holds, as this process last heard. Every request of a session repeats
    its history and its tool list; sending each again grew with every turn (~13 KB a turn at 30 turns). A
    hint only: each write has Redis check that the parts it names without sending are there, and the
    missing (a session deleted, a record imported over, a failover) are sent right after. At most ``most``
    names are held, the sessions heard from longest ago dropped first (~100 bytes a name)."""

    def __init__(self, most: int = 65_536) -> None:
        self.most = most
        self._by_session: OrderedDict[str, set[str]] = OrderedDict()
        self._held = 0

    def of(self, session_id: str) -> AbstractSet[str]:
        """The session's names, not a copy: read them before the next ``add``."""
        names = self._by_session.get(session_id)
        if names is None:
            return _NONE
        self._by_session.move_to_end(session_id)
        return names

    def add(self, session_id: str, names: Iterable[str]) -> None:
        held = self._by_session.setdefault(session_id, set())
        before = len(held)
        held.update(names)
        self._held += len(held) - before
        self._by_session.move_to_end(session_id)
        while self._held > self.most and len(self._by_session) > 1:
            self._held -= len(self._by_session.popitem(last=False)[1])

    def forget(self, session_id: str) -> None:
        self._held -= len(self._by_session.pop(session_id, ()))


# KEYS: the session's parts. ARGV: how many parts are sent, those (name, canonical JSON) pairs, then the names
# the writer believes stored. Returns those of them that are not (sent again by the writer).
STORE_PARTS = lua("memory.record_parts.store_parts", """
local sent = tonumber(ARGV[1])
for i = 2, 2 * sent, 2 do redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) end
local missing = {}
for i = 2 * sent + 2, #ARGV do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 then missing[#missing + 1] = ARGV[i] end
end
return missing
""")
