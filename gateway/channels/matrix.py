"""Matrix through matrix-nio: the platform calls of the Matrix channel, on any homeserver.

The kit's offset is the sync's ``next_batch`` token, stored only once the bus holds what the sync
brought, so a channel killed mid-sync syncs the same events again and the delivery record keeps
each answered once. The first sync of a new bot only learns where "now" is (and the invitations
waiting): history in its rooms is not answered.

A room is a conversation (per person, as everywhere in the kit); in a room of more than two the
bot answers when mentioned (``m.mentions``, its id or name in the text, a reply to it). Invitations
are the kit's to accept or decline (only from people who may talk to the agent). Answers stream by
edits (``m.replace``); an approval is asked as a message the bot reacts to with its choices, and
a person's reaction (or a reply with the choice's word) answers it. Encrypted rooms are declined
with a notice: the channel has no end-to-end encryption (docs/channels/matrix.md says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import html
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import nio

from bus.protocol import ChannelFile, ChannelUpdate
from bus.streams import Bus
from gateway.channels.config import MatrixSettings
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.channels.markup import fitted
from gateway.channels.questions import Questions, first_word_choices
from gateway.channels.reply import Buttons

log = logging.getLogger("gateway.channels.matrix")

NAME = "matrix"
TIMELINE_LIMIT = 100  # events a sync brings per room; a busier room says "limited" and is logged
# A sync brings what the kit reads and what nio needs to know the rooms (their members, encryption).
FILTER = {"presence": {"not_types": ["*"]}, "account_data": {"not_types": ["*"]},
          "room": {"timeline": {"limit": TIMELINE_LIMIT}, "state": {"lazy_load_members": True},
                   "ephemeral": {"not_types": ["*"]}, "account_data": {"not_types": ["*"]}}}
REACTIONS = {"allow once": "✅", "always": "🔁", "deny": "❌"}
REFUSED = {"M_UNKNOWN_TOKEN", "M_MISSING_TOKEN", "M_FORBIDDEN", "M_NOT_FOUND", "M_TOO_LARGE", "M_BAD_JSON",
           "M_NOT_JSON", "M_UNRECOGNIZED", "M_USER_DEACTIVATED", "M_INVALID_PARAM"}
ENCRYPTED_NOTICE = ("This room is end-to-end encrypted, and this agent cannot read encrypted rooms. "
                    "Talk to it in an unencrypted room (or direct chat without encryption).")
IDENTITY_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$")


def checked(response: Any, what: str) -> Any:
    """A response, or the kit's error for an error response (nio returns errors rather than raising)."""
    if not isinstance(response, nio.ErrorResponse):
        return response
    code = str(response.status_code or "")
    said = f"Matrix {what}: {code} {response.message or ''}".strip()
    if code == "M_LIMIT_EXCEEDED":
        raise PlatformAway(said, retry_after=(response.retry_after_ms or 1000) / 1000)
    if code in REFUSED:
        raise PlatformRefused(said)
    raise PlatformAway(said)


@contextlib.asynccontextmanager
async def translated(what: str) -> AsyncIterator[None]:
    try:
        yield
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise PlatformAway(f"Matrix {what}: {type(exc).__name__}: {exc}") from None


def user_key(matrix_id: str) -> str:
    """A Matrix user as the kit's user id (it becomes ``matrix:<it>``): ``alice@example.org``."""
    local, _, server = matrix_id.removeprefix("@").partition(":")
    key = f"{local}@{server}"
    return key if IDENTITY_SAFE.match(key) else "h" + hashlib.sha256(matrix_id.encode()).hexdigest()[:24]


class Matrix:
    """One Matrix account's calls. ``limit``, ``edits`` and ``render`` make it a ``reply.Surface``."""

    name = NAME
    edits = True
    tells_strangers = True

    def __init__(self, settings: MatrixSettings, bus: Bus) -> None:
        self.settings, self.bus = settings, bus
        self.limit = settings.max_message_chars
        config = nio.AsyncClientConfig(store_sync_tokens=False, encryption_enabled=False, max_limit_exceeded=0,
                                       max_timeouts=0, request_timeout=30)
        self.client = nio.AsyncClient(settings.homeserver, user=settings.user_id, config=config)
        self.client.access_token = settings.access_token.get_secret_value()
        self.client.user_id = settings.user_id
        self.questions = Questions(bus, NAME)
        self.bot_id = ""
        self.username = ""

    async def start(self) -> None:
        """Ask the homeserver whose token this is (a wrong token fails here, plainly)."""
        async with translated("whoami"):
            me = checked(await self.client.whoami(), "whoami")
        if me.user_id != self.settings.user_id:
            raise PlatformRefused(f"the access token is {me.user_id}'s, not {self.settings.user_id}'s "
                                  "(channels.matrix.user_id)")
        self.client.device_id = me.device_id
        self.bot_id = self.username = me.user_id

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.close()

    # --- reading: the sync ---

    async def poll(self, offset: str) -> tuple[str, list[ChannelUpdate]]:
        wait_ms = self.settings.poll_timeout_s * 1000 if offset else 0
        async with translated("sync"):
            sync = checked(await self.client.sync(timeout=wait_ms, since=offset or None, sync_filter=FILTER,
                                                  full_state=not offset), "sync")
        updates = [u for u in (self._invitation(room_id, room) for room_id, room in sync.rooms.invite.items()) if u]
        if offset:  # the first sync only finds "now": what is already in the rooms is history
            for room_id, room in sync.rooms.join.items():
                if room.timeline.limited:
                    log.warning("Matrix: room %s had more than %d new events; older ones were not read",
                                room_id, TIMELINE_LIMIT)
                for event in room.timeline.events:
                    update = await self._update(room_id, event.source)
                    if update is not None:
                        updates.append(update)
        return str(sync.next_batch), updates

    def _invitation(self, room_id: str, room: Any) -> ChannelUpdate | None:
        for event in room.invite_state:  # nio's own events (it takes the content out of their source)
            if (isinstance(event, nio.InviteMemberEvent) and event.state_key == self.bot_id
                    and event.membership == "invite"):
                inviter = str(event.sender)
                return ChannelUpdate(channel=NAME, event_id=f"invite:{room_id}:{inviter}", user=user_key(inviter),
                                     username=inviter.removeprefix("@"), chat=room_id, invite=True)
        return None

    async def _update(self, room_id: str, source: dict[str, Any]) -> ChannelUpdate | None:
        sender = str(source.get("sender") or "")
        kind = source.get("type")
        if not sender or sender == self.bot_id:
            return None
        if kind == "m.room.encrypted":
            await self._decline_encrypted(room_id)
            return None
        content = source.get("content") or {}
        relates = content.get("m.relates_to") or {}
        base = ChannelUpdate(channel=NAME, event_id=str(source["event_id"]), user=user_key(sender),
                             username=sender.removeprefix("@"), chat=room_id, group=self._group(room_id),
                             platform_message=str(source["event_id"]))
        if kind == "m.reaction" and relates.get("rel_type") == "m.annotation":
            data = await self.questions.answer(str(relates.get("event_id", "")), str(relates.get("key", "")))
            return base.model_copy(update={"press": room_id, "data": data}) if data else None
        if kind != "m.room.message" or relates.get("rel_type") == "m.replace":  # edits are not new words
            return None
        msgtype = content.get("msgtype")
        text = _without_reply_fallback(str(content.get("body") or ""))
        replied = str((relates.get("m.in_reply_to") or {}).get("event_id") or "")
        if replied:
            data = await self.questions.answer(replied, text.split("\n")[0])
            if data:
                return base.model_copy(update={"press": room_id, "data": data})
        files: list[ChannelFile] = []
        if msgtype in ("m.file", "m.image", "m.audio", "m.video") and str(content.get("url", "")).startswith("mxc://"):
            info = content.get("info") or {}
            files = [ChannelFile(ref=str(content["url"]), name=str(content.get("filename") or text or "file"),
                                 size=int(info.get("size") or 0), mime=str(info.get("mimetype") or ""))]
            text = ""
        elif msgtype not in ("m.text", "m.emote"):  # m.notice is what bots say: never answered (no loops)
            return None
        mentions = (content.get("m.mentions") or {}).get("user_ids") or []
        local = self.bot_id.removeprefix("@").partition(":")[0]
        mentioned = (not base.group or self.bot_id in mentions or self.bot_id in text
                     or bool(re.search(rf"(?<![\w@]){re.escape(local)}\b", text, re.I)))
        return base.model_copy(update={"text": text[:64_000], "files": files, "mentioned": mentioned})

    def _group(self, room_id: str) -> bool:
        room = self.client.rooms.get(room_id)
        return room is not None and (room.member_count or 0) > 2

    async def _decline_encrypted(self, room_id: str) -> None:
        """Said once per room: its messages cannot be read here."""
        key = self.bus.keys.channel_thread(NAME, f"encrypted:{room_id}")
        if await self.bus.redis.set(key, "1", nx=True, ex=30 * 86_400):
            log.warning("Matrix: room %s is encrypted; its messages are not read", room_id)
            with contextlib.suppress(PlatformAway, PlatformRefused):
                await self._send(room_id, {"msgtype": "m.notice", "body": ENCRYPTED_NOTICE})

    async def accept_invite(self, chat: str, accept: bool) -> None:
        async with translated("join" if accept else "leave"):
            checked(await (self.client.join(chat) if accept else self.client.room_leave(chat)),
                    "join" if accept else "leave")

    # --- writing: the Surface a turn is shown on ---

    def render(self, text: str) -> list[str]:
        return fitted(text, self.limit)

    async def _send(self, room_id: str, content: dict[str, Any]) -> str:
        async with translated("send"):
            sent = checked(await self.client.room_send(room_id, "m.room.message", content,
                                                       ignore_unverified_devices=True), "send")
        return str(sent.event_id)

    async def send(self, chat: str, rendered: str, *, buttons: Buttons = ()) -> str:
        choices = first_word_choices(buttons)
        keys = {REACTIONS.get(label, f"{n + 1}\N{COMBINING ENCLOSING KEYCAP}"): data
                for n, (label, data) in enumerate(choices.items())}
        if buttons:
            labels = " · ".join(f"{key} {label}" for key, label in zip(keys, choices, strict=True))
            rendered += f"\n\nReact with {labels} (or reply with the word)."
        event_id = await self._send(chat, _content(rendered))
        if buttons:
            await self.questions.ask(event_id, {**choices, **keys})
            for key in keys:  # the choices as reactions already there: one tap to answer
                async with translated("react"):
                    checked(await self.client.room_send(chat, "m.reaction", {"m.relates_to": {
                        "rel_type": "m.annotation", "event_id": event_id, "key": key}}), "react")
        return event_id

    async def edit(self, chat: str, message: str, rendered: str, *, buttons: Buttons = ()) -> None:
        new = _content(rendered)
        await self._send(chat, {**new, "body": f"* {new['body']}", "m.new_content": new,
                                "m.relates_to": {"rel_type": "m.replace", "event_id": message}})

    async def typing(self, chat: str) -> None:
        async with translated("typing"):
            checked(await self.client.room_typing(chat, True, timeout=6000), "typing")

    async def answer_press(self, press: str, text: str) -> None:
        await self._send(press, {"msgtype": "m.notice", "body": text})

    async def fetch_file(self, file: ChannelFile, limit: int) -> bytes:
        if file.size > limit:
            raise PlatformRefused(f"{file.name or 'the file'} is {file.size} bytes, over the {limit} allowed "
                                  "(channels.matrix.max_file_bytes)")
        async with translated("download"):
            got = checked(await self.client.download(mxc=file.ref), "download")
        data = bytes(got.body)
        if len(data) > limit:
            raise PlatformRefused(f"{file.name or 'the file'} is over the {limit} bytes allowed")
        return data

    async def send_file(self, chat: str, path: Path) -> None:
        data = await asyncio.to_thread(path.read_bytes)
        async with translated("upload"):
            uploaded, _ = await self.client.upload(lambda *_: data, content_type="application/octet-stream",
                                                   filename=path.name, filesize=len(data))
        checked(uploaded, "upload")
        await self._send(chat, {"msgtype": "m.file", "body": path.name, "filename": path.name,
                                "url": uploaded.content_uri, "info": {"size": len(data)}})


def _content(rendered: str) -> dict[str, Any]:
    """A text message: the rendered HTML, and the same as plain text for clients without HTML."""
    plain = html.unescape(re.sub(r"<[^>]+>", "", rendered))
    return {"msgtype": "m.text", "body": plain, "format": "org.matrix.custom.html", "formatted_body": rendered}


def _without_reply_fallback(body: str) -> str:
    """A reply's text without the quoted lines older clients put before it."""
    lines = body.split("\n")
    if lines and lines[0].startswith("> <"):
        while lines and lines[0].startswith(">"):
            lines.pop(0)
    return "\n".join(lines).strip()
