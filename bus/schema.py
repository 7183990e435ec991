"""The version of the stored data's layout, and the migrations that bring older data up to it.

Every process checks it when it starts, before it reads anything: data at this
release's version goes on; older data is migrated once (one process migrates
under a lock while the others wait for the version to move); data newer than
this release knows is refused with what to do, since reading a layout it does
not know could lose or corrupt what a newer release wrote. A key space with no
version yet is either empty or the layout before versions (version 1: nothing
to change), and is stamped. The rule for what needs a new version:
docs/upgrades.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bus.errors import PincerError
from bus.streams import Bus

log = logging.getLogger("bus.schema")

VERSION = 1  # this release's layout
LOCK_S = 600  # a migrating process that dies frees the lock after this


class SchemaTooNew(PincerError):
    """The stored data was written by a newer release than this one."""


@dataclass(frozen=True)
class Migration:
    """What brings data at version ``to - 1`` to ``to``; it must be safe to run again if cut short."""

    to: int
    what: str
    run: Callable[[Bus], Awaitable[None]]


MIGRATIONS: list[Migration] = []  # in order of ``to``; none yet: version 1 is the first layout


async def ensure_current(bus: Bus, *, version: int = VERSION, migrations: list[Migration] | None = None,
                         wait_s: float = LOCK_S) -> int:
    """Bring the stored data to ``version`` (migrating it, or waiting for the process that does); the version
    it was at. Raises ``SchemaTooNew`` when the data is newer than ``version``."""
    steps = MIGRATIONS if migrations is None else migrations
    key, lock = bus.keys.schema, f"{bus.keys.schema}:migrating"
    await bus.redis.set(key, 1, nx=True)  # unstamped: empty, or the layout before versions
    found = await _read(bus, key)
    if found > version:
        raise SchemaTooNew(f"the data in Redis ({bus.keys.prefix}*) has layout version {found}, written by a newer "
                           f"release; this one knows up to {version}. Run the newer release, or restore a backup "
                           "taken by this one (docs/upgrades.md)")
    deadline = time.monotonic() + wait_s
    while found < version:
        if await bus.redis.set(lock, "1", nx=True, ex=LOCK_S):
            try:
                found = await _migrate(bus, key, found, version, steps)
            finally:
                await bus.redis.delete(lock)
        else:  # another process migrates: its new version is what this one waits for
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {wait_s:g}s for another process to migrate the data (lock {lock})")
            await asyncio.sleep(0.5)
            found = await _read(bus, key)
    return found


async def _migrate(bus: Bus, key: str, found: int, version: int, steps: list[Migration]) -> int:
    found = await _read(bus, key)  # again under the lock: another process may have finished meanwhile
    for step in steps:
        if found < step.to <= version:
            log.warning("migrating stored data to layout %d: %s", step.to, step.what)
            started = time.monotonic()
            await step.run(bus)
            await bus.redis.set(key, step.to)
            found = step.to
            log.warning("stored data at layout %d (%.1fs)", found, time.monotonic() - started)
    if found < version:  # no step reaches it: this release's own list is wrong
        raise RuntimeError(f"no migration brings layout {found} to {version}")
    return found


async def _read(bus: Bus, key: str) -> int:
    raw = await bus.redis.get(key)
    try:
        return int(raw or 1)
    except ValueError:
        raise SchemaTooNew(f"{key} holds {raw!r}, not a layout version: this key belongs to Pincer; "
                           "restore it from a backup") from None
