"""What the commands that talk to a running pool share: a bus connected to its Redis, and a session's name as
typed on the command line."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from bus.config import Config
from bus.service import redis_url
from bus.streams import Bus
from gateway.tokens import OWNER
from memory.session_ids import SEPARATOR


@asynccontextmanager
async def connected_bus(config: Config) -> AsyncIterator[Bus]:
    bus = Bus.from_settings(config.redis, redis_url(config))
    try:
        await bus.redis.ping()
        yield bus
    finally:
        await bus.close()


def qualified(session: str) -> str:
    """A session named on the command line: ``NAME`` is the owner token's session of that name, ``OWNER/NAME``
    anyone's."""
    return session if SEPARATOR in session else f"{OWNER}{SEPARATOR}{session}"
