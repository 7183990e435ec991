"""Slack through slack_sdk: Socket Mode (or the Events API over HTTP) for events in, the Web API for answers out.

Socket Mode needs no public address: every replica keeps a connection (Slack spreads events over
up to ten), each envelope is written to the inbox once and acknowledged to Slack only then, so an
envelope the bus could not take is delivered again by Slack. The SDK's client pings every few
seconds and follows ``disconnect`` messages; the kit's liveness is what arrives (a frame, the
answer to a ping), and a connection silent past stall_s is replaced.

Order: Slack retries what a dead connection missed on its own schedule, not in the order it was
said. So after each connection the replica first reads back what it missed, in order
(``slack_catch_up.py``); envelopes wait for that, then go in as they arrive.

Conversations: a direct message is one session; in a channel the bot answers when mentioned,
in a thread under the message, and the thread is a session (later messages in a thread the bot
has answered need no mention). Text is Slack's mrkdwn, escaped; approvals are Block Kit buttons,
a press answered to its presser alone (an ephemeral message).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import httpx
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from bus.protocol import ChannelFile, ChannelUpdate
from bus.streams import Bus
from gateway.channels.config import SlackSettings
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.channels.markup import fitted, slack_mrkdwn
from gateway.channels.platform import Hook, Take
from gateway.channels.reply import Buttons
from gateway.channels.slack_catch_up import CatchUp, message_id, slack_ts
from gateway.channels.untrusted import file_of, files_of, read_one

log = logging.getLogger("gateway.channels.slack")

NAME = "slack"
LIMIT = 3000  # characters of a section block's text (a message's text alone may be longer; ours stay under)
THREAD_KEEP_S = 30 * 86_400  # a thread the bot answered in is followed without a mention this long
TIMEOUT_S = 30
CATCH_UP = 200  # messages read back per conversation (pages of 100; Slack's history calls are rate-tiered)
# Errors that say the call will never work as made (anything unknown counts so too: it is logged).
AWAY = {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout",
        "team_added_to_org"}
MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")


@contextlib.asynccontextmanager
async def translated(what: str) -> AsyncIterator[None]:
    """The SDK's errors as the kit's, saying which call failed."""
    try:
        yield
    except SlackApiError as exc:
        response = exc.response
        error = str(response.get("error", "")) if hasattr(response, "get") else ""
        status = getattr(response, "status_code", 0)
        if error == "ratelimited" or status == 429:
            wait = float(response.headers.get("Retry-After", "1")) if hasattr(response, "headers") else 1.0
            raise PlatformAway(f"Slack {what}: rate limited, retry in {wait:g}s", retry_after=wait) from None
        if error in AWAY or status >= 500:
            raise PlatformAway(f"Slack {what}: {error or status}") from None
        raise PlatformRefused(f"Slack {what}: {error or status}") from None
    except (SlackClientError, aiohttp.ClientError, httpx.HTTPError, OSError, TimeoutError) as exc:
        raise PlatformAway(f"Slack {what}: {type(exc).__name__}: {exc}") from None


class Slack:
    """One Slack app's bot. ``limit``, ``edits`` and ``render`` make it a ``reply.Surface``."""

    name = NAME
    limit = LIMIT
    edits = True
    tells_strangers = True

    def __init__(self, settings: SlackSettings, bus: Bus) -> None:
        self.settings, self.bus = settings, bus
        self.web = AsyncWebClient(settings.bot_token.get_secret_value(), base_url=settings.api_url,
                                  timeout=TIMEOUT_S)
        self.bot_id = ""
        self.username = ""
        self._socket: SocketModeClient | None = None
        self._take: Take | None = None
        self._heard = 0.0  # wall clock of the last frame Slack sent (the handshake, hello, an envelope)
        self._in_order = asyncio.Lock()  # envelopes taken one at a time, in the order they came
        self._behind = False  # a connection was made: what it missed is read back before any envelope
        self._catching_up: asyncio.Task[None] | None = None
        self.catch_up = CatchUp(bus, bus.keys.channel_thread(NAME, "seen"), self._message, self._said_since)

    # --- or the Events API: Slack posts signed requests to events_url ---

    @property
    def webhook_url(self) -> str:
        return self.settings.events_url

    @property
    def webhook_listen(self) -> str:
        return self.settings.events_listen

    def webhook_path(self) -> str:
        return urlsplit(self.settings.events_url).path or "/"

    def refusal(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """Slack signs every request with the app's signing secret; one older than five minutes is refused."""
        verifier = SignatureVerifier(self.settings.signing_secret.get_secret_value())
        if not verifier.is_valid(body, headers.get("x-slack-request-timestamp"), headers.get("x-slack-signature")):
            return "not signed with the app's signing secret, or older than five minutes"
        return None

    async def read_hook(self, headers: Mapping[str, str], body: bytes) -> Hook:
        """An event (JSON), a button press (a form's ``payload``), or Slack's url_verification handshake."""
        if headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            payload = json.loads(parse_qs(body.decode())["payload"][0])
            event_id, update = await self.parse("interactive", payload, str(payload.get("trigger_id", "")))
            return Hook(event_id=event_id, update=update)
        data = json.loads(body)
        if data.get("type") == "url_verification":
            return Hook(answer={"challenge": str(data["challenge"])})
        if data.get("type") != "event_callback":
            return Hook(event_id=str(data.get("type")))
        event_id, update = await self.parse("events_api", data, str(data["event_id"]))
        return Hook(event_id=event_id, update=update)

    async def set_webhook(self) -> None:
        """Slack's Request URL is set in the app's settings, not by a call: only the token is checked."""
        await self.webhook_error()

    async def drop_webhook(self) -> None:
        """Nothing to undo: Socket Mode and the Request URL are both the app's settings."""

    async def webhook_error(self) -> str:
        async with translated("auth.test"):
            await self.web.auth_test()
        return ""

    async def start(self) -> None:
        """Ask Slack who the bot is (a wrong token fails here, plainly)."""
        async with translated("auth.test"):
            me = await self.web.auth_test()
        self.bot_id, self.username = str(me["user_id"]), str(me.get("user", ""))

    async def close(self) -> None:
        if self._catching_up is not None:
            self._catching_up.cancel()
        socket, self._socket = self._socket, None
        if socket is not None:
            with contextlib.suppress(Exception):
                await socket.close()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
            with contextlib.suppress(Exception):
                await socket.aiohttp_client_session.close()

    # --- Socket Mode: events in ---

    async def listen(self, take: Take) -> None:
        self._take = take
        socket = SocketModeClient(self.settings.app_token.get_secret_value(), logger=log,
                                  web_client=AsyncWebClient(base_url=self.settings.api_url, timeout=TIMEOUT_S))
        socket.socket_mode_request_listeners.append(self._envelope)
        socket.on_message_listeners.append(self._arrived)
        self._socket = socket
        async with translated("apps.connections.open"):
            socket.wss_uri = await socket.issue_new_wss_url()  # an app token refused fails here, not in a loop
        self._behind = True
        await socket.connect()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
        self._heard = time.time()  # the handshake's answer
        self._catching_up = asyncio.create_task(self._read_back(), name="slack:catch-up")

    async def connected(self) -> bool:
        return self._socket is not None and await self._socket.is_connected()

    async def heard(self) -> float | None:
        socket = self._socket
        if socket is None:
            raise PlatformAway("Slack Socket Mode: not connected")
        # when the last ping Slack answered was sent (the SDK sets its first as the first ping goes: generous
        # by one ping interval, 5 s, once)
        answered = socket.last_ping_pong_time or 0.0
        return max(self._heard, answered) or None

    async def _arrived(self, _: aiohttp.WSMessage) -> None:
        self._heard = time.time()

    async def _envelope(self, client: Any, request: SocketModeRequest) -> None:
        async with self._turn():
            # Not what Slack documents: logged and acknowledged, or Slack would send it again for nothing
            read = await read_one(request, self._parsed, what=f"Slack (an envelope of type {request.type})")
            event_id, update = read or (request.envelope_id, None)
            if self._take is None or not await self._take(event_id, update):
                return  # the bus is away: Slack delivers it again
            if update is not None and request.type == "events_api":
                await self.catch_up.mark(request.payload["event"])
        await client.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))

    # --- reading back what a connection missed ---

    @contextlib.asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        """One envelope's turn at the inbox; the first after a connection reads back what it missed."""
        async with self._in_order:
            if self._behind:
                self._behind = False
                await self.catch_up.read_back(self._take)
            yield

    async def _read_back(self) -> None:
        async with self._turn():
            pass

    async def _said_since(self, channel: str, thread: str, last: str) -> list[dict[str, Any]]:
        """The messages after ``last`` in a channel (its top level) or a thread, oldest first."""
        found: list[dict[str, Any]] = []
        cursor = ""
        async with translated("conversations.replies" if thread else "conversations.history"):
            while len(found) < CATCH_UP:
                if thread:
                    page = await self.web.conversations_replies(channel=channel, ts=thread, oldest=last,
                                                                inclusive=False, limit=100, cursor=cursor or None)
                else:
                    page = await self.web.conversations_history(channel=channel, oldest=last, inclusive=False,
                                                                limit=100, cursor=cursor or None)
                found.extend(m for m in page.get("messages") or [] if isinstance(m, dict))
                cursor = str((page.get("response_metadata") or {}).get("next_cursor") or "")
                if not page.get("has_more") or not cursor:
                    break
        after = slack_ts(last)
        fresh = {str(m["ts"]): m for m in found
                 if "ts" in m and slack_ts(str(m["ts"])) > after and m["ts"] != thread}
        return [fresh[ts] for ts in sorted(fresh, key=slack_ts)]

    async def _parsed(self, request: SocketModeRequest) -> tuple[str, ChannelUpdate | None]:
        return await self.parse(request.type, request.payload, request.envelope_id)

    async def parse(self, kind: str, payload: dict[str, Any], envelope_id: str) -> tuple[str, ChannelUpdate | None]:
        """An envelope's payload: its id (the same on Slack's redeliveries), and what the kit handles of it."""
        if kind == "events_api":
            update = await self._message(payload.get("event") or {})
            return (update.event_id if update is not None else str(payload["event_id"])), update
        if kind == "interactive" and payload.get("type") == "block_actions":
            press_id = str(payload.get("trigger_id") or envelope_id)
            return f"press:{press_id}", self._press(payload, press_id)
        return envelope_id, None  # slash commands, shortcuts, others: not ours to handle

    async def _message(self, event: dict[str, Any]) -> ChannelUpdate | None:
        # app_mention repeats a channel message the message event already brings: only messages are read.
        if event.get("type") != "message" or event.get("subtype") not in (None, "file_share", "thread_broadcast"):
            return None
        user = str(event.get("user") or "")
        if not user or event.get("bot_id") or user == self.bot_id:
            return None
        channel, ts = str(event["channel"]), str(event["ts"])
        thread = str(event.get("thread_ts") or "")
        direct = event.get("channel_type") == "im"
        text = str(event.get("text") or "")
        named = f"<@{self.bot_id}>" in text or f"<@{self.bot_id}|" in text
        text = MENTION.sub(lambda m: "" if m.group(1) == self.bot_id else m.group(0), text)
        text = re.sub(r"[ \t]{2,}", " ", text).strip()
        if direct:
            chat = f"{channel}:{thread}" if thread else channel
            mentioned = True
        else:
            chat = f"{channel}:{thread or ts}"
            mentioned = named or (bool(thread) and await self._following(channel, thread))
        return ChannelUpdate(channel=NAME, event_id=message_id(channel, ts), user=user, chat=chat, group=not direct,
                             text=_unescaped(text)[:64_000], mentioned=mentioned, files=_files(event),
                             platform_message=ts)

    def _press(self, payload: dict[str, Any], press_id: str) -> ChannelUpdate | None:
        actions = payload.get("actions") or []
        channel = str((payload.get("channel") or {}).get("id") or payload["container"]["channel_id"])
        message = payload.get("message") or {}
        ts = str(payload.get("container", {}).get("message_ts") or message.get("ts") or "")
        thread = str(message.get("thread_ts") or "")
        user = str(payload["user"]["id"])
        if not actions:
            return None
        return ChannelUpdate(channel=NAME, event_id=f"press:{press_id}", user=user,
                             username=str(payload["user"].get("username") or ""),
                             chat=f"{channel}:{thread}" if thread else channel, group=not channel.startswith("D"),
                             press=f"{channel}:{user}", data=str(actions[0].get("value") or "")[:256],
                             platform_message=ts)

    async def _following(self, channel: str, thread: str) -> bool:
        return bool(await self.bus.redis.exists(self.bus.keys.channel_thread(NAME, f"{channel}:{thread}")))

    # --- the Surface a turn is shown on ---

    def render(self, text: str) -> list[str]:
        return fitted(text, LIMIT, slack_mrkdwn)

    async def send(self, chat: str, rendered: str, *, buttons: Buttons = ()) -> str:
        channel, _, thread = chat.partition(":")
        async with translated("chat.postMessage"):
            sent = await self.web.chat_postMessage(channel=channel, thread_ts=thread or None, text=rendered,
                                                   blocks=_blocks(rendered, buttons), unfurl_links=False,
                                                   unfurl_media=False)
        if thread:  # a thread the bot speaks in is followed without a mention
            await self.bus.redis.set(self.bus.keys.channel_thread(NAME, chat), "1", ex=THREAD_KEEP_S)
        return str(sent["ts"])

    async def edit(self, chat: str, message: str, rendered: str, *, buttons: Buttons = ()) -> None:
        channel = chat.partition(":")[0]
        async with translated("chat.update"):
            await self.web.chat_update(channel=channel, ts=message, text=rendered, blocks=_blocks(rendered, buttons))

    async def typing(self, chat: str) -> None:
        """Slack's Web API has no typing indicator for bots; the streamed message shows the work instead."""

    async def answer_press(self, press: str, text: str) -> None:
        channel, _, user = press.partition(":")
        async with translated("chat.postEphemeral"):
            await self.web.chat_postEphemeral(channel=channel, user=user, text=slack_mrkdwn(text[:LIMIT]))

    async def fetch_file(self, file: ChannelFile, limit: int) -> bytes:
        if file.size > limit:
            raise PlatformRefused(f"{file.name or 'the file'} is {file.size} bytes, over the {limit} allowed "
                                  "(channels.slack.max_file_bytes)")
        host = urlsplit(file.ref).hostname or ""
        allowed = {*self.settings.file_hosts, urlsplit(self.settings.api_url).hostname or ""}
        if urlsplit(file.ref).scheme not in ("https", "http") or host not in allowed:
            # the bot's token goes with the request: never to a host that is not Slack's
            raise PlatformRefused(f"{file.name}: its address is not on a Slack file host "
                                  "(channels.slack.file_hosts)")
        token = self.settings.bot_token.get_secret_value()
        headers = {"Authorization": f"Bearer {token}"}
        async with (translated("a file's download"), httpx.AsyncClient(timeout=TIMEOUT_S) as http,
                    http.stream("GET", file.ref, headers=headers) as response):
            if response.status_code == 429 or response.status_code >= 500:
                raise PlatformAway(f"Slack file download: HTTP {response.status_code}")
            if response.status_code != 200:
                raise PlatformRefused(f"{file.name}: Slack answered HTTP {response.status_code}")
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > limit:
                    raise PlatformRefused(f"{file.name or 'the file'} is over the {limit} bytes allowed")
        return bytes(data)

    async def send_file(self, chat: str, name: str, data: bytes) -> None:
        channel, _, thread = chat.partition(":")
        async with translated("files.upload"):
            await self.web.files_upload_v2(channel=channel, thread_ts=thread or None, content=data,
                                           filename=name, title=name)


def _blocks(rendered: str, buttons: Buttons) -> list[dict[str, Any]]:
    """The text as a section; buttons, if any, as an actions block. No buttons: no blocks (an edit with
    an empty list takes a question's buttons away once it is answered)."""
    if not buttons:
        return []
    elements = [{"type": "button", "text": {"type": "plain_text", "text": label[:75]}, "value": data,
                 "action_id": f"pincer-{index}"}
                for index, (label, data) in enumerate(item for row in buttons for item in row)]
    return [{"type": "section", "text": {"type": "mrkdwn", "text": rendered or " "}},
            {"type": "actions", "elements": elements[:25]}]


def _files(event: dict[str, Any]) -> list[ChannelFile]:
    described = event.get("files")
    return files_of(file_of(file.get("url_private_download") or file.get("url_private"),
                            file.get("name") or file.get("id"), file.get("size"), file.get("mimetype"))
                    for file in (described if isinstance(described, list) else []) if isinstance(file, dict))


def _unescaped(text: str) -> str:
    """Slack escapes &, < and > in what people write; the agent reads what they typed."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def platform(settings: SlackSettings, bus: Bus, *, data_dir: Path, instance_id: str) -> Slack:
    """The channel's platform, as ``pincer channel slack`` opens it."""
    return Slack(settings, bus)
