"""A channel process: one chat platform's bot as a participant on the bus (the channel kit's core).

Two halves, joined by a stream in Redis (``channel_inbox``):

- The **poller** (one per bot across every replica: a lease, taken over from a holder whose
  heartbeat has stopped) fetches the platform's updates and writes them to the inbox together with
  the platform's new offset, in one script that first checks the lease: an update is taken from
  the platform only once the bus holds it, and a poller that lost its lease writes nothing.
- The **handler** (every replica, a consumer group) turns each update into what it means: a
  stranger's pairing code, a command (/new, /stop), a turn (a ``chat:message`` through the
  Gateway's own ``TurnRunner``, so a platform user meets the same admission, session and policy
  rules as a token), or an approval button's press. The inbox entry is acknowledged after the
  answer is shown; a channel killed mid-turn leaves it pending, and its redelivery finds the turn
  already started (``Delivery``) and shows the answer the transcript holds, in the same message.

Liveness is progress: the time of the last successful poll is in the instance's heartbeat
(`pincer channels`, `pincer status`); a poll that hangs past its timeout is abandoned and the
platform's connection made afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bus.codec import encode
from bus.consumer import GroupConsumer, HandedOver
from bus.lease import HOLDS, Lease
from bus.log import kv
from bus.presence import Presence, alive
from bus.protocol import (
    ApprovalRequest,
    ChannelFile,
    ChannelUpdate,
    ChatDelta,
    ChatError,
    ChatReply,
    ChatTool,
    Message,
)
from bus.reaper import Reaper
from bus.replies import ReplyInbox
from bus.streams import CONNECTION_ERRORS, Bus
from gateway.channels.access import Access
from gateway.channels.config import TelegramSettings
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.channels.reply import Buttons, Delivery, StreamedReply, Surface
from gateway.config import GatewaySettings
from gateway.server.errors import Refused
from gateway.server.limits import CallerLimits
from gateway.server.session_names import qualify
from gateway.server.turns import TurnRunner
from gateway.tokens import Identity
from memory.sessions import SessionStore

log = logging.getLogger("gateway.channels")

GROUP = "channel"
ROLE = "channel"
INBOX_KEEP = 10_000  # inbox entries kept (acknowledged ones are only history)
RETRY_DELAYS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
PATIENCE_S = 300.0  # how long a message waits out a platform that is away before it is given up
ANSWER_POLL_S = 0.5  # a restarted channel reads the transcript this often for a turn's answer
ATTACH = re.compile(r"^[ \t]*\[attach:\s*([^\]\n]{1,512})\][ \t]*$", re.M)
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")

INSTRUCTIONS = ("You are talking with a person through {platform}. Keep answers short enough to read on a "
                "phone. To send them a file from the workspace, write a line `[attach: PATH]` (PATH relative "
                "to the workspace); files they send you are saved under inbox/ in the workspace.")
HELP = ("Talk to me as you would to a person. /new starts a fresh conversation, /stop stops what I am doing.")

# KEYS: lease, inbox, offset. ARGV: holder, new offset, inbox length kept, then each entry as its
# field count and its fields. -1: the lease is not ours (nothing written); 1: written.
TAKE_UPDATES = HOLDS + """
local i = 4
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
redis.call('SET', KEYS[3], ARGV[2])
return 1
"""
# KEYS: seen, inbox. ARGV: keep s, inbox length kept, then the entry's fields. 1: written; 0: a repeat.
TAKE_PUSHED = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
return 1
"""
PUSHED_KEEP_S = 86_400  # a platform retries a webhook delivery for hours at most
WEBHOOK_MAX_BYTES = 1 << 20
WEBHOOK_CHECK_S = 15.0  # how often a webhook's health is asked of the platform (its progress)
# KEYS: lease. ARGV: the dead holder, us, ttl ms. The lease of a holder whose heartbeat stopped, taken.
TAKE_OVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end
return 0
"""

T = TypeVar("T")


class PlatformDown(HandedOver):
    """An update whose answer the platform would not take: left pending for the reaper to deliver again
    (after ``redis.claim_idle_s``; past ``redis.max_deliveries`` it goes to the dead letters, from where
    `pincer dead retry` sends it again). Its turn is not run again: the delivery record says it ran."""


class Platform(Surface, Protocol):
    """What a channel module offers the kit (gateway/channels/telegram.py is one)."""

    name: str
    bot_id: str
    username: str

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def poll(self, offset: int) -> tuple[int, list[ChannelUpdate]]: ...
    async def answer_press(self, press: str, text: str) -> None: ...
    async def fetch_file(self, file: ChannelFile, limit: int) -> bytes: ...
    async def send_file(self, chat: str, path: Path) -> None: ...
    def parse(self, data: dict[str, Any]) -> tuple[str, ChannelUpdate | None]: ...
    async def set_webhook(self, url: str, secret: str) -> None: ...
    async def drop_webhook(self) -> None: ...
    async def webhook_error(self) -> str: ...


async def patiently(call: Callable[[], Awaitable[T]], *, what: str, within_s: float = PATIENCE_S) -> T:
    """``call()``, again while the platform is away (after its retry_after, else with backoff), for up to
    ``within_s``; then its last error."""
    deadline = time.monotonic() + within_s
    for attempt in range(1_000):
        try:
            return await call()
        except PlatformAway as exc:
            wait = exc.retry_after if exc.retry_after is not None else RETRY_DELAYS[min(attempt, 5)]
            if time.monotonic() + wait > deadline:
                raise
            log.warning("%s: %s; again in %.1fs", what, exc, wait)
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")


class Patient:
    """A platform whose sends and edits wait out an outage (a Surface for ``StreamedReply``)."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.limit = platform.limit

    def render(self, text: str) -> list[str]:
        return self.platform.render(text)

    async def send(self, chat: str, rendered: str, *, buttons: Buttons = ()) -> str:
        return await patiently(lambda: self.platform.send(chat, rendered, buttons=buttons), what="send")

    async def edit(self, chat: str, message: str, rendered: str, *, buttons: Buttons = ()) -> None:
        await patiently(lambda: self.platform.edit(chat, message, rendered, buttons=buttons), what="edit")

    async def typing(self, chat: str) -> None:
        await self.platform.typing(chat)  # once: a missed indicator is not worth waiting for


class ChannelWorker:
    def __init__(self, bus: Bus, platform: Platform, settings: TelegramSettings, gateway: GatewaySettings, *,
                 workspace: Path, instance_id: str, heartbeat_s: float = 3.0) -> None:
        self.bus, self.platform, self.settings = bus, platform, settings
        self.workspace, self.instance_id, self.heartbeat_s = workspace, instance_id, heartbeat_s
        self.name = platform.name
        self.inbox = ReplyInbox(bus, instance_id)
        self.sessions = SessionStore(bus.redis, bus.keys)
        self.turns = TurnRunner(bus, self.inbox, self.sessions, CallerLimits(bus, gateway.limits), gateway)
        self.turn_timeout_s = gateway.turn_timeout_s
        self.access = Access(bus, self.name, allow_from=settings.allow_from, agent=settings.agent,
                             pairing_ttl_s=settings.pairing_ttl_s)
        self.surface = Patient(platform)
        self.hung_s = settings.poll_timeout_s + 2 * settings.poll_grace_s  # a poll this long has hung
        self.counts = {"in": 0, "out": 0, "errors": 0}
        self.polling = False
        self.last_progress = 0.0  # wall clock of the last successful poll by this instance
        self.last_error = ""
        self._take = bus.redis.register_script(TAKE_UPDATES)
        self._take_over = bus.redis.register_script(TAKE_OVER)
        self._take_pushed = bus.redis.register_script(TAKE_PUSHED)

    # --- the process ---

    async def run(self, stop: asyncio.Event) -> None:
        await self._start_platform(stop)
        if stop.is_set():
            return
        inbox_key = self.bus.keys.channel_inbox(self.name, self.platform.bot_id)
        consumer = GroupConsumer(self.bus, streams=[inbox_key], group=GROUP, consumer=self.instance_id,
                                 handler=self.handle, concurrency=32, block_ms=1000)
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(self.platform.close)
            await self.inbox.start()
            stack.push_async_callback(self.inbox.close)
            stack.push_async_callback(self.turns.close)
            presence = Presence(self.bus, ROLE, self.instance_id, interval_s=self.heartbeat_s, details=self.details)
            await presence.start()
            stack.push_async_callback(presence.stop)
            reaper = Reaper(self.bus, consumer, self.bus.settings)
            await reaper.start()
            stack.push_async_callback(reaper.close)
            taking = self._webhook(stop) if self.settings.webhook_url else self._poll(stop)
            poller = asyncio.create_task(taking, name=f"{self.name}:updates")
            stack.push_async_callback(_awaited, poller)
            log.info("%s channel up %s", self.name, kv(bot=self.platform.bot_id, username=self.platform.username))
            await consumer.run(stop)

    async def _start_platform(self, stop: asyncio.Event) -> None:
        """Who the bot is; a platform that is away is waited for, a refusal (a wrong token) ends the process."""
        for attempt in range(1_000_000):
            try:
                await self.platform.start()
                return
            except PlatformAway as exc:
                self._failed(exc)
                delay = exc.retry_after or RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
                log.warning("%s: cannot reach the platform (%s); again in %.1fs", self.name, exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    return

    def details(self) -> dict[str, Any]:
        return {"channel": self.name, "bot": self.platform.bot_id, "username": self.platform.username,
                "polling": int(self.polling), "last_progress": round(self.last_progress, 3),
                "stall_s": self.settings.stall_s, "last_error": self.last_error[:300], **self.counts}

    def _failed(self, exc: BaseException) -> None:
        self.counts["errors"] += 1
        self.last_error = f"{time.strftime('%H:%M:%S')} {exc}"

    # --- the poller ---

    async def _poll(self, stop: asyncio.Event) -> None:
        with contextlib.suppress(PlatformAway, PlatformRefused):  # polling cannot start while a webhook is set
            await self.platform.drop_webhook()
        lease = Lease(self.bus.redis, self.bus.keys.channel_poller(self.name, self.platform.bot_id),
                      self.instance_id, ttl_ms=int((self.hung_s + self.settings.poll_grace_s) * 1000))
        failures = 0
        try:
            while not stop.is_set():
                try:
                    if not await lease.take() and not await self._take_over_dead(lease):
                        self.polling = False
                        await _sleep_or_stop(stop, min(5.0, lease.ttl_ms / 3000))
                        continue
                    self.polling = True
                    await self._poll_once(lease)
                    failures = 0
                except PlatformAway as exc:
                    self._failed(exc)
                    delay = exc.retry_after or RETRY_DELAYS[min(failures, len(RETRY_DELAYS) - 1)]
                    failures += 1
                    log.warning("%s poll: %s; again in %.1fs", self.name, exc, delay)
                    await _sleep_or_stop(stop, delay)
                except TimeoutError:  # a poll that hung past its own timeout: a fresh connection
                    self._failed(TimeoutError("a poll hung; reconnecting"))
                    failures += 1
                    log.warning("%s poll hung past %ss; reconnecting", self.name, self.hung_s)
                    await self.platform.close()
                except PlatformRefused as exc:  # e.g. the token was revoked: said, then tried again slowly
                    self._failed(exc)
                    log.error("%s poll refused: %s", self.name, exc)
                    await _sleep_or_stop(stop, 30.0)
                except CONNECTION_ERRORS as exc:
                    self._failed(exc)
                    failures += 1
                    log.warning("%s poll: Redis away (%s)", self.name, exc)
                    await _sleep_or_stop(stop, RETRY_DELAYS[min(failures, len(RETRY_DELAYS) - 1)])
                except Exception as exc:  # a poller that ended would leave the bot deaf, silently
                    self._failed(exc)
                    log.exception("%s poll failed unexpectedly; again in 5s", self.name)
                    await _sleep_or_stop(stop, 5.0)
        finally:
            self.polling = False
            with contextlib.suppress(*CONNECTION_ERRORS):
                await lease.release()

    # --- or a webhook: the platform pushes, every replica receives ---

    async def _webhook(self, stop: asyncio.Event) -> None:
        """Serve the webhook until ``stop``: each request checked for the secret, written to the inbox once
        (the platform retries until it gets a 2xx, so a repeat is dropped by its update id), then answered."""
        secret = self.settings.webhook_secret()
        await patiently(lambda: self.platform.set_webhook(self.settings.webhook_url, secret), what="setWebhook")
        host, _, port = self.settings.webhook_listen.rpartition(":")
        app = Starlette(routes=[Route(self.settings.webhook_path(), partial(self._pushed, secret), methods=["POST"])])
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=int(port), log_config=None, access_log=False,
                                               lifespan="off"))
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]  # our loop's
        serving = asyncio.create_task(server.serve())
        try:
            while not stop.is_set() and not serving.done():
                try:
                    problem = await self.platform.webhook_error()
                    self.polling, self.last_progress = True, time.time()
                    if problem:
                        self._failed(PlatformAway(f"Telegram could not deliver to the webhook: {problem}"))
                except (PlatformAway, PlatformRefused) as exc:
                    self._failed(exc)
                await _sleep_or_stop(stop, WEBHOOK_CHECK_S)
        finally:
            self.polling = False
            server.should_exit = True
            await serving

    async def _pushed(self, secret: str, request: Request) -> Response:
        given = request.headers.get("x-telegram-bot-api-secret-token", "")
        if not hmac.compare_digest(given.encode(), secret.encode()):
            return JSONResponse({"error": "the secret token is missing or wrong"}, status_code=401)
        body = await request.body()
        if len(body) > WEBHOOK_MAX_BYTES:
            return JSONResponse({"error": "too large"}, status_code=413)
        try:
            event_id, update = self.platform.parse(json.loads(body))
        except (ValueError, TypeError, KeyError) as exc:
            return JSONResponse({"error": f"not an update: {exc}"}, status_code=400)
        if update is not None:
            inbox = self.bus.keys.channel_inbox(self.name, self.platform.bot_id)
            seen = self.bus.keys.channel_delivery(self.name, f"pushed:{event_id}")
            args: list[Any] = [PUSHED_KEEP_S, INBOX_KEEP]
            for key, value in encode(update).items():
                args.extend((key, value))
            try:
                if await self._take_pushed(keys=[seen, inbox], args=args):
                    self.counts["in"] += 1
            except CONNECTION_ERRORS:  # not taken: the platform delivers it again
                return JSONResponse({"error": "busy"}, status_code=503)
        self.last_progress = time.time()
        return JSONResponse({"ok": True})

    async def _take_over_dead(self, lease: Lease) -> bool:
        """The lease of a holder whose heartbeat has stopped (killed, its host gone): ours at once."""
        holder: bytes | None = await self.bus.redis.get(lease.key)  # type: ignore[assignment]  # bytes
        if holder is None or holder.decode() in await alive(self.bus, ROLE):
            return False
        lease.held = bool(await self._take_over(keys=[lease.key], args=[holder, self.instance_id, lease.ttl_ms]))
        if lease.held:
            log.info("%s poller taken over from %s (no heartbeat)", self.name, holder.decode())
        return lease.held

    async def _poll_once(self, lease: Lease) -> None:
        offset_key = self.bus.keys.channel_offset(self.name, self.platform.bot_id)
        offset = int(await self.bus.redis.get(offset_key) or 0)
        async with asyncio.timeout(self.hung_s):
            next_offset, updates = await self.platform.poll(offset)
        if next_offset != offset:
            args: list[Any] = [self.instance_id, next_offset, INBOX_KEEP]
            for update in updates:
                fields = encode(update)
                args.append(len(fields) * 2)
                for key, value in fields.items():
                    args.extend((key, value))
            inbox = self.bus.keys.channel_inbox(self.name, self.platform.bot_id)
            if await self._take(keys=[lease.key, inbox, offset_key], args=args) != 1:
                lease.held = False  # another poller holds it now: it fetches these again
                return
            self.counts["in"] += len(updates)
        self.last_progress = time.time()

    # --- the handler ---

    async def handle(self, message: Message, _stream: str) -> list[Any]:
        if not isinstance(message, ChannelUpdate):
            return []
        try:
            await self._handle(message)
        except PlatformAway as exc:  # still away after PATIENCE_S: left pending, delivered again later
            self._failed(exc)
            raise PlatformDown(f"{self.name} is away ({exc}); update {message.event_id} stays pending") from None
        except PlatformRefused as exc:  # will never work (the person blocked the bot, say): counted, logged
            self._failed(exc)
            log.warning("%s: update %s not answered: %s", self.name, message.event_id, exc)
        return []

    async def _handle(self, update: ChannelUpdate) -> None:
        identity = await self.access.identity(update.user, update.username)
        if update.press is not None:
            await self._pressed(identity, update)
            return
        if identity is None:
            await self._stranger(update)
            return
        if update.group and self.settings.require_mention and not update.mentioned:
            return
        words = update.text.strip().split(maxsplit=1)
        command = words[0].split("@")[0].lower() if words and words[0].startswith("/") else ""
        if command == "/new":
            await self.bus.redis.incr(self.bus.keys.channel_generation(self.name, update.user, update.chat))
            await self._say(update.chat, "Started a fresh conversation.")
            return
        session = await self._session(identity, update)
        if command == "/stop":
            await self.turns.cancel(session, by=identity.name)
            await self._say(update.chat, "Stopping.")
            return
        if command in ("/start", "/help"):
            await self._say(update.chat, HELP)
            return
        text = update.text
        if update.files:
            text = (text + "\n\n" + await self._save_files(update)).strip()
        if not text:
            return
        await self._turn(identity, session, update, text)

    async def _session(self, identity: Identity, update: ChannelUpdate) -> str:
        """Each chat is a session of its own, per person (in a group, each member's own lane); /new starts
        a fresh one."""
        generation = int(await self.bus.redis.get(
            self.bus.keys.channel_generation(self.name, update.user, update.chat)) or 0)
        chat = update.chat.lstrip("-")
        name = f"{'group' if update.group else 'chat'}-{chat}" + (f"-{generation}" if generation else "")
        return qualify(identity, name)

    async def _say(self, chat: str, text: str, *, buttons: Buttons = ()) -> str:
        sent = ""
        for piece in self.surface.render(text):
            sent = await self.surface.send(chat, piece, buttons=buttons)
        self.counts["out"] += 1
        return sent

    async def _stranger(self, update: ChannelUpdate) -> None:
        """A stranger gets a pairing code once (in a private chat only), and never a model call."""
        if update.group:
            return
        code, new = await self.access.code_for(update.user, update.username)
        log.info("%s: a stranger wrote %s", self.name, kv(user=update.user, username=update.username, code=code))
        if new:
            await self._say(update.chat, f"I don't know you yet. If you know who runs me, give them this code: "
                                         f"{code}\n(they let you in with: pincer channels pair {code})")

    async def _turn(self, identity: Identity, session: str, update: ChannelUpdate, text: str) -> None:
        delivery = Delivery(self.bus, self.name, update.event_id)
        record = await delivery.read()
        if record.get("done"):
            return  # answered before a restart: never twice
        reply = StreamedReply(self.surface, update.chat, delivery, edit_interval_s=self.settings.edit_interval_s,
                              shown=record.get("shown"))
        if "turn" in record:  # started before a restart: the Brain ran it on; its answer is in the transcript
            answer = await self._recorded_answer(session, record["turn"])
        else:
            ran = await self._run_turn(identity, session, update, text, reply, delivery)
            if ran is None:
                return
            answer = ran
        answer, files = _attachments(answer)
        await reply.finish(answer)
        for path in files:
            await self._send_file(update.chat, path)
        await delivery.note(done="1")
        self.counts["out"] += 1

    async def _run_turn(self, identity: Identity, session: str, update: ChannelUpdate, text: str,
                        reply: StreamedReply, delivery: Delivery) -> str | None:
        try:
            turn = await self.turns.start(identity, session, agent_id=self.settings.agent, text=text,
                                          instructions=INSTRUCTIONS.format(platform=self.name.title()),
                                          cancel_if_abandoned=False)
        except Refused as exc:
            await self._say(update.chat, f"⚠ {exc.message}")
            await delivery.note(done="1")
            return None
        await delivery.note(turn=turn.message.message_id)
        reply.start_typing()
        answer = ""
        try:
            async for event in turn.events():
                if isinstance(event, ChatDelta):
                    reply.delta(event.text)
                elif isinstance(event, ChatTool):
                    reply.tool(event)
                elif isinstance(event, ApprovalRequest):
                    await self._ask(update.chat, event)
                elif isinstance(event, ChatReply):
                    answer = event.text
                elif isinstance(event, ChatError):
                    answer = f"⚠ {event.message}"
        finally:
            await turn.close()
            await reply.abandon()
        return answer

    async def _recorded_answer(self, session: str, message_id: str) -> str:
        """The answer of a turn started before a restart, once its Brain has written it."""
        deadline = time.monotonic() + self.turn_timeout_s
        while time.monotonic() < deadline:
            for entry in reversed(await self.sessions.load(session)):
                marks = entry.marks
                if marks.message_id == message_id and (marks.final or marks.stopped):
                    return entry.content or marks.told or "(no answer)"
            await asyncio.sleep(ANSWER_POLL_S)
        return f"⚠ no answer within {self.turn_timeout_s:g}s (gateway.turn_timeout_s)"

    async def _ask(self, chat: str, approval: ApprovalRequest) -> None:
        choices = [("Allow once", f"ap:{approval.approval_id}:o")]
        if approval.always_allowed:
            choices.append(("Always", f"ap:{approval.approval_id}:a"))
        await self._say(chat, f"Allow {approval.tool}?\n\n{approval.summary}",
                        buttons=[choices, [("Deny", f"ap:{approval.approval_id}:d")]])

    async def _pressed(self, identity: Identity | None, update: ChannelUpdate) -> None:
        """A button: checked against who pressed it (only the turn's own person may answer)."""
        assert update.press is not None
        kind, _, rest = update.data.partition(":")
        approval_id, _, choice = rest.partition(":")
        decision = {"o": "allow-once", "a": "allow-always", "d": "deny"}.get(choice)
        if kind != "ap" or decision is None:
            await patiently(lambda: self.platform.answer_press(update.press or "", "This button does nothing now."),
                            what="answer")
            return
        said = "This is not yours to answer."
        if identity is not None:
            try:
                await self.turns.decide_approval(identity, approval_id, decision)
                said = {"allow-once": "Allowed once.", "allow-always": "Allowed from now on.",
                        "deny": "Denied."}[decision]
            except Refused:
                said = "This is not yours to answer, or it was answered already."
        await patiently(lambda: self.platform.answer_press(update.press or "", said), what="answer")
        if said.startswith(("Allowed", "Denied")) and update.platform_message:
            who = f"@{update.username}" if update.username else identity.name if identity else ""
            with contextlib.suppress(PlatformRefused):
                await self.surface.edit(update.chat, update.platform_message,
                                        self.surface.render(f"{said} ({who})")[0])

    async def _save_files(self, update: ChannelUpdate) -> str:
        """The person's files, in the workspace under inbox/<channel>/<user>/; what to tell the agent of them."""
        folder = self.workspace / "inbox" / self.name / update.user
        notes = []
        for file in update.files:
            try:
                data = await patiently(partial(self.platform.fetch_file, file, self.settings.max_file_bytes),
                                       what="fetch a file")
            except (PlatformRefused, PlatformAway) as exc:
                notes.append(f"[The person sent {file.name or 'a file'}, but it was not saved: {exc}]")
                continue
            folder.mkdir(parents=True, exist_ok=True)
            path = _free_name(folder, SAFE_NAME.sub("_", Path(file.name).name).strip("._") or "file")
            path.write_bytes(data)
            notes.append(f"[The person sent a file, saved in the workspace at {path.relative_to(self.workspace)} "
                         f"({len(data)} bytes)]")
        return "\n".join(notes)

    async def _send_file(self, chat: str, relative: str) -> None:
        root = self.workspace.resolve()
        path = (root / relative.strip()).resolve()
        problem = None
        if not path.is_relative_to(root):
            problem = "it is outside the workspace"
        elif not path.is_file():
            problem = "there is no such file in the workspace"
        elif path.stat().st_size > self.settings.max_file_bytes:
            problem = f"it is over {self.settings.max_file_bytes} bytes (channels.{self.name}.max_file_bytes)"
        if problem is not None:
            await self._say(chat, f"(could not send {relative}: {problem})")
            return
        await patiently(lambda: self.platform.send_file(chat, path), what="send a file")


def _attachments(answer: str) -> tuple[str, list[str]]:
    files = [m.group(1).strip() for m in ATTACH.finditer(answer)]
    return (ATTACH.sub("", answer).strip() if files else answer), files


def _free_name(folder: Path, name: str) -> Path:
    path = folder / name
    stem, suffix, n = path.stem, path.suffix, 1
    while path.exists():
        path = folder / f"{stem}-{n}{suffix}"
        n += 1
    return path


async def _sleep_or_stop(stop: asyncio.Event, delay: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), delay)


async def _awaited(task: asyncio.Task[None]) -> None:
    """The poller ends within a poll of ``stop``; waited for, then cancelled if it lingers."""
    with contextlib.suppress(TimeoutError, asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
