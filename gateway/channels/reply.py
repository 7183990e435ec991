"""A turn shown in a chat: one message edited as the answer streams in, tool calls as short lines, the answer
split where the platform's length limit demands.

Edits go out at most once per ``edit_interval_s`` (platforms rate-limit them); the final text
replaces whatever was streamed. Which platform message shows the answer is kept in Redis under
the incoming event (``Delivery``), so a channel restarted mid-turn edits that message rather than
send the answer a second time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from bus.protocol import ChatTool
from bus.streams import Bus

log = logging.getLogger("gateway.channels")

DELIVERY_KEEP_S = 7 * 86_400  # an event's delivery record outlives any redelivery of it
TYPING_EVERY_S = 4.0  # Telegram shows "typing" for 5 s after each call


Buttons = Sequence[Sequence[tuple[str, str]]]  # rows of (label, data)


class Surface(Protocol):
    """What a platform offers a turn: messages sent and edited in one chat, and a typing indicator."""

    limit: int  # characters in one message, once rendered
    edits: bool  # a sent message can be edited (else the answer is sent once, whole: email)

    def render(self, text: str) -> list[str]: ...
    async def send(self, chat: str, rendered: str, *, buttons: Buttons = ()) -> str: ...
    async def edit(self, chat: str, message: str, rendered: str, *, buttons: Buttons = ()) -> None: ...
    async def typing(self, chat: str) -> None: ...


class Delivery:
    """What an incoming event led to, in Redis: its turn's message id, the message showing it, whether done."""

    def __init__(self, bus: Bus, channel: str, event_id: str) -> None:
        self.bus, self.key = bus, bus.keys.channel_delivery(channel, event_id)

    async def read(self) -> dict[str, str]:
        raw: dict[bytes, bytes] = await self.bus.redis.hgetall(self.key)  # type: ignore[assignment]  # bytes
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def note(self, **fields: str) -> None:
        async with self.bus.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.key, mapping=dict[str | bytes, str](fields))  # type: ignore[arg-type]  # invariant Mapping
            pipe.expire(self.key, DELIVERY_KEEP_S)
            await pipe.execute()


class StreamedReply:
    def __init__(self, surface: Surface, chat: str, delivery: Delivery, *, edit_interval_s: float,
                 shown: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.surface, self.chat, self.delivery = surface, chat, delivery
        self.edit_interval_s, self.clock = edit_interval_s, clock
        self.shown = shown  # the platform message that shows the answer, once sent
        self.text = ""
        self.tools: dict[str, str] = {}  # call id -> its line
        self._last_edit = 0.0
        self._dirty = False
        self._flusher: asyncio.Task[None] | None = None
        self._typing: asyncio.Task[None] | None = None

    def start_typing(self) -> None:
        self._typing = asyncio.get_running_loop().create_task(self._keep_typing())

    async def _keep_typing(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a missed indicator is not worth a failed turn
                await self.surface.typing(self.chat)
            await asyncio.sleep(TYPING_EVERY_S)

    def delta(self, text: str) -> None:
        self.text += text
        self._changed()

    def tool(self, event: ChatTool) -> None:
        if event.status == "started":
            nested = "  ↳ " if event.parent_call_id else ""  # a sub-agent's call, under its delegate line
            self.tools[event.call_id] = f"{nested}⚙ {event.tool} {event.summary}".rstrip()
        elif event.status == "finished":
            mark = "✓" if event.error_code is None else f"✗ {event.error_code}"
            self.tools[event.call_id] = f"{self.tools.get(event.call_id, '⚙ ' + event.tool)} {mark}"
        self._changed()

    def _body(self, answer: str) -> str:
        lines = "\n".join(self.tools.values())
        return f"{lines}\n\n{answer}".strip() if lines else answer

    def _changed(self) -> None:
        if not self.surface.edits:
            return  # nothing is shown until the answer is whole
        self._dirty = True
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        wait = self._last_edit + self.edit_interval_s - self.clock()
        if wait > 0:
            await asyncio.sleep(wait)
        if not self._dirty:
            return
        self._dirty = False
        body = self._body(self.text or "…")
        first = self.surface.render(body)[0]
        try:
            await self._show(first)
        except Exception as exc:  # a streamed edit that failed is redone by the next one, or the final
            log.warning("streamed edit failed in chat %s: %s", self.chat, exc)
        self._last_edit = self.clock()

    async def _show(self, rendered: str, buttons: Buttons = ()) -> None:
        if self.shown is None:
            self.shown = await self.surface.send(self.chat, rendered, buttons=buttons)
            await self.delivery.note(shown=self.shown)
        else:
            await self.surface.edit(self.chat, self.shown, rendered, buttons=buttons)

    async def finish(self, answer: str) -> None:
        """The answer, whole: the streamed message becomes its first piece, the rest follow as new messages."""
        await self._stop()
        pieces = self.surface.render(self._body(answer) or "(no answer)")
        await self._show(pieces[0])
        for piece in pieces[1:]:
            await self.surface.send(self.chat, piece)

    async def _stop(self) -> None:
        for task in (self._typing, self._flusher):
            if task is not None and not task.done():
                if task is self._flusher:
                    with contextlib.suppress(Exception):
                        await task  # an edit under way ends before the final one, never after it
                else:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    async def abandon(self) -> None:
        await self._stop()
