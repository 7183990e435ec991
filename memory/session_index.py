"""Which sessions there are: the pool's list by last activity, and each owner's own list beside it.

A session's id is its owner's name, ``/``, the name the owner gave it
(``alice/main``), so the owner is read from the id. The owner's list is kept in
the same round trip as the pool's, so listing one identity's sessions reads
only theirs: with 100,000 sessions in the pool, reading the whole pool's list
for each caller took 2.9 s (bench/session_list.py).

A release before the owners' lists kept the pool's list only, and such a
process may still write beside this one during a rolling upgrade. So each
Gateway, as it starts, and each retention pass adds to the owners' lists every
session the pool's list shows active since the last such pass, and takes off
both lists each session whose transcript lapsed (``catch_up``). Until the first
one has finished, an owner's sessions are read from the pool's list.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from redis import exceptions as redis_errors

from bus.keys import Keys
from bus.log import kv
from bus.store import RedisStore
from bus.text import literal, text
from memory.session_ids import SEPARATOR, owner_in

log = logging.getLogger("memory.session_index")

SLACK_S = 600.0  # writers' clocks differ: a catch-up reads this far back past the last one
CHUNK = 1_000


@dataclass
class Caught:
    put: int = 0  # sessions put in their owner's list
    dropped: int = 0  # sessions that had lapsed, deleted


class SessionIndex:
    def __init__(self, redis: RedisStore, keys: Keys) -> None:
        self.redis, self.keys = redis, keys

    def touch(self, pipe: Any, session_id: str, at: float) -> None:
        """Commands marking the session active ``at`` (seconds since the epoch), in both lists."""
        pipe.zadd(self.keys.sessions, {session_id: at})
        if owner := owner_in(session_id):
            pipe.zadd(self.keys.sessions_of(owner), {session_id: at})

    def forget(self, pipe: Any, *session_ids: str) -> None:
        """Commands taking the sessions off both lists."""
        pipe.zrem(self.keys.sessions, *session_ids)
        for session_id in session_ids:
            if owner := owner_in(session_id):
                pipe.zrem(self.keys.sessions_of(owner), session_id)

    async def newest(self, owner: str | None = None) -> list[str]:
        """Session ids, the most recently active first: ``owner``'s (by their ids), or the pool's."""
        if owner is None:
            return _decoded(await self.redis.zrevrange(self.keys.sessions, 0, -1))
        if await self.redis.exists(self.keys.sessions_indexed):
            return _decoded(await self.redis.zrevrange(self.keys.sessions_of(owner), 0, -1))
        # No catch-up has finished yet: the pool's list, filtered by Redis itself
        found = [(text(m), score) async for m, score in
                 self.redis.zscan_iter(self.keys.sessions, match=f"{literal(owner)}{SEPARATOR}*", count=CHUNK)]
        return [session_id for session_id, _ in sorted(found, key=lambda pair: -pair[1])]

    async def catch_up(self, *, drop: Callable[[list[str]], Awaitable[int]], now: float | None = None) -> Caught:
        """Put in its owner's list each session active since the last catch-up (every one, the first
        time), and hand ``drop`` (the session store's) each one whose transcript is gone: lapsed, or
        deleted by a release that knew only the pool's list. A scan, not a range by score: it sees every
        session there was when it began, however the scores move meanwhile."""
        started = time.time() if now is None else now
        mark = await self.redis.get(self.keys.sessions_indexed)
        low = float(mark) - SLACK_S if mark is not None else float("-inf")
        caught = Caught()
        batch: list[tuple[str, float]] = []
        async for member, score in self.redis.zscan_iter(self.keys.sessions, count=CHUNK):
            batch.append((text(member), score))
            if len(batch) >= CHUNK:
                await self._settle(batch, low, caught, drop)
        await self._settle(batch, low, caught, drop)
        await self.redis.set(self.keys.sessions_indexed, repr(started))
        return caught

    async def _settle(self, batch: list[tuple[str, float]], low: float, caught: Caught,
                      drop: Callable[[list[str]], Awaitable[int]]) -> None:
        if not batch:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for session_id, _ in batch:
                pipe.exists(self.keys.transcript(session_id))
            there = await pipe.execute()
        async with self.redis.pipeline(transaction=False) as pipe:
            for (session_id, score), found in zip(batch, there, strict=True):
                if found and score >= low and (owner := owner_in(session_id)):  # GT: a writer's newer time stands
                    pipe.zadd(self.keys.sessions_of(owner), {session_id: score}, gt=True)
                    caught.put += 1
            await pipe.execute()
        caught.dropped += await drop([session_id for (session_id, _), found in zip(batch, there, strict=True)
                                      if not found])
        batch.clear()


async def catch_up_logged(catch_up: Callable[[], Awaitable[Caught]]) -> None:
    """A catch-up that reports rather than raises (a Gateway's start must not wait on it, nor fail with it):
    the next start or retention pass tries again, and lists read the pool's list meanwhile."""
    started = time.monotonic()
    try:
        caught = await catch_up()
    except (redis_errors.RedisError, OSError) as exc:
        log.warning("owners' session lists not caught up; the next start or retention pass tries again: %s", exc)
        return
    except Exception:  # a bug: said loudly, and the Gateway goes on (lists read the pool's list meanwhile)
        log.exception("owners' session lists not caught up")
        return
    log.info("owners' session lists caught up %s", kv(put=caught.put, dropped=caught.dropped,
                                                      took_s=round(time.monotonic() - started, 3)))


def _decoded(members: list[Any]) -> list[str]:
    return [text(m) for m in members]
