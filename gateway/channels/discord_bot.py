"""Discord through discord.py: the gateway connection (heartbeats, resume, reconnect, rate limits are the
library's) and its REST calls, as the kit's platform.

Every replica keeps a gateway connection. Discord's gateway has no acknowledgement and does not
replay what happened while no session was alive, so after each (re)connection the channel reads
each conversation it knows from the last message it took onward (its history, by REST): messages
said while it was down are taken then, once (by message id). Button presses (interactions) are
acknowledged to Discord once the bus holds them; Discord does not deliver one again, so a press
made while the bus was away fails for the person, who presses again.

A direct message is one session; in a server the bot answers when mentioned or replied to, and
a thread is a session of its own (followed without a mention once the bot spoke there).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import discord
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

from bus.protocol import ChannelFile, ChannelUpdate
from bus.streams import Bus
from gateway.channels.config import DiscordSettings
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.channels.markup import fitted, plain_links
from gateway.channels.platform import Take
from gateway.channels.reply import Buttons
from gateway.channels.untrusted import file_of, files_of, read_one

log = logging.getLogger("gateway.channels.discord")

NAME = "discord"
LIMIT = 2000  # characters of a message's content
THREAD_KEEP_S = 30 * 86_400
SEEN_KEEP_S = 30 * 86_400  # a conversation is caught up on after a restart for this long
READY_S = 60.0  # the gateway's READY (and the catch-up) within this long, or the connection is made afresh
CATCH_UP = 100  # messages read back per conversation after a reconnection


@contextlib.asynccontextmanager
async def translated(what: str) -> AsyncIterator[None]:
    """discord.py's errors as the kit's, saying which call failed (rate limits are waited out by discord.py)."""
    try:
        yield
    except discord.LoginFailure:
        raise PlatformRefused(f"Discord {what}: the bot token was refused") from None
    except discord.PrivilegedIntentsRequired:
        raise PlatformRefused(f"Discord {what}: turn on the Message Content intent on the application's Bot "
                              "page") from None
    except discord.DiscordServerError as exc:
        raise PlatformAway(f"Discord {what}: {exc.status} {exc.text}") from None
    except discord.HTTPException as exc:
        if exc.status in (408, 429):
            raise PlatformAway(f"Discord {what}: {exc.status} {exc.text}") from None
        raise PlatformRefused(f"Discord {what}: {exc.status} {exc.text or exc}") from None
    except (discord.DiscordException, aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise PlatformAway(f"Discord {what}: {type(exc).__name__}: {exc}") from None


class Discord:
    """One bot's connection and calls. ``limit``, ``edits`` and ``render`` make it a ``reply.Surface``."""

    name = NAME
    limit = LIMIT
    edits = True
    tells_strangers = True

    def __init__(self, settings: DiscordSettings, bus: Bus) -> None:
        self.settings, self.bus = settings, bus
        # discord.py reads its REST root from a class attribute: this process runs one bot, on one API.
        Route.BASE = settings.api_url
        self.bot_id = ""
        self.username = ""
        self._client: discord.Client | None = None
        self._runner: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._take: Take | None = None
        self._heard = 0.0  # wall clock of the last frame the gateway sent (an event, a heartbeat's ACK)

    def _new_client(self) -> discord.Client:
        intents = discord.Intents.default()
        intents.message_content = True  # privileged: turned on for the application (docs/channels/discord.md)
        # enable_debug_events: every frame the gateway sends is dispatched (on_socket_raw_receive), which is
        # what liveness is measured by; the library's own state flags say nothing of a connection gone quiet.
        client = discord.Client(intents=intents, max_messages=None, chunk_guilds_at_startup=False,
                                enable_debug_events=True)
        client.event(self.on_socket_raw_receive)
        client.event(self.on_ready)
        client.event(self.on_resumed)
        client.event(self.on_message)
        client.event(self.on_interaction)
        return client

    async def start(self) -> None:
        """Log in (a wrong token fails here, plainly) and learn who the bot is."""
        client = self._new_client()
        async with translated("login"):
            await client.login(self.settings.bot_token.get_secret_value())
            _, gateway, _ = await client.http.get_bot_gateway()
        # As with Route.BASE: discord.py connects to a class attribute's address; the API says which.
        DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway)
        assert client.user is not None
        self.bot_id, self.username = str(client.user.id), client.user.name
        self._client = client

    async def close(self) -> None:
        client, self._client = self._client, None
        runner, self._runner = self._runner, None
        self._ready.clear()
        self._heard = 0.0
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        if runner is not None:
            runner.cancel()
            with contextlib.suppress(BaseException):
                await runner

    # --- the gateway: events in ---

    async def listen(self, take: Take) -> None:
        self._take = take
        if self._client is None or self._client.is_closed():
            await self.close()
            await self.start()
        client = self._client
        assert client is not None
        self._ready.clear()
        runner = self._runner = asyncio.create_task(self._connect(client), name="discord:gateway")
        ready = asyncio.create_task(self._ready.wait())
        try:
            await asyncio.wait({ready, runner}, timeout=READY_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if not self._ready.is_set():
            raise PlatformAway("Discord gateway: the connection failed" if runner.done()
                               else f"Discord gateway: no READY within {READY_S:g}s")

    async def _connect(self, client: discord.Client) -> None:
        """The gateway until it fails. The library resumes its session when Discord asks it to (RECONNECT, a
        resumable close) but never retries a failed connection on its own backoff: the kit makes it afresh
        on its own (gateway/channels/intake.py), whatever the library's backoff has grown to."""
        try:
            await client.connect(reconnect=False)
        except (discord.LoginFailure, discord.PrivilegedIntentsRequired) as exc:
            log.error("Discord gateway refused: %s", exc)
        except (OSError, aiohttp.ClientError, discord.ConnectionClosed, discord.GatewayNotFound,
                discord.HTTPException, TimeoutError) as exc:
            log.warning("Discord gateway lost: %s", exc or type(exc).__name__)
        except Exception:
            log.exception("Discord gateway ended")

    async def connected(self) -> bool:
        client = self._client
        return client is not None and client.is_ready() and not client.is_closed() and self._ready.is_set()

    async def heard(self) -> float | None:
        if self._runner is not None and self._runner.done():  # the connection failed and the library gave up
            raise PlatformAway("Discord gateway: the connection ended")
        return self._heard or None

    async def on_socket_raw_receive(self, frame: str) -> None:
        self._heard = time.time()

    async def on_ready(self) -> None:
        await self._catch_up()
        self._ready.set()

    async def on_resumed(self) -> None:
        await self._catch_up()

    async def on_message(self, message: discord.Message) -> None:
        await self._took(message)

    async def _took(self, message: discord.Message) -> bool:
        update = await read_one(message, self._update, what="Discord")
        if self._take is None or not await self._take(str(message.id), update):
            return False
        if update is not None:  # where to read on from after a reconnection
            await self.bus.redis.set(self._seen_key(update.chat), str(message.id), ex=SEEN_KEEP_S)
            await self.bus.redis.sadd(self._seen_key("*"), update.chat)
        return True

    def _seen_key(self, chat: str) -> str:
        return self.bus.keys.channel_thread(NAME, f"seen:{chat}")

    async def _catch_up(self) -> None:
        """What was said in the conversations the bot knows while no connection was alive (Discord does not
        replay it), read back from each one's last message taken."""
        client = self._client
        if client is None:
            return
        chats: set[bytes] = await self.bus.redis.smembers(self._seen_key("*"))  # type: ignore[assignment]
        for raw in chats:
            chat = raw.decode()
            last = await self.bus.redis.get(self._seen_key(chat))
            if last is None:  # quiet for SEEN_KEEP_S: not caught up on, nor kept in the set for ever
                await self.bus.redis.srem(self._seen_key("*"), chat)
                continue
            channel = client.get_partial_messageable(int(chat))
            try:
                async for message in channel.history(limit=CATCH_UP, after=discord.Object(int(last)),
                                                     oldest_first=True):
                    if not await self._took(message):
                        return  # the bus is away: the next reconnection reads these again
            except (discord.HTTPException, aiohttp.ClientError, OSError, TimeoutError) as exc:
                log.warning("Discord: catching up on %s failed: %s", chat, exc)

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        if interaction.type is not discord.InteractionType.component or self._take is None:
            return
        data: dict[str, Any] = dict(interaction.data or {})
        channel = interaction.channel_id or 0
        user = interaction.user
        message = interaction.message
        update = ChannelUpdate(channel=NAME, event_id=f"press:{interaction.id}", user=str(user.id),
                               username=user.name, chat=str(channel), group=interaction.guild_id is not None,
                               press=f"{interaction.application_id}:{interaction.token}",
                               data=str(data.get("custom_id", ""))[:256],
                               platform_message=str(message.id) if message is not None else "")
        if await self._take(update.event_id, update):
            with contextlib.suppress(discord.HTTPException):
                await interaction.response.defer()  # within Discord's 3 s; the answer follows

    async def _update(self, message: discord.Message) -> ChannelUpdate | None:
        author = message.author
        if author.bot or str(author.id) == self.bot_id or message.type not in (discord.MessageType.default,
                                                                               discord.MessageType.reply):
            return None
        direct = message.guild is None and getattr(message.channel, "guild_id", None) is None
        chat = str(message.channel.id)
        me = f"<@{self.bot_id}>"
        text = message.content.replace(me, "").replace(f"<@!{self.bot_id}>", "")
        text = re.sub(r"[ \t]{2,}", " ", text).strip()
        replied = message.reference is not None and isinstance(message.reference.resolved, discord.Message) \
            and str(message.reference.resolved.author.id) == self.bot_id
        named = any(str(user.id) == self.bot_id for user in message.mentions) or me in message.content
        thread = isinstance(message.channel, discord.Thread)
        if thread and (named or replied):  # a thread the bot is called into is followed from then on
            await self.bus.redis.set(self.bus.keys.channel_thread(NAME, f"thread:{chat}"), "1", ex=THREAD_KEEP_S)
        mentioned = direct or named or replied or (thread and await self._following(chat))
        files = files_of(file_of(a.url, a.filename, a.size, a.content_type) for a in message.attachments)
        return ChannelUpdate(channel=NAME, event_id=str(message.id), user=str(author.id), username=author.name,
                             chat=chat, group=not direct, text=text[:64_000], mentioned=mentioned, files=files,
                             platform_message=str(message.id))

    async def _following(self, chat: str) -> bool:
        return bool(await self.bus.redis.exists(self.bus.keys.channel_thread(NAME, f"thread:{chat}")))

    # --- REST: the Surface a turn is shown on ---

    def _channel(self, chat: str) -> discord.PartialMessageable:
        if self._client is None:
            raise PlatformAway("Discord: not connected")
        return self._client.get_partial_messageable(int(chat))

    def render(self, text: str) -> list[str]:
        return fitted(text, LIMIT, markdown)

    async def send(self, chat: str, rendered: str, *, buttons: Buttons = ()) -> str:
        channel = self._channel(chat)
        view = _view(buttons)
        async with translated("send a message"):
            if view is None:
                sent = await channel.send(rendered, allowed_mentions=discord.AllowedMentions.none())
            else:
                sent = await channel.send(rendered, view=view, allowed_mentions=discord.AllowedMentions.none())
        return str(sent.id)

    async def edit(self, chat: str, message: str, rendered: str, *, buttons: Buttons = ()) -> None:
        partial = self._channel(chat).get_partial_message(int(message))
        async with translated("edit a message"):
            await partial.edit(content=rendered, view=_view(buttons), allowed_mentions=discord.AllowedMentions.none())

    async def typing(self, chat: str) -> None:
        async with translated("typing"):
            await self._channel(chat).typing()

    async def answer_press(self, press: str, text: str) -> None:
        """A press is answered to its presser alone (an ephemeral follow-up of the interaction)."""
        application, _, token = press.partition(":")
        if self._client is None:
            raise PlatformAway("Discord: not connected")
        route = Route("POST", "/webhooks/{webhook_id}/{webhook_token}", webhook_id=application, webhook_token=token)
        async with translated("answer a press"):
            await self._client.http.request(route, json={"content": text[:LIMIT], "flags": 64,
                                                         "allowed_mentions": {"parse": []}})

    async def fetch_file(self, file: ChannelFile, limit: int) -> bytes:
        if file.size > limit:
            raise PlatformRefused(f"{file.name or 'the file'} is {file.size} bytes, over the {limit} allowed "
                                  "(channels.discord.max_file_bytes)")
        url = urlsplit(file.ref)
        if url.scheme not in ("https", "http") or url.hostname not in self.settings.file_hosts:
            raise PlatformRefused(f"{file.name}: its address is not on a Discord file host "
                                  "(channels.discord.file_hosts)")
        if self._client is None:
            raise PlatformAway("Discord: not connected")
        async with translated("fetch a file"):
            data = await self._client.http.get_from_cdn(file.ref)
        if len(data) > limit:
            raise PlatformRefused(f"{file.name or 'the file'} is over the {limit} bytes allowed")
        return data

    async def send_file(self, chat: str, name: str, data: bytes) -> None:
        async with translated("send a file"):
            await self._channel(chat).send(file=discord.File(io.BytesIO(data), filename=name))


def markdown(text: str) -> str:
    """The model's Markdown as Discord shows it: links plain (no masked link hides where it goes), mentions
    and @everyone/@here broken (nothing the model writes pings anyone, or looks as if it did)."""
    return discord.utils.escape_mentions(plain_links(text))


def _view(buttons: Buttons) -> discord.ui.View | None:
    """Buttons as a message's components (no callbacks: a press reaches the kit as an interaction)."""
    if not buttons:
        return None
    view = discord.ui.View(timeout=None)
    for row, items in enumerate(buttons):
        for label, data in items:
            style = discord.ButtonStyle.danger if data.endswith(":d") else discord.ButtonStyle.primary
            view.add_item(discord.ui.Button(label=label[:80], custom_id=data[:100], style=style, row=row))
    return view


def platform(settings: DiscordSettings, bus: Bus, *, data_dir: Path, instance_id: str) -> Discord:
    """The channel's platform, as ``pincer channel discord`` opens it."""
    return Discord(settings, bus)
