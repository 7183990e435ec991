"""What a platform sends, read without trusting it: one event or file that cannot be read is passed over
(logged), never the read it came in. A polled platform whose read failed would fetch the same events again
from the same offset for ever, and nothing after them would arrive."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar, overload

from bus.protocol import ChannelFile, ChannelUpdate
from bus.redis_client import RedisAway, RedisRefused
from gateway.channels.errors import PlatformAway

log = logging.getLogger("gateway.channels")

E = TypeVar("E")
R = TypeVar("R")
MOST_REF = 512  # ChannelFile's bounds
MOST_NAME = 255


def file_of(ref: object, name: object, size: object, mime: object) -> ChannelFile | None:
    """A file a platform describes, its name and type cut to fit and a size that is not a count read as
    unknown; None (logged) when its reference is not one this channel could fetch it by."""
    if not isinstance(ref, str) or not ref or len(ref) > MOST_REF:
        log.warning("a file whose reference is not a string of 1-%d characters was passed over (%r)",
                    MOST_REF, str(ref)[:80])
        return None
    shown = " ".join(str(name or "").split())[:MOST_NAME] or "file"
    kind = str(mime or "")
    kind = kind if len(kind) <= MOST_NAME and kind.isprintable() else ""
    count = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else 0
    return ChannelFile(ref=ref, name=shown, size=count, mime=kind)


def files_of(described: Iterable[ChannelFile | None]) -> list[ChannelFile]:
    """The files that could be read, ten at most (what one update carries)."""
    return [f for f in described if f is not None][:10]


@overload
async def read_one(event: E, read: Callable[[E], Awaitable[R]], *, what: str) -> R | None: ...


@overload
async def read_one(event: E, read: Callable[[E], R], *, what: str) -> R | None: ...


async def read_one(event: E, read: Callable[[E], Any], *, what: str) -> Any:
    """The event read (into an update, say; None: nothing for the agent, or it could not be read: logged).
    Redis or the platform away is not the event's fault: that raises, and the read is made again."""
    try:
        update = read(event)
        return await update if inspect.isawaitable(update) else update
    except (PlatformAway, RedisAway, RedisRefused):
        raise
    except Exception:  # a platform's (or a hostile sender's) odd event: not the whole read's failure
        log.exception("%s: an event that cannot be read was passed over", what)
        return None


async def read_each(events: Iterable[E], read: Callable[[E], Awaitable[ChannelUpdate | None]]
                    | Callable[[E], ChannelUpdate | None], *, what: str) -> list[ChannelUpdate]:
    """Each event read into an update (``read_one``), those for the agent in order."""
    return [u for u in [await read_one(event, read, what=what) for event in events] if isinstance(u, ChannelUpdate)]
