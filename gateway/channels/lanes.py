"""Order per chat: the messages of one chat are admitted as turns one at a time, in the order the channel
was handed them, so answers to what a person said during an outage (handed in together) come in the order
it was said. Only admission waits: a turn runs on while the next message of its chat is admitted behind it
(the Brains then run a session's turns in that order), and presses and commands never wait for a turn."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable


class Lanes:
    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def turn(self, chat: str) -> AsyncIterator[Callable[[], None]]:
        """Wait for ``chat``'s lane; what it yields lets the next message in (once admitted, or at the end)."""
        lock = self._locks.setdefault(chat, asyncio.Lock())
        self._users[chat] = self._users.get(chat, 0) + 1
        held = False

        def admitted() -> None:
            nonlocal held
            if held:
                held = False
                lock.release()

        try:
            await lock.acquire()
            held = True
            yield admitted
        finally:
            admitted()
            self._users[chat] -= 1
            if not self._users[chat]:  # nobody waits in this lane: forget it
                del self._users[chat], self._locks[chat]
