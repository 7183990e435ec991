"""Work a consumer holds through a Redis outage: an outage is not a delivery.

A handler that met Redis away (a restart, a failover whose replica does not confirm writes yet) keeps
its entry: held here and renewed by the consumer's reaper, so nobody claims it and ``max_deliveries``
counts only consumers that died, then run again in place once a write goes through. A round of
answers the primary applied but too few replicas confirmed is confirmed, not sent again (that would
add its replies twice). The rules are the consumer's; what they ask of Redis is here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from redis import exceptions as redis_errors

from bus.log import kv
from bus.streams import CONNECTION_ERRORS, RECONNECT_DELAYS

if TYPE_CHECKING:
    from bus.answers import Answers
    from bus.streams import Bus

log = logging.getLogger("bus")

WRITE_RETRY_DELAYS = (*RECONNECT_DELAYS, 2.0, 2.0, 2.0)  # then every 2 s while running; ~10 s once stopping


def retry_delay(attempt: int) -> float:
    """How long to wait before writing again after ``attempt`` tries met Redis away (the last step repeats)."""
    return WRITE_RETRY_DELAYS[min(attempt, len(WRITE_RETRY_DELAYS) - 1)]


# A handler cut off from Redis this many times in a row while Redis took the very next write each
# time meets no outage: its entry goes back to the reaper, which counts deliveries.
QUICK_CUTOFFS = 3
REDIS_AWAY = (redis_errors.ConnectionError, redis_errors.TimeoutError)  # RedisAway, and fakeredis's own
NOT_THROUGH = (*CONNECTION_ERRORS, redis_errors.RedisError)  # away, or refused (READONLY mid-failover)


class Outage:
    """One consumer's side of an outage: waiting for writes to go through, and checking what it holds."""

    def __init__(self, bus: Bus, group: str, consumer: str, stopping: Callable[[], bool]) -> None:
        self.bus, self.group, self.consumer, self.stopping = bus, group, consumer, stopping

    async def run_again(self, stream: str, entry_id: str, quick: int) -> int | None:
        """After a handler met Redis away, once writes go through: how many cut-offs in a row met no outage
        (``quick``, counted on), to run it again; or None to let the entry go (stopping: left pending for
        whoever runs next; cut off too often while Redis took writes, or taken over: the reaper's then)."""
        waited = await self.writes_go_through()
        if waited is None:
            return None
        quick = 0 if waited else quick + 1
        if quick >= QUICK_CUTOFFS:  # the handler's own Redis calls fail, not Redis: a delivery after all
            log.error("handler cut off %d times while Redis took writes %s; left for the reaper",
                      quick, kv(stream=stream, entry=entry_id))
            return None
        if not await self.still_mine(stream, entry_id):
            log.info("taken over while Redis was away %s", kv(stream=stream, entry=entry_id))
            return None
        return quick

    async def writes_go_through(self) -> bool | None:
        """Wait until a write goes through (with its WAIT, under redis.min_replicas): whether that took
        more than one try, or None once stopping."""
        attempt = 0
        while not self.stopping():
            try:
                await self.bus.batcher.run(lambda pipe: pipe.ping())
                return attempt > 0
            except NOT_THROUGH:
                await asyncio.sleep(retry_delay(attempt))
                attempt += 1
        return None

    async def still_mine(self, stream: str, entry_id: str) -> bool:
        """Whether the entry is still pending to us (a reaper that saw no outage may have taken it over)."""
        try:
            held = await self.bus.pending_to(stream, self.group, entry_id)
        except NOT_THROUGH:
            return True  # away again: the run meets it too, and waits once more
        return held is not None and held[0] == self.consumer

    async def confirmed(self, answers: Answers) -> bool:
        """Whether a round the primary applied stands, once writes are confirmed again: False if a failover
        lost it (its entries are still pending to us), to be sent again."""
        stream, entry_id = answers.entries[0][:2]  # one transaction: every entry of it or none was applied
        attempt = 0
        while True:
            await self.writes_go_through()  # None once stopping: then it stands as the primary answered
            try:
                held = await self.bus.pending_to(stream, self.group, entry_id)
            except CONNECTION_ERRORS:
                if self.stopping():
                    return True
                await asyncio.sleep(retry_delay(attempt))
                attempt += 1
                continue
            except redis_errors.RedisError:  # refused (its group gone with Redis's data): the round's results say
                return True
            if held is not None and held[0] == self.consumer:
                log.warning("a round of answers lost in a failover; sending it again %s",
                            kv(stream=stream, entry=entry_id))
                return False
            return True
