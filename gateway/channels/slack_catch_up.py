"""Reading back what a Slack connection missed, in the order it was said.

Slack retries what a dead connection missed on its own schedule, not in the order it was said. So
each message taken marks its conversation (a channel's top level, or a thread) with its ``ts`` in
Redis; after a connection, the conversations most recently heard in are read back from that mark
(``conversations.history``, ``conversations.replies``) and what was missed is taken in order. A
message is taken once by its channel and ``ts`` (``message_id``), so Slack's late retry of one
already read back is a repeat.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from bus.protocol import ChannelUpdate
from bus.redis_client import RedisAway
from bus.streams import Bus
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.channels.platform import Take
from gateway.channels.untrusted import read_one

log = logging.getLogger("gateway.channels.slack")

SEEN_KEEP_S = 30 * 86_400  # a conversation is read back after a reconnection for this long after its last message
CATCH_UP_CHATS = 20  # the conversations most recently heard in, read back after a reconnection

Read = Callable[[dict[str, Any]], Awaitable[ChannelUpdate | None]]
"""A Slack message event as the kit's update (None: not one for the bot)."""
SaidSince = Callable[[str, str, str], Awaitable[list[dict[str, Any]]]]
"""(channel, thread, last ts) -> the messages said after it there, oldest first."""


def message_id(channel: str, ts: str) -> str:
    """A message's one id, whether it came live, as Slack's retry, or read back from the history."""
    return f"msg:{channel}:{ts}"


def slack_ts(ts: str) -> Decimal:
    """Slack's message timestamp ("1712345678.000200") as a number that orders exactly."""
    try:
        return Decimal(ts)
    except InvalidOperation:
        return Decimal(0)


class CatchUp:
    """Where each conversation was last read to, and reading back from there."""

    def __init__(self, bus: Bus, key: str, read: Read, said_since: SaidSince) -> None:
        self.bus, self.key, self.read, self.said_since = bus, key, read, said_since  # key: a hash, conversation -> mark

    async def mark(self, event: dict[str, Any]) -> None:
        """Where to read a conversation back from after a reconnection: its last message taken."""
        channel, ts = str(event["channel"]), str(event["ts"])
        thread = str(event.get("thread_ts") or "")
        conversation = f"{channel}:{thread}" if thread and thread != ts else channel
        with contextlib.suppress(RedisAway):  # taken already; without the mark only the order is Slack's
            await self.bus.redis.hset(self.key, conversation, f"{ts} {event.get('channel_type') or ''}")

    async def read_back(self, take: Take | None) -> None:
        """The conversations most recently heard in, each read from its last message taken, in order."""
        try:
            marks: dict[bytes, bytes] = await self.bus.redis.hgetall(self.key)  # type: ignore[assignment]
        except RedisAway as exc:
            log.warning("Slack: no catching up (Redis away: %s); Slack's own retries follow", exc)
            return
        known = []
        for raw_conversation, raw_mark in marks.items():
            ts, _, kind = raw_mark.decode().partition(" ")
            known.append((slack_ts(ts), raw_conversation.decode(), ts, kind))
        known.sort(reverse=True)
        cutoff = Decimal(time.time() - SEEN_KEEP_S)
        stale = [c for when, c, _, _ in known if when < cutoff]
        if stale:
            with contextlib.suppress(RedisAway):
                await self.bus.redis.hdel(self.key, *stale)
        for when, conversation, last, kind in known[:CATCH_UP_CHATS]:
            if when < cutoff:
                break
            channel, _, thread = conversation.partition(":")
            try:
                missed = await self.said_since(channel, thread, last)
            except (PlatformAway, PlatformRefused) as exc:  # a rate limit on one is a rate limit on the next
                log.warning("Slack: catching up on %s stopped: %s", conversation, exc)
                return
            for message in missed:
                event = {**message, "type": "message", "channel": channel, "channel_type": kind}
                if event.get("thread_ts") == event["ts"] and event.get("subtype") != "thread_broadcast":
                    del event["thread_ts"]  # a thread's first message: said at the top, as it arrived live
                update = await read_one(event, self.read, what="Slack")
                if take is None or not await take(message_id(channel, str(event["ts"])), update):
                    return  # the bus is away: Slack's own retries bring these
                if update is not None:
                    await self.mark(event)
