"""Email through IMAP (aioimaplib, with IDLE) and SMTP (aiosmtplib): the platform calls of the email channel.

The kit's offset is ``UIDVALIDITY:last UID``: the poll reads mail past the last UID the inbox stream
holds, waiting in IDLE when there is none, and the kit moves the offset only once the bus has the
mail, so a channel killed mid-read reads it again and the delivery record keeps it answered once.
Mail is never marked, moved or deleted: the mailbox stays the person's own record.

A person is their address; a conversation is a thread (its first Message-ID) per person, and its
answers go to the address the thread's mail came from, never to a Reply-To, Cc or an address
the model names. Mail can be neither edited nor pressed, so an answer is sent once, whole, and an
approval is asked as a question answered by replying with one of its choices. Strangers are not
answered (a reply to a forged sender is spam to an innocent); their pairing code is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import mimetypes
import re
import ssl
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aioimaplib
import aiosmtplib

from bus.protocol import ChannelFile, ChannelUpdate
from bus.streams import Bus
from gateway.channels import mailtext
from gateway.channels.config import EmailSettings
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.channels.questions import Questions, first_word_choices
from gateway.channels.reply import Buttons
from gateway.channels.untrusted import file_of, files_of

log = logging.getLogger("gateway.channels.email")

NAME = "email"
LIMIT = 200_000  # characters of one answer: mail has no practical limit, a runaway answer does
BATCH = 20  # mails read in one poll
THREAD_KEEP_S = 90 * 86_400  # a conversation can be picked up again for this long
SUBJECT_KEEP = 998  # a header line's most (RFC 5322); a longer subject is cut for the reply
TIMEOUT_S = 30.0  # one IMAP command, or one SMTP exchange


@contextlib.asynccontextmanager
async def translated(what: str) -> AsyncIterator[None]:
    """The libraries' errors as the kit's, saying which call failed."""
    try:
        yield
    except ssl.SSLCertVerificationError as exc:  # a person must fix this (or someone is in the middle)
        raise PlatformRefused(f"email {what}: the server's certificate is not trusted ({exc.verify_message}); "
                              "set channels.email.ca_file for a private CA") from None
    except aiosmtplib.SMTPAuthenticationError as exc:
        raise PlatformRefused(f"email {what}: SMTP login refused ({exc.code} {exc.message})") from None
    except (aiosmtplib.SMTPRecipientsRefused, aiosmtplib.SMTPSenderRefused) as exc:
        raise PlatformRefused(f"email {what}: the server refused the message ({exc})") from None
    except aiosmtplib.SMTPResponseException as exc:
        if exc.code >= 500:
            raise PlatformRefused(f"email {what}: {exc.code} {exc.message}") from None
        raise PlatformAway(f"email {what}: {exc.code} {exc.message}") from None
    except (aiosmtplib.SMTPException, aioimaplib.AioImapException, OSError, TimeoutError, EOFError) as exc:
        raise PlatformAway(f"email {what}: {type(exc).__name__}: {exc}") from None


@dataclass
class Thread:
    """Where a conversation's answers go: learnt from the person's last mail in it."""

    to: str
    subject: str
    references: list[str]
    quoted: str = ""
    quoted_date: str = ""


class MailBook:
    """Conversations, kept in Redis (every replica answers any thread)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def remember(self, chat: str, thread: Thread) -> None:
        await self.bus.redis.set(self.bus.keys.channel_thread(NAME, chat), json.dumps(asdict(thread)),
                                 ex=THREAD_KEEP_S)

    async def thread(self, chat: str) -> Thread:
        raw = await self.bus.redis.get(self.bus.keys.channel_thread(NAME, chat))
        if raw is None:
            raise PlatformRefused(f"email: no conversation {chat} is known (it is older than "
                                  f"{THREAD_KEEP_S // 86_400} days, or was never started by a person)")
        return Thread(**json.loads(raw))


class Email:
    """One mailbox's calls. ``limit``, ``edits`` and ``render`` make it a ``reply.Surface``."""

    name = NAME
    limit = LIMIT
    edits = False
    tells_strangers = False

    def __init__(self, settings: EmailSettings, bus: Bus) -> None:
        self.settings = settings
        self.book = MailBook(bus)
        self.questions = Questions(bus, NAME)
        self.bot_id = settings.address.lower()
        self.username = settings.address
        self._imap: aioimaplib.IMAP4 | None = None
        self._validity = ""
        self._next_uid = 1

    # --- IMAP: reading ---

    def _tls(self) -> ssl.SSLContext | None:
        if self.settings.tls == "none":
            return None
        return ssl.create_default_context(cafile=self.settings.ca_file or None)

    async def _connect(self, what: str) -> aioimaplib.IMAP4:
        """A logged-in connection with the mailbox selected (its UIDVALIDITY and UIDNEXT noted)."""
        settings = self.settings
        async with translated(what):
            if settings.tls == "ssl":
                imap: aioimaplib.IMAP4 = aioimaplib.IMAP4_SSL(settings.imap_host, settings.imap_port,
                                                              timeout=TIMEOUT_S, ssl_context=self._tls())
            else:
                imap = aioimaplib.IMAP4(settings.imap_host, settings.imap_port, timeout=TIMEOUT_S)
            await imap.wait_hello_from_server()
            if settings.tls == "starttls":
                await imap_starttls(imap, settings.imap_host, self._tls())
            login = await imap.login(settings.username, settings.password.get_secret_value())
            if login.result != "OK":
                raise PlatformRefused(f"email {what}: IMAP login refused for {settings.username} "
                                      f"({_said(login)}); check channels.email.username and password")
            selected = await imap.select(settings.mailbox)
            if selected.result != "OK":
                raise PlatformRefused(f"email {what}: no mailbox {settings.mailbox!r} ({_said(selected)}); "
                                      "check channels.email.mailbox")
        said = b"\n".join(line for line in selected.lines if isinstance(line, bytes))
        validity = re.search(rb"\[UIDVALIDITY (\d+)\]", said)
        next_uid = re.search(rb"\[UIDNEXT (\d+)\]", said)
        self._validity = validity.group(1).decode() if validity else "0"
        self._next_uid = int(next_uid.group(1)) if next_uid else 1
        return imap

    async def start(self) -> None:
        """Log in once: wrong credentials, a missing mailbox or an untrusted certificate fail here, plainly."""
        self._imap = await self._connect("login")

    async def close(self) -> None:
        imap, self._imap = self._imap, None
        if imap is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(imap.logout(), 5)

    async def poll(self, offset: str) -> tuple[str, list[ChannelUpdate]]:
        """Mail past ``offset`` (waiting in IDLE up to poll_timeout_s for some): the next offset, and the
        updates the kit handles (robots' and unreadable mail are passed over, but counted in the offset)."""
        if self._imap is None:
            self._imap = await self._connect("connect")
        try:
            return await self._poll(self._imap, offset)
        except (PlatformAway, RuntimeError) as exc:  # the server hung up (BYE, a restart): a fresh connection
            await self.close()
            if isinstance(exc, RuntimeError):  # a write on a transport the server closed under it
                raise PlatformAway(f"email poll: the connection was closed ({exc})") from None
            raise

    async def _poll(self, imap: aioimaplib.IMAP4, offset: str) -> tuple[str, list[ChannelUpdate]]:
        validity, _, last = offset.partition(":")
        if validity != self._validity:  # first start, or the mailbox was rebuilt: from what arrives next
            if offset:
                log.warning("email: the mailbox's UIDVALIDITY changed (%s -> %s); reading only new mail",
                            validity, self._validity)
            return f"{self._validity}:{self._next_uid - 1}", []
        after = int(last or 0)
        uids = await self._uids_after(imap, after)
        if not uids and self.settings.poll_timeout_s > 0:
            await self._idle(imap)
            uids = await self._uids_after(imap, after)
        updates = []
        for uid in uids[:BATCH]:
            update = await self._read(imap, uid)
            if update is not None:
                updates.append(update)
        return f"{self._validity}:{max(uids[:BATCH], default=after)}", updates

    async def _uids_after(self, imap: aioimaplib.IMAP4, after: int) -> list[int]:
        async with translated("UID SEARCH"):
            found = await imap.uid_search(f"UID {after + 1}:*")
        if found.result != "OK":
            raise PlatformAway(f"email UID SEARCH: {_said(found)}")
        words = found.lines[0].split() if found.lines and isinstance(found.lines[0], bytes) else []
        # "n:*" names the highest UID even when it is below n: only those past ``after`` are new.
        return sorted(uid for uid in (int(w) for w in words if w.isdigit()) if uid > after)

    async def _idle(self, imap: aioimaplib.IMAP4) -> None:
        """Wait for the server to say something changed, or poll_timeout_s."""
        if not imap.has_capability("IDLE"):
            await asyncio.sleep(min(self.settings.poll_timeout_s, 10))
            return
        async with translated("IDLE"):
            idle = await imap.idle_start(timeout=self.settings.poll_timeout_s)
            with contextlib.suppress(TimeoutError):
                await imap.wait_server_push(timeout=self.settings.poll_timeout_s + 1)
            imap.idle_done()
            await asyncio.wait_for(idle, TIMEOUT_S)

    async def _fetch(self, imap: aioimaplib.IMAP4, uid: int, what: str) -> tuple[int, bytes]:
        """A mail's size, and its bytes if it is not over max_message_bytes (else only its header)."""
        async with translated("UID FETCH"):
            sized = await imap.uid("fetch", str(uid), "(RFC822.SIZE)")
            size_said = re.search(rb"RFC822\.SIZE (\d+)", b" ".join(x for x in sized.lines if isinstance(x, bytes)))
            size = int(size_said.group(1)) if size_said else 0
            part = "BODY.PEEK[]" if size <= self.settings.max_message_bytes else "BODY.PEEK[HEADER]"
            fetched = await imap.uid("fetch", str(uid), f"({part})")
        if fetched.result != "OK":
            raise PlatformAway(f"email {what}: {_said(fetched)}")
        raw = next((bytes(line) for line in fetched.lines if isinstance(line, bytearray)), b"")
        return size, raw

    async def _read(self, imap: aioimaplib.IMAP4, uid: int) -> ChannelUpdate | None:
        size, raw = await self._fetch(imap, uid, "read a mail")
        if not raw:
            if uid in await self._uids_after(imap, uid - 1):  # still there: the answer was lost, not the mail
                raise PlatformAway(f"email read a mail: UID FETCH {uid} brought no message; reading it again")
            log.info("email: UID %s was deleted before it was read", uid)
            return None
        try:
            # In a thread: a large HTML mail takes seconds to parse, and the loop serves every turn meanwhile.
            mail = await asyncio.to_thread(mailtext.read, raw, own_address=self.settings.address)
        except Exception:  # a message the parser cannot read is skipped, never a stuck mailbox
            log.exception("email: UID %s is unreadable; passed over", uid)
            return None
        if mail.automated:
            log.info("email: UID %s not answered: %s", uid, mail.automated)
            return None
        if self.settings.authserv_id:
            try:
                proven = mailtext.proof(raw, mail.sender, authserv_id=self.settings.authserv_id)
            except mailtext.Unproven as exc:
                log.warning("email: UID %s claims to be from %s, unproven (%s); ignored", uid, mail.sender, exc)
                return None
            log.debug("email: UID %s from %s proven by %s (%s)", uid, mail.sender, self.settings.authserv_id, proven)
        chat = mailtext.chat_of(mail.root, mail.sender)
        event_id = f"{self._validity}:{uid}"
        base = ChannelUpdate(channel=NAME, event_id=event_id, user=mail.sender, username=mail.sender, chat=chat,
                             platform_message=mail.message_id, mentioned=True)
        # Before the access check, so a stranger's mail is kept too: only what an answer uses (its quote's
        # first characters), not the whole of a mail that may be megabytes, for THREAD_KEEP_S
        await self.book.remember(chat, Thread(to=mail.sender, subject=mail.subject[:SUBJECT_KEEP],
                                              references=mail.references, quoted=mail.text[:mailtext.QUOTED_KEEP],
                                              quoted_date=mail.date))
        pressed = await self._pressed(mail)
        if pressed is not None:  # answered in the presser's own thread (another's press is refused there)
            return base.model_copy(update={"press": chat, "data": pressed})
        text = mail.text
        if size > self.settings.max_message_bytes:
            text = (f"[The person sent a mail of {size} bytes, over the {self.settings.max_message_bytes} "
                    "allowed (channels.email.max_message_bytes): it was not read. Tell them so.]")
        elif mail.subject and not mail.replied_to:
            text = f"Subject: {mail.subject}\n\n{text}"
        files = files_of(file_of(f"{self._validity}:{uid}:{a.index}", a.name, a.size, a.mime)
                         for a in mail.attachments) if size <= self.settings.max_message_bytes else []
        return base.model_copy(update={"text": text[:64_000], "files": files})

    async def _pressed(self, mail: mailtext.Incoming) -> str | None:
        """A reply to a question, answered with one of its choices: the choice's data (else None)."""
        if not mail.replied_to:
            return None
        first = next((line for line in mail.text.splitlines() if line.strip()), "")
        return await self.questions.answer(mail.replied_to, first)

    async def fetch_file(self, file: ChannelFile, limit: int) -> bytes:
        if file.size > limit:
            raise PlatformRefused(f"{file.name or 'the file'} is {file.size} bytes, over the {limit} allowed "
                                  "(channels.email.max_file_bytes)")
        validity, uid, index = file.ref.split(":")
        imap = await self._connect("fetch an attachment")  # its own connection: the poller's is in IDLE
        try:
            if validity != self._validity:
                raise PlatformRefused(f"{file.name}: the mailbox was rebuilt since it arrived")
            _, raw = await self._fetch(imap, int(uid), "fetch an attachment")
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(imap.logout(), 5)
        data = mailtext.attachment_bytes(raw, int(index))
        if len(data) > limit:
            raise PlatformRefused(f"{file.name or 'the file'} is over the {limit} bytes allowed")
        return data

    # --- SMTP: the Surface a turn is shown on ---

    def render(self, text: str) -> list[str]:
        return [text[:LIMIT]]

    async def send(self, chat: str, rendered: str, *, buttons: Buttons = ()) -> str:
        thread = await self.book.thread(chat)
        body = rendered
        if buttons:
            choices = [label.upper() for row in buttons for label, _ in row]
            body += "\n\nReply to this mail with one of: " + ", ".join(choices)
            body += " (or its number: " + ", ".join(f"{n} {c}" for n, c in enumerate(choices, 1)) + ")"
        message = mailtext.answer(own=self.settings.address, to=thread.to, subject=thread.subject,
                                  references=thread.references, body=body, quoted=thread.quoted,
                                  quoted_from=thread.to, quoted_date=thread.quoted_date)
        message_id = str(message["Message-ID"])
        if buttons:
            numbered = {str(n): data for n, (_, data) in enumerate((b for row in buttons for b in row), 1)}
            await self.questions.ask(message_id, {**numbered, **first_word_choices(buttons)})
        await self._send(message, "send an answer")
        return message_id

    async def edit(self, chat: str, message: str, rendered: str, *, buttons: Buttons = ()) -> None:
        """Mail cannot be changed once sent: the kit sends an answer once, whole, so nothing is lost."""

    async def typing(self, chat: str) -> None:
        """Mail has no typing indicator."""

    async def answer_press(self, press: str, text: str) -> None:
        """A choice made by reply is confirmed by a short mail in the same thread."""
        await self.send(press, text)

    async def send_file(self, chat: str, name: str, data: bytes) -> None:
        thread = await self.book.thread(chat)
        message = mailtext.answer(own=self.settings.address, to=thread.to, subject=thread.subject,
                                  references=thread.references, body=f"(attached: {name})")
        kind, _ = mimetypes.guess_type(name)
        main, _, sub = (kind or "application/octet-stream").partition("/")
        message.add_attachment(data, maintype=main, subtype=sub, filename=name)
        await self._send(message, "send a file")

    async def _send(self, message: Any, what: str) -> None:
        settings = self.settings
        async with translated(what):
            await aiosmtplib.send(message, hostname=settings.smtp_host, port=settings.smtp_port,
                                  username=settings.username, password=settings.password.get_secret_value(),
                                  use_tls=settings.tls == "ssl", start_tls=settings.tls == "starttls",
                                  tls_context=self._tls(), timeout=TIMEOUT_S,
                                  # the envelope names the thread's person alone, whatever the headers say
                                  sender=settings.address, recipients=[str(message["To"])])


async def imap_starttls(imap: aioimaplib.IMAP4, host: str, context: ssl.SSLContext | None) -> None:
    """IMAP's STARTTLS (RFC 3501 6.2.1), which aioimaplib names but does not run: the command, then the
    connection's transport upgraded in place, then the capabilities asked again (the old ones are void)."""
    protocol = imap.protocol
    said = await protocol.execute(aioimaplib.Command("STARTTLS", protocol.new_tag(), loop=protocol.loop))
    if said.result != "OK":
        raise PlatformRefused(f"email: the IMAP server refused STARTTLS ({_said(said)}); use tls: ssl")
    loop = asyncio.get_running_loop()
    protocol.transport = await loop.start_tls(protocol.transport, protocol, context or ssl.create_default_context(),
                                              server_hostname=host)
    await protocol.capability()


def _said(response: Any) -> str:
    lines = [line.decode(errors="replace") for line in getattr(response, "lines", []) if isinstance(line, bytes)]
    return (lines[-1] if lines else str(getattr(response, "result", "")))[:200]


def platform(settings: EmailSettings, bus: Bus, *, data_dir: Path, instance_id: str) -> Email:
    """The channel's platform, as ``pincer channel email`` opens it."""
    return Email(settings, bus)
