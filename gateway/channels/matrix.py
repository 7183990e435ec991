"""Matrix through matrix-nio: the platform calls of the Matrix channel, on any homeserver.

The kit's offset is the sync's ``next_batch`` token, stored only once the bus holds what the sync
brought, so a channel killed mid-sync syncs the same events again and the delivery record keeps
each answered once. The first sync of a new bot only learns where "now" is (and the invitations
waiting): history in its rooms is not answered.

A room is a conversation (per person, as everywhere in the kit); in a room of more than two the
bot answers when mentioned (``m.mentions``, its id or name in the text, a reply to it). Invitations
are the kit's to accept or decline (only from people who may talk to the agent). Answers stream by
edits (``m.replace``); an approval is asked as a message the bot reacts to with its choices, and
a person's reaction (or a reply with the choice's word) answers it.

End-to-end encryption (``encryption: true``) is nio's, with the device's keys in a store on disk:
one process holds them (a device lease in Redis), keys are uploaded and fetched after each sync,
and a message whose room key has not arrived yet waits in Redis and is read when it does.
Without it, encrypted rooms are declined with a notice.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import html
import json
import logging
import re
from functools import partial
from pathlib import Path
from typing import Any

import nio
from nio.crypto.attachments import decrypt_attachment

from bus.protocol import ChannelFile, ChannelUpdate
from bus.streams import Bus
from gateway.channels.config import MatrixSettings
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.channels.markup import fitted
from gateway.channels.matrix_calls import checked, translated
from gateway.channels.matrix_keys import DeviceKeys, store_key
from gateway.channels.platform import patiently
from gateway.channels.questions import Questions, first_word_choices
from gateway.channels.reply import Buttons
from gateway.channels.untrusted import file_of, files_of, read_each

log = logging.getLogger("gateway.channels.matrix")

NAME = "matrix"
ASKED_KEEP = 256  # questions whose steps are remembered, for a send retried after a rate limit
GAP_PAGES = 50  # pages of 100 events read back to fill what a limited sync left out (then the rest is logged)
# A sync brings what the kit reads and what nio needs to know the rooms (their members, encryption).
ROOM_FILTER: dict[str, Any] = {"state": {"lazy_load_members": True}, "ephemeral": {"not_types": ["*"]},
                               "account_data": {"not_types": ["*"]}}


REACTIONS = {"allow once": "✅", "always": "🔁", "deny": "❌"}
ENCRYPTED_NOTICE = ("This room is end-to-end encrypted, and this agent cannot read encrypted rooms. "
                    "Talk to it in an unencrypted room (or direct chat without encryption).")


def sync_filter(timeline_limit: int) -> dict[str, Any]:
    return {"presence": {"not_types": ["*"]}, "account_data": {"not_types": ["*"]},
            "room": {**ROOM_FILTER, "timeline": {"limit": timeline_limit}}}


# Before the kit's own syncs, one that only learns the joined rooms (nio sends only to rooms it knows).
ROOMS_FILTER = sync_filter(1)
ENCRYPTED_FILE = "e2e:"  # a ChannelFile ref of an encrypted attachment: this, then its `file` as JSON
IDENTITY_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$")


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

    def __init__(self, settings: MatrixSettings, bus: Bus, *, store_dir: Path, instance_id: str = "") -> None:
        self.settings, self.bus = settings, bus
        self.limit = settings.max_message_chars
        config = nio.AsyncClientConfig(store_sync_tokens=False, encryption_enabled=settings.encryption,
                                       pickle_key=store_key(settings, store_dir) if settings.encryption else "",
                                       max_limit_exceeded=0, max_timeouts=0, request_timeout=30)
        self.client = nio.AsyncClient(settings.homeserver, user=settings.user_id, config=config,
                                      store_path=str(store_dir) if settings.encryption else "")
        self.client.access_token = settings.access_token.get_secret_value()
        self.client.user_id = settings.user_id
        self.questions = Questions(bus, NAME)
        self._asked: dict[str, set[str]] = {}  # a question posted (by its step id) -> the reactions added to it
        self.bot_id = ""
        self.username = ""
        self.keys = DeviceKeys(self.client, bus, settings, channel=NAME, store_dir=store_dir,
                               instance_id=instance_id)

    async def start(self) -> None:
        """Ask the homeserver whose token this is (a wrong token fails here, plainly); with encryption,
        hold the device and open its keys."""
        async with translated("whoami"):
            me = checked(await self.client.whoami(), "whoami")
        if me.user_id != self.settings.user_id:
            raise PlatformRefused(f"the access token is {me.user_id}'s, not {self.settings.user_id}'s "
                                  "(channels.matrix.user_id)")
        self.client.device_id = me.device_id
        self.bot_id = self.username = me.user_id
        if self.settings.encryption:
            await self.keys.open(str(me.device_id or ""))
            async with translated("sync rooms"):  # nio encrypts only for rooms (and members) it knows
                checked(await self.client.sync(timeout=0, sync_filter=ROOMS_FILTER, full_state=True), "sync rooms")
            await self.keys.exchange()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.close()

    # --- reading: the sync ---

    async def poll(self, offset: str) -> tuple[str, list[ChannelUpdate]]:
        if self.keys.lost:
            raise PlatformRefused(self.keys.lost)
        wait_ms = self.settings.poll_timeout_s * 1000 if offset else 0
        async with translated("sync"):
            sync = checked(await self.client.sync(timeout=wait_ms, since=offset or None, full_state=not offset,
                                                  sync_filter=sync_filter(self.settings.sync_timeline_limit)), "sync")
        updates = [u for u in (self._invitation(room_id, room) for room_id, room in sync.rooms.invite.items()) if u]
        if offset:  # the first sync only finds "now": what is already in the rooms is history
            for room_id, room in sync.rooms.join.items():
                events = list(room.timeline.events)
                if room.timeline.limited:  # more happened than one sync brings: the rest read back to our token
                    events = [*await self._gap(room_id, room.timeline.prev_batch, offset), *events]
                updates += await read_each(events, partial(self._timeline_event, room_id), what="Matrix")
        if self.client.olm is not None:
            await self.keys.exchange()
            updates += await read_each(await self.keys.readable(), lambda found: self._update(*found),
                                       what="Matrix")
        return str(sync.next_batch), updates

    async def _gap(self, room_id: str, start: str, until: str) -> list[Any]:
        """The events a limited sync left out, oldest first: paged back from its ``prev_batch`` to ``until``,
        the token of the sync before (GAP_PAGES pages at most; beyond them, logged)."""
        found: list[Any] = []
        token = start
        for _ in range(GAP_PAGES):
            async with translated("read back"):
                page = checked(await self.client.room_messages(room_id, start=token, end=until, limit=100),
                               "read back")
            found.extend(page.chunk)
            if not page.chunk or not page.end or page.end == token:
                return list(reversed(found))
            token = page.end
        log.warning("Matrix: room %s had more than %d events since the last sync; the oldest were not read",
                    room_id, GAP_PAGES * 100)
        return list(reversed(found))

    async def _timeline_event(self, room_id: str, event: Any) -> ChannelUpdate | None:
        if isinstance(event, nio.MegolmEvent) and self.client.olm is not None:  # nio decrypted what it could
            await self.keys.wait_for_key(room_id, event)
            return None
        return await self._update(room_id, event.source)

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
        content = _object(source.get("content"))  # any member of a room (or its server) writes these
        relates = _object(content.get("m.relates_to"))
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
        replied = str(_object(relates.get("m.in_reply_to")).get("event_id") or "")
        if replied:
            data = await self.questions.answer(replied, text.split("\n")[0])
            if data:
                return base.model_copy(update={"press": room_id, "data": data})
        files: list[ChannelFile] = []
        if msgtype in ("m.file", "m.image", "m.audio", "m.video") and (ref := _attachment(content)):
            info = _object(content.get("info"))
            files = files_of([file_of(ref, content.get("filename") or text, info.get("size"), info.get("mimetype"))])
            text = "" if files else text  # a file that cannot be fetched: its name is what was said
        elif msgtype not in ("m.text", "m.emote"):  # m.notice is what bots say: never answered (no loops)
            return None
        mentions = _object(content.get("m.mentions")).get("user_ids")
        mentions = mentions if isinstance(mentions, list) else []
        local = self.bot_id.removeprefix("@").partition(":")[0]
        mentioned = (not base.group or self.bot_id in mentions or self.bot_id in text
                     or bool(re.search(rf"(?<![\w@]){re.escape(local)}\b", text, re.I)))
        return base.model_copy(update={"text": without_mention(text, self.bot_id)[:64_000], "files": files,
                                       "mentioned": mentioned})

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

    async def _send(self, room_id: str, content: dict[str, Any], *, kind: str = "m.room.message",
                    step: str | None = None) -> str:
        """One event sent; ``step`` (a step of a send made of several) names its transaction, so the
        homeserver answers a retried step with the event it already made instead of making another."""
        if self.keys.lost:
            raise PlatformRefused(self.keys.lost)
        async with translated("send"):
            sent = checked(await self.client.room_send(room_id, kind, content, tx_id=step,
                                                       ignore_unverified_devices=True), "send")
        return str(sent.event_id)

    async def send(self, chat: str, rendered: str, *, buttons: Buttons = ()) -> str:
        """A message; with buttons, a question and then its choices as reactions, each step sent once: a
        send retried after a rate limit on a reaction goes on from that reaction, never posting again."""
        choices = first_word_choices(buttons)
        keys = {REACTIONS.get(label, f"{n + 1}\N{COMBINING ENCLOSING KEYCAP}"): data
                for n, (label, data) in enumerate(choices.items())}
        if not buttons:
            return await self._send(chat, _content(rendered))
        labels = " · ".join(f"{key} {label}" for key, label in zip(keys, choices, strict=True))
        rendered += f"\n\nReact with {labels} (or reply with the word)."
        # The choices' data are the question's own (an approval's id): the same question is the same steps.
        digest = hashlib.sha256(json.dumps([chat, rendered, sorted(keys.items())]).encode()).hexdigest()
        question = f"pincer-{digest[:40]}"
        event_id = await patiently(lambda: self._send(chat, _content(rendered), step=question), what="ask")
        reacted = self._asked.setdefault(question, set())
        while len(self._asked) > ASKED_KEEP:  # a question whose send was given up is not kept for ever
            self._asked.pop(next(iter(self._asked)))
        if not reacted:
            await self.questions.ask(event_id, {**choices, **keys})
        for n, key in enumerate(keys):  # the choices as reactions already there: one tap to answer
            if key in reacted:
                continue
            await patiently(functools.partial(self._react, chat, event_id, key, f"{question}-{n}"), what="react")
            reacted.add(key)
        self._asked.pop(question, None)
        return event_id

    async def _react(self, chat: str, event_id: str, key: str, step: str) -> str:
        return await self._send(chat, {"m.relates_to": {"rel_type": "m.annotation", "event_id": event_id, "key": key}},
                                kind="m.reaction", step=step)

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
        sealed = json.loads(file.ref.removeprefix(ENCRYPTED_FILE)) if file.ref.startswith(ENCRYPTED_FILE) else None
        async with translated("download"):
            got = checked(await self.client.download(mxc=sealed["url"] if sealed else file.ref), "download")
        data = bytes(got.body)
        if len(data) > limit:
            raise PlatformRefused(f"{file.name or 'the file'} is over the {limit} bytes allowed")
        if sealed:
            try:
                data = decrypt_attachment(data, sealed["key"]["k"], sealed["hashes"]["sha256"], sealed["iv"])
            except (nio.EncryptionError, KeyError, TypeError, ValueError) as exc:
                raise PlatformRefused(f"{file.name or 'the file'} could not be decrypted ({exc})") from None
        return data

    async def send_file(self, chat: str, name: str, data: bytes) -> None:
        room = self.client.rooms.get(chat)
        seal = self.client.olm is not None and room is not None and room.encrypted
        async with translated("upload"):
            uploaded, keys = await self.client.upload(lambda *_: data, content_type="application/octet-stream",
                                                      filename=name, filesize=len(data), encrypt=seal)
        checked(uploaded, "upload")
        where = {"file": {"url": uploaded.content_uri, **(keys or {})}} if seal else {"url": uploaded.content_uri}
        await self._send(chat, {"msgtype": "m.file", "body": name, "filename": name, **where,
                                "info": {"size": len(data)}})


def _content(rendered: str) -> dict[str, Any]:
    """A text message: the rendered HTML, and the same as plain text for clients without HTML."""
    plain = html.unescape(re.sub(r"<[^>]+>", "", rendered))
    return {"msgtype": "m.text", "body": plain, "format": "org.matrix.custom.html", "formatted_body": rendered}


def _object(value: Any) -> dict[str, Any]:
    """A JSON object an event should hold here; anything else (a string, a list) as an empty one."""
    return value if isinstance(value, dict) else {}


def _attachment(content: dict[str, Any]) -> str:
    """A file message's reference: its mxc:// URL, or (encrypted) the marker and its keys as JSON."""
    if str(content.get("url", "")).startswith("mxc://"):
        return str(content["url"])
    sealed = content.get("file")
    if isinstance(sealed, dict) and str(sealed.get("url", "")).startswith("mxc://"):
        return ENCRYPTED_FILE + json.dumps(sealed)
    return ""


def without_mention(text: str, bot_id: str) -> str:
    """The words said to the bot, without how it was addressed: its full id anywhere, and its name at the start
    as clients write a mention ("pincer: ...", "@pincer, ..."), as Slack and Discord mentions are left out."""
    local = bot_id.removeprefix("@").partition(":")[0]
    text = re.sub(rf"^\s*(?:{re.escape(bot_id)}\s*[:,]?|@?{re.escape(local)}\s*[:,])\s*", "", text, count=1,
                  flags=re.I)
    return re.sub(r"[ \t]{2,}", " ", text.replace(bot_id, " ")).strip()


def _without_reply_fallback(body: str) -> str:
    """A reply's text without the quoted lines older clients put before it."""
    lines = body.split("\n")
    if lines and lines[0].startswith("> <"):
        while lines and lines[0].startswith(">"):
            lines.pop(0)
    return "\n".join(lines).strip()


def platform(settings: MatrixSettings, bus: Bus, *, data_dir: Path, instance_id: str) -> Matrix:
    """The channel's platform, as ``pincer channel matrix`` opens it."""
    return Matrix(settings, bus, store_dir=Path(settings.store_dir or data_dir / "matrix"),
                  instance_id=instance_id)
