"""Each session's transcript as a process last read it, so the next read fetches and parses only what was
added since.

A transcript only grows (``SessionStore.append``); it is otherwise deleted, lapses, or comes back from a
backup. So a read sends, in one round trip, the entries at the first and the last index this process
holds and every entry after them: both the same, byte for byte, and what it holds is still the list's
head (each entry carries its time and its message's random id, so a list made again reads differently
there); either different or gone, and the whole list is read afresh. Bounded by the memory the entries
take, as estimated by ``held_bytes``, the sessions read longest ago dropped first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

# What a parsed entry takes beyond its stored bytes (a model, its metadata dict, its marks): tracemalloc saw
# ~2,000 bytes for a 168-byte chat message, ~8,900 for an 8,100-byte tool result.
ENTRY_OVERHEAD = 1900


def held_bytes(stored: list[bytes]) -> int:
    """About what ``stored`` entries take once parsed."""
    return sum(map(len, stored)) + ENTRY_OVERHEAD * len(stored)


@dataclass(frozen=True, slots=True)
class Held(Generic[T]):
    entries: tuple[T, ...]
    first: bytes  # the list's first and last entries as stored: what a read checks before using the rest
    last: bytes
    size: int  # about the memory they take (held_bytes)


class TranscriptCache(Generic[T]):
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._held: OrderedDict[str, Held[T]] = OrderedDict()
        self.size = 0

    def __len__(self) -> int:
        return len(self._held)

    def get(self, session_id: str) -> Held[T] | None:
        held = self._held.get(session_id)
        if held is not None:
            self._held.move_to_end(session_id)
        return held

    def put(self, session_id: str, held: Held[T]) -> None:
        self.drop(session_id)
        if held.size > self.max_bytes:
            return  # one session bigger than the whole cache: read whole each time
        self._held[session_id] = held
        self.size += held.size
        while self.size > self.max_bytes:
            _, oldest = self._held.popitem(last=False)
            self.size -= oldest.size

    def drop(self, session_id: str) -> None:
        held = self._held.pop(session_id, None)
        if held is not None:
            self.size -= held.size
