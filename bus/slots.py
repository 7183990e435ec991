"""A consumer's handler slots: how many entries it runs at once."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Coroutine
from typing import Any


class Slots:
    """How many handlers run at once: a semaphore whose free count can be read, and taken without a
    coroutine when one is free (on every message), which asyncio's offers neither of publicly."""

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take_now(self) -> bool:
        """Take a slot if one is free and no one waits for it."""
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        return False

    async def take(self) -> None:
        if self.take_now():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # give() hands its slot straight to us
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed one, then cancelled: it goes to the next
            else:
                self._waiters.remove(waiter)
            raise

    def give(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1

    async def free_soon(self, stop: asyncio.Event | None = None) -> int:
        """How many slots are free, once at least one is; 0 if ``stop`` is set first (a stop must not
        wait for work held through an outage to let a slot go)."""
        if not self.take_now():
            if stop is None:
                await self.take()
            elif not await _first(self.take(), stop):
                return 0
        free = self.free + 1
        self.give()
        return free


async def _first(taking: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Whether ``taking`` (a slot) ended before ``stop`` was set; a slot taken as it lost is given back
    (``take``'s own cancellation does that)."""
    took = asyncio.ensure_future(taking)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({took, stopped}, return_when=asyncio.FIRST_COMPLETED)
        return took.done()
    finally:  # on losing, and on being cancelled: no slot taken later that nobody gives back
        stopped.cancel()
        if not took.done():
            took.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await took
