"""What a chat platform's module offers the channel kit, and its calls made patient with an outage."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from bus.protocol import ChannelFile, ChannelUpdate
from gateway.channels.errors import PlatformAway
from gateway.channels.reply import Buttons, Surface

log = logging.getLogger("gateway.channels")

RETRY_DELAYS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
PATIENCE_S = 300.0  # how long a message waits out a platform that is away before it is given up
T = TypeVar("T")


class Platform(Surface, Protocol):
    """What a channel module offers the kit (gateway/channels/telegram.py is one)."""

    name: str
    bot_id: str
    username: str
    tells_strangers: bool  # a stranger is told their pairing code (else it is only logged: email's forged senders)

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def answer_press(self, press: str, text: str) -> None: ...
    async def fetch_file(self, file: ChannelFile, limit: int) -> bytes: ...
    async def send_file(self, chat: str, name: str, data: bytes) -> None: ...


@runtime_checkable
class Invited(Protocol):
    """A platform where people ask the bot into a conversation (Matrix's invites)."""

    async def accept_invite(self, chat: str, accept: bool) -> None: ...


@runtime_checkable
class Polled(Protocol):
    """A platform read by polling from an offset (Telegram's getUpdates, IMAP's UIDs)."""

    async def poll(self, offset: str) -> tuple[str, list[ChannelUpdate]]: ...


Take = Callable[[str, ChannelUpdate | None], Awaitable[bool]]  # (event id, update) -> stored (then acknowledge)


@runtime_checkable
class Listening(Protocol):
    """A platform that pushes its events over a connection it keeps (Slack's Socket Mode, Discord's gateway)
    instead of being polled: each event is handed to ``take`` and acknowledged to the platform only once
    ``take`` says the bus holds it (a platform redelivers what was not acknowledged)."""

    async def listen(self, take: Take) -> None: ...  # returns once connected; the connection is kept
    async def connected(self) -> bool: ...


@runtime_checkable
class Heard(Protocol):
    """A listening platform that can say when the last thing arrived on its connection (an event, a heartbeat's
    answer): its liveness is that progress, never the library's own idea of being connected."""

    async def heard(self) -> float | None: ...  # wall clock of the last arrival (None: nothing yet); PlatformAway: gone


@runtime_checkable
class Webhooked(Protocol):
    """A platform that can push its updates to a webhook instead (Telegram's webhook, Slack's Events API)."""

    name: str
    webhook_url: str  # empty: not by webhook
    webhook_listen: str  # host:port the webhook is served on

    def webhook_path(self) -> str: ...
    def refusal(self, headers: Mapping[str, str], body: bytes) -> str | None: ...  # why it is not the platform's
    async def read_hook(self, headers: Mapping[str, str], body: bytes) -> Hook: ...  # ValueError: not an event
    async def set_webhook(self) -> None: ...
    async def drop_webhook(self) -> None: ...
    async def webhook_error(self) -> str: ...


@dataclass
class Hook:
    """What a webhook request carries: an event (its id, and what the kit handles of it), or a handshake the
    platform wants answered at once (Slack's url_verification)."""

    event_id: str = ""
    update: ChannelUpdate | None = None
    answer: dict[str, Any] | None = None


def backoff(failures: int, said: float | None = None, *, jitter: bool = False) -> float:
    """The wait after ``failures`` failures in a row: what the platform said (``retry_after``), else the
    next step of RETRY_DELAYS, its last repeated; jitter takes a random half off, so that replicas that
    lost one platform together do not all come back at once."""
    if said:
        return said
    delay = RETRY_DELAYS[min(failures, len(RETRY_DELAYS) - 1)]
    return delay * random.uniform(0.5, 1.0) if jitter else delay


async def patiently(call: Callable[[], Awaitable[T]], *, what: str, within_s: float = PATIENCE_S) -> T:
    """``call()``, again while the platform is away (after its retry_after, else with backoff), for up to
    ``within_s``; then its last error."""
    deadline = time.monotonic() + within_s
    for attempt in range(1_000):
        try:
            return await call()
        except PlatformAway as exc:
            wait = backoff(attempt, exc.retry_after)
            if time.monotonic() + wait > deadline:
                raise
            log.warning("%s: %s; again in %.1fs", what, exc, wait)
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")


class Patient:
    """A platform whose sends and edits wait out an outage (a Surface for ``StreamedReply``)."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.limit, self.edits = platform.limit, platform.edits

    def render(self, text: str) -> list[str]:
        return self.platform.render(text)

    async def send(self, chat: str, rendered: str, *, buttons: Buttons = ()) -> str:
        return await patiently(lambda: self.platform.send(chat, rendered, buttons=buttons), what="send")

    async def edit(self, chat: str, message: str, rendered: str, *, buttons: Buttons = ()) -> None:
        await patiently(lambda: self.platform.edit(chat, message, rendered, buttons=buttons), what="edit")

    async def typing(self, chat: str) -> None:
        await self.platform.typing(chat)  # once: a missed indicator is not worth waiting for
