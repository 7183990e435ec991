"""Values made once per object, found by the object's identity: for lists and messages handed on unchanged
turn after turn (a tool list until Hands' tools change), whose contents are costly to hash or encode."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class ByIdentity(Generic[K, V]):
    """``make(key)``, made once per key object. The key is kept beside its value, so its id stays its own;
    past ``size`` keys (None: no bound) all are dropped: what outlived its use is not worth sorting out."""

    def __init__(self, make: Callable[[K], V], size: int | None = None) -> None:
        self.make, self.size = make, size
        self._made: dict[int, tuple[K, V]] = {}

    def __len__(self) -> int:
        return len(self._made)

    def __call__(self, key: K) -> V:
        hit = self._made.get(id(key))
        if hit is not None and hit[0] is key:
            return hit[1]
        if self.size is not None and len(self._made) >= self.size:
            self._made.clear()
        value = self.make(key)
        self._made[id(key)] = (key, value)
        return value


class Keeping(dict[str, Any]):
    """A dict that keeps what is derived from it (its token count, its name in a record) beside its items: for
    one read again and again unchanged (a transcript's messages, turn after turn), so nothing derived from it is
    made twice, and nothing outlives it. Its readers never change its items."""

    __slots__ = ("kept",)

    def __init__(self, *args: Any, **items: Any) -> None:
        super().__init__(*args, **items)
        self.kept: dict[str, Any] = {}

    def __reduce_ex__(self, protocol: Any) -> Any:
        return dict, (dict(self),)  # a copy is a plain dict: whoever copies it may change it


_NOTHING: Mapping[str, Any] = MappingProxyType({})


def known(value: Any) -> Mapping[str, Any]:
    """What is kept on ``value`` (nothing for a value that is not a ``Keeping``): for a loop over many values
    that reads what is there before making anything."""
    return value.kept if type(value) is Keeping else _NOTHING


def kept(value: Any, what: str, make: Callable[[], V]) -> V:
    """``make()``, kept on ``value`` as ``what`` when it is a ``Keeping`` (made again for any other value)."""
    if type(value) is not Keeping:
        return make()
    found: V | None = value.kept.get(what)
    if found is None:
        found = value.kept[what] = make()
    return found
