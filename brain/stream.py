"""A turn's streamed text, gathered into a delta at most every ``every_s`` instead of one per provider chunk.

Providers stream a token or two per chunk; each delta costs a bus message, the Gateway's append to the
session's event log (an entry kept in Redis) and a frame to every follower. The first piece goes out at
once (time to first token is what a person notices); what follows within ``every_s`` waits and goes as
one delta. A pending piece is sent when its time comes, and always before anything else the turn sends
(``flush`` at the end of each model call), so order and text are as the provider streamed them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Deltas:
    def __init__(self, send: Callable[[str], None], every_s: float) -> None:
        self.send, self.every_s = send, every_s
        self._held: list[str] = []
        self._last = float("-inf")  # when a delta last went out (the loop's clock)
        self._timer: asyncio.TimerHandle | None = None

    async def __call__(self, text: str) -> None:
        """The model client's ``on_text``: send now if the last delta is old enough, else hold it."""
        self._held.append(text)
        if self._timer is not None:
            return  # a send is already due: this piece rides with it
        loop = asyncio.get_running_loop()
        wait = self._last + self.every_s - loop.time()
        if wait <= 0:
            self.flush()
        else:
            self._timer = loop.call_later(wait, self.flush)

    def flush(self) -> None:
        """Whatever is held, as one delta, now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held:
            text, self._held = "".join(self._held), []
            self._last = asyncio.get_running_loop().time()
            self.send(text)
