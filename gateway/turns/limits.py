"""What one caller may ask of the pool: open turns and streams, messages per minute, text stored a day, the
Brain backlog.

Open turns are counted per Gateway (they end with the request that holds
them); the message rate and the text a day are token buckets in Redis
(bus/admission.py), so they hold across every Gateway of the pool; the
backlog is how many messages no Brain has read yet.
Each refusal says when to come back (``Retry-After``).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from bus.admission import Admission, refusal
from bus.protocol import ErrorCode
from bus.scripts import ScriptCall, gated
from bus.streams import Bus
from gateway.config import LimitSettings
from gateway.turns.refusal import Refused

BACKLOG_CHECK_S = 0.5  # the inbox backlog is read at most this often


class CallerLimits:
    def __init__(self, bus: Bus, settings: LimitSettings) -> None:
        self.bus, self.settings = bus, settings
        self.admission = Admission(bus, settings.rate())
        self._turns: Counter[str] = Counter()
        self._streams: Counter[str] = Counter()
        self._backlog = (0.0, 0)  # (checked at, messages waiting)

    def hold_turn(self, name: str, *, stream: bool) -> Hold:
        """One of the token's open turns (and streams), held until ``release``; refused when all are taken."""
        if self._turns[name] >= self.settings.open_turns_per_token:
            raise Refused(ErrorCode.RATE_LIMITED, f"this token already has {self._turns[name]} turns running "
                          "(gateway.limits.open_turns_per_token); wait for one to finish", retry_after=1)
        if stream and self._streams[name] >= self.settings.open_streams_per_token:
            raise Refused(ErrorCode.RATE_LIMITED, f"this token already has {self._streams[name]} streams open "
                          "(gateway.limits.open_streams_per_token); close one first", retry_after=1)
        counters = [self._turns, self._streams] if stream else [self._turns]
        for counter in counters:
            counter[name] += 1
        return Hold(name, counters)

    def hold_stream(self, name: str) -> Hold:
        """One of the token's open streams (an event subscription, no turn), held until ``release``."""
        if self._streams[name] >= self.settings.open_streams_per_token:
            raise Refused(ErrorCode.RATE_LIMITED, f"this token already has {self._streams[name]} streams open "
                          "(gateway.limits.open_streams_per_token); close one first", retry_after=1)
        self._streams[name] += 1
        return Hold(name, [self._streams])

    async def take_message(self, name: str, *, then: ScriptCall | None = None, messages: int = 1,
                           size: int = 0) -> Any:
        """Count one message (or ``messages``, at most a burst) of ``size`` bytes of text to store against
        the token's limits; refuse it when either bucket is short. ``then``: a script run in the same step
        only when the message is taken (its number, say); its result is returned."""
        take = self.admission.take_call(name, messages, size=size)
        call = take if then is None else gated(take, then)
        said = call.read((await self.bus.batcher.run(call.add))[0])
        taken, result = (said, None) if then is None else said
        if (short := refusal(taken)) is None:
            return result
        retry_after = -(-short.wait_ms // 1000)
        if short.short == "text":
            raise Refused(ErrorCode.RATE_LIMITED, f"this token stored more than {self.settings.text_mb_per_day:g} "
                          f"MB of text today (gateway.limits.text_mb_per_day); this message ({size:,} bytes) "
                          f"fits in about {_span(retry_after)}", retry_after=retry_after)
        costs = "" if messages <= 1 else \
            f" (this counts as {self.admission.cost_of(messages)}: one for each message it copies)"
        raise Refused(ErrorCode.RATE_LIMITED, f"this token sent more than "
                      f"{self.settings.messages_per_minute} messages a minute{costs} "
                      "(gateway.limits.messages_per_minute); slow down", retry_after=retry_after)

    async def check_backlog(self) -> None:
        """Refuse new messages while Brains are this far behind, rather than let them wait for ever."""
        checked, waiting = self._backlog
        if time.monotonic() - checked > BACKLOG_CHECK_S:
            waiting = await self._waiting()
            self._backlog = (time.monotonic(), waiting)
        if waiting >= self.settings.max_inbox_backlog:
            raise Refused(ErrorCode.SERVICE_UNAVAILABLE, f"{waiting} messages are waiting for a Brain "
                          "(gateway.limits.max_inbox_backlog); try again shortly, or start more Brains",
                          retry_after=5)

    async def _waiting(self) -> int:
        """Messages in the Brain inbox that no Brain has read yet."""
        return await self.admission.waiting()


class Hold:
    """Open turns a request holds; ``release`` gives them back (once, however often it is called)."""

    def __init__(self, name: str, counters: list[Counter[str]]) -> None:
        self.name, self._counters = name, counters

    def release(self) -> None:
        for counter in self._counters:
            counter[self.name] -= 1
            if counter[self.name] <= 0:
                del counter[self.name]
        self._counters = []


def _span(seconds: int) -> str:
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min" if seconds < 7200 else f"{seconds // 3600} h"
