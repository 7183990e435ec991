"""Telegram through python-telegram-bot's ``Bot``: the platform calls of the Telegram channel, nothing more.

Only the library's ``Bot`` is used, not its ``Application``: the channel kit decides when an update
counts as taken (the offset moves only once the bus holds it), so the polling loop is the kit's.
The library's errors are translated here, at the edge, into the kit's ``PlatformAway`` (try again,
after ``retry_after`` if the platform said so) and ``PlatformRefused`` (this call will not work).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from pathlib import Path

from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup, Message, Update
from telegram import error as tg
from telegram.constants import ChatAction, ParseMode
from telegram.request import HTTPXRequest

from bus.protocol import ChannelFile, ChannelUpdate
from bus.streams import Bus
from gateway.channels.config import TelegramSettings
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.channels.markup import fitted
from gateway.channels.platform import Hook
from gateway.channels.reply import Buttons
from gateway.channels.untrusted import file_of, files_of, read_each, read_one

log = logging.getLogger("gateway.channels.telegram")

NAME = "telegram"
LIMIT = 4096  # characters of one message's text, entities parsed
SECRET_HEADER = "x-telegram-bot-api-secret-token"
POOL = 96  # HTTP connections for calls other than getUpdates: the kit runs up to 32 turns at once


@contextlib.asynccontextmanager
async def translated(what: str) -> AsyncIterator[None]:
    """The library's errors as the kit's, saying which call failed."""
    try:
        yield
    except tg.RetryAfter as exc:
        wait = exc.retry_after
        seconds = wait.total_seconds() if isinstance(wait, timedelta) else float(wait)
        raise PlatformAway(f"Telegram {what}: flood control, retry in {seconds:g}s", retry_after=seconds) from None
    except tg.Conflict as exc:  # another poller or a webhook: waiting may end it, and it is reported
        raise PlatformAway(f"Telegram {what}: {exc.message} (another program polls this bot, or a webhook is "
                           "set)", retry_after=5.0) from None
    except (tg.InvalidToken, tg.Forbidden, tg.BadRequest, tg.ChatMigrated, tg.EndPointNotFound) as exc:
        raise PlatformRefused(f"Telegram {what}: {exc.message}") from None
    except tg.TelegramError as exc:  # NetworkError, TimedOut, a 5xx: the platform is away for now
        raise PlatformAway(f"Telegram {what}: {exc.message}") from None


class Telegram:
    """One bot's calls. ``limit`` and ``render`` make it a ``reply.Surface``."""

    name = NAME
    limit = LIMIT
    edits = True
    tells_strangers = True

    def __init__(self, settings: TelegramSettings) -> None:
        self.settings = settings
        token = settings.bot_token.get_secret_value()
        poll = settings.poll_timeout_s
        self.bot = Bot(token, base_url=f"{settings.api_url}/bot", base_file_url=f"{settings.api_url}/file/bot",
                       # Room for every turn the handler runs at once (sends, edits, typing) and then some.
                       request=HTTPXRequest(connection_pool_size=POOL, connect_timeout=10, read_timeout=20,
                                            write_timeout=20, pool_timeout=30),
                       get_updates_request=HTTPXRequest(connect_timeout=10, read_timeout=poll + settings.poll_grace_s,
                                                        pool_timeout=10))
        self.bot_id = ""
        self.username = ""
        self._open = False
        self.webhook_url, self.webhook_listen = settings.webhook_url, settings.webhook_listen
        self.webhook_path = settings.webhook_path

    async def start(self) -> None:
        """Ask the platform who the bot is (a wrong token fails here, plainly)."""
        async with translated("getMe"):
            await self.bot.initialize()
        self._open = True
        self.bot_id, self.username = str(self.bot.id), self.bot.username

    async def close(self) -> None:
        """Its connections closed; the next call opens fresh ones (after a poll that hung)."""
        self._open = False
        with contextlib.suppress(Exception):
            await self.bot.shutdown()

    async def _ensure_open(self) -> None:
        if not self._open:
            await self.start()

    async def poll(self, offset: str) -> tuple[str, list[ChannelUpdate]]:
        """Updates from ``offset`` (waiting up to poll_timeout_s for one): the next offset, and those the kit
        handles (others, such as edits or joins, are passed over but counted in the offset)."""
        await self._ensure_open()
        async with translated("getUpdates"):
            updates = await self.bot.get_updates(offset=int(offset) if offset else None,
                                                 timeout=self.settings.poll_timeout_s,
                                                 allowed_updates=["message", "callback_query"])
        if not updates:
            return offset, []
        return str(updates[-1].update_id + 1), await read_each(updates, self._update, what="Telegram")

    def refusal(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """Every request must carry the secret token registered with the webhook."""
        given = headers.get(SECRET_HEADER, "")
        if not hmac.compare_digest(given.encode(), self.settings.webhook_secret().encode()):
            return "the secret token is missing or wrong"
        return None

    async def read_hook(self, headers: Mapping[str, str], body: bytes) -> Hook:
        """An update as a webhook request carries it: its id, and what the kit handles of it (if anything)."""
        update = Update.de_json(json.loads(body), self.bot)
        return Hook(event_id=str(update.update_id), update=await read_one(update, self._update, what="Telegram"))

    async def set_webhook(self) -> None:
        async with translated("setWebhook"):
            await self.bot.set_webhook(self.webhook_url, secret_token=self.settings.webhook_secret(),
                                       allowed_updates=["message", "callback_query"])

    async def drop_webhook(self) -> None:
        """Long polling cannot start while a webhook is set (Telegram answers 409)."""
        async with translated("deleteWebhook"):
            await self.bot.delete_webhook()

    async def webhook_error(self) -> str:
        """What Telegram last failed to deliver to the webhook, if anything (its progress check)."""
        async with translated("getWebhookInfo"):
            info = await self.bot.get_webhook_info()
        return info.last_error_message or ""

    def _update(self, update: Update) -> ChannelUpdate | None:
        event_id = str(update.update_id)
        query = update.callback_query
        if query is not None:
            message = query.message
            chat = message.chat if message is not None else None
            return ChannelUpdate(channel=NAME, event_id=event_id, user=str(query.from_user.id),
                                 username=query.from_user.username or "",
                                 chat=str(chat.id) if chat else str(query.from_user.id),
                                 group=chat is not None and chat.type != "private", press=query.id,
                                 data=(query.data or "")[:256],
                                 platform_message=str(message.message_id) if message is not None else "")
        said = update.message
        if said is None or said.from_user is None or said.from_user.is_bot:
            return None
        text = said.text or said.caption or ""
        group = said.chat.type != "private"
        mention = f"@{self.username}"
        replied_to_us = (said.reply_to_message is not None and said.reply_to_message.from_user is not None
                         and str(said.reply_to_message.from_user.id) == self.bot_id)
        mentioned = not group or replied_to_us or mention.lower() in text.lower()
        if mention.lower() in text.lower():
            text = _without(text, mention)
        return ChannelUpdate(channel=NAME, event_id=event_id, user=str(said.from_user.id),
                             username=said.from_user.username or "", chat=str(said.chat.id), group=group,
                             text=text[:64_000], mentioned=mentioned, files=_files(said),
                             platform_message=str(said.message_id))

    # --- the Surface a turn is shown on ---

    def render(self, text: str) -> list[str]:
        return fitted(text, LIMIT)

    async def send(self, chat: str, rendered: str, *, buttons: Buttons = ()) -> str:
        async with translated("sendMessage"):
            sent = await self.bot.send_message(int(chat), rendered, parse_mode=ParseMode.HTML,
                                               reply_markup=_keyboard(buttons), disable_web_page_preview=True)
        return str(sent.message_id)

    async def edit(self, chat: str, message: str, rendered: str, *, buttons: Buttons = ()) -> None:
        try:
            async with translated("editMessageText"):
                await self.bot.edit_message_text(rendered, chat_id=int(chat), message_id=int(message),
                                                 parse_mode=ParseMode.HTML, reply_markup=_keyboard(buttons),
                                                 disable_web_page_preview=True)
        except PlatformRefused as exc:
            if "not modified" not in str(exc):  # the same text again: nothing to do
                raise

    async def typing(self, chat: str) -> None:
        async with translated("sendChatAction"):
            await self.bot.send_chat_action(int(chat), ChatAction.TYPING)

    async def answer_press(self, press: str, text: str) -> None:
        async with translated("answerCallbackQuery"):
            await self.bot.answer_callback_query(press, text=text[:200])

    async def fetch_file(self, file: ChannelFile, limit: int) -> bytes:
        if file.size > limit:
            raise PlatformRefused(f"{file.name or 'the file'} is {file.size} bytes, over the {limit} allowed "
                                  "(channels.telegram.max_file_bytes)")
        async with translated("getFile"):
            remote = await self.bot.get_file(file.ref)
            if (remote.file_size or 0) > limit:
                raise PlatformRefused(f"{file.name or 'the file'} is over the {limit} bytes allowed")
            data = bytes(await remote.download_as_bytearray())
        if len(data) > limit:
            raise PlatformRefused(f"{file.name or 'the file'} is over the {limit} bytes allowed")
        return data

    async def send_file(self, chat: str, name: str, data: bytes) -> None:
        async with translated("sendDocument"):
            await self.bot.send_document(int(chat), document=data, filename=name)


def _keyboard(buttons: Buttons) -> InlineKeyboardMarkup | None:
    if not buttons:
        return None
    return InlineKeyboardMarkup([[InlineKeyboardButton(label, callback_data=data) for label, data in row]
                                 for row in buttons])


def _files(message: Message) -> list[ChannelFile]:
    found: list[ChannelFile | None] = []
    if message.document is not None:
        doc = message.document
        found.append(file_of(doc.file_id, doc.file_name or f"file-{message.message_id}", doc.file_size,
                             doc.mime_type))
    if message.photo:
        largest = message.photo[-1]  # Telegram lists a photo's sizes smallest first
        found.append(file_of(largest.file_id, f"photo-{message.message_id}.jpg", largest.file_size, "image/jpeg"))
    return files_of(found)


def _without(text: str, mention: str) -> str:
    at = text.lower().find(mention.lower())
    return (text[:at] + text[at + len(mention):]).strip()


def platform(settings: TelegramSettings, bus: Bus, *, data_dir: Path, instance_id: str) -> Telegram:
    """The channel's platform, as ``pincer channel telegram`` opens it."""
    return Telegram(settings)
