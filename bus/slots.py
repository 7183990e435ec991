"""A consumer's handler slots: how many entries it runs at once."""

from __future__ import annotations

import asyncio
from collections import deque


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

    async def free_soon(self) -> int:
        """How many slots are free, once at least one is."""
        await self.take()
        free = self.free + 1
        self.give()
        return free
