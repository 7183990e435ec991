"""A channel process: one chat platform's bot as a participant on the bus (the channel kit's core).

Two halves, joined by a stream in Redis (``channel_inbox``):

- The **intake** (``intake.py``: a poller, one per bot across every replica under a lease, or a
  webhook every replica serves) writes the platform's updates to the inbox: an update is taken
  from the platform only once the bus holds it, and never twice.
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
import logging
import re
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from bus.consumer import GroupConsumer, HandedOver
from bus.log import kv
from bus.presence import Presence
from bus.protocol import (
    ApprovalRequest,
    ChannelSend,
    ChannelUpdate,
    ChatDelta,
    ChatError,
    ChatReply,
    ChatTool,
    Message,
    QuestionRequest,
)
from bus.reaper import Reaper
from bus.replies import ReplyInbox
from bus.streams import Bus
from bus.workspaces import Workspaces
from gateway.channels.access import Access
from gateway.channels.asking import ChatQuestions
from gateway.channels.config import ChannelCommon
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.channels.files import ChatFiles, attachments
from gateway.channels.intake import ROLE, Intake
from gateway.channels.lanes import Lanes
from gateway.channels.platform import Invited, Patient, Platform, backoff, patiently
from gateway.channels.reply import Buttons, Delivery, StreamedReply
from gateway.channels.report import Progress
from gateway.config import GatewaySettings
from gateway.tokens import Identity
from gateway.turns.limits import CallerLimits
from gateway.turns.refusal import Refused
from gateway.turns.runner import TurnRunner
from gateway.turns.session_names import qualify
from memory.sessions import SessionStore

log = logging.getLogger("gateway.channels")

GROUP = "channel"
ANSWER_POLL_S = 0.5  # a restarted channel reads the transcript this often for a turn's answer
SESSION_UNSAFE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9_.:-]+")

INSTRUCTIONS = ("You are talking with a person through {platform}. Keep answers short enough to read on a "
                "phone. To send them a file from the workspace, write a line `[attach: PATH]` (PATH relative "
                "to the workspace); files they send you are saved under inbox/{channel}/ in the workspace.")
HELP = ("Talk to me as you would to a person. /new starts a fresh conversation, /stop stops what I am doing.")



class PlatformDown(HandedOver):
    """An update whose answer the platform would not take: left pending for the reaper to deliver again
    (after ``redis.claim_idle_s``; past ``redis.max_deliveries`` it goes to the dead letters, from where
    `pincer dead retry` sends it again). Its turn is not run again: the delivery record says it ran."""


class ChannelWorker:
    def __init__(self, bus: Bus, platform: Platform, settings: ChannelCommon, gateway: GatewaySettings, *,
                 workspaces: Workspaces, instance_id: str, heartbeat_s: float = 3.0) -> None:
        self.bus, self.platform, self.settings = bus, platform, settings
        self.workspaces, self.instance_id, self.heartbeat_s = workspaces, instance_id, heartbeat_s
        self.name = platform.name
        self.inbox = ReplyInbox(bus, instance_id)
        self.sessions = SessionStore(bus.redis, bus.keys, batcher=bus.batcher)
        self.turns = TurnRunner(bus, self.inbox, self.sessions, CallerLimits(bus, gateway.limits), gateway)
        self.turn_timeout_s = gateway.turn_timeout_s
        self.access = Access(bus, self.name, allow_from=settings.allow_from, agent=settings.agent,
                             pairing_ttl_s=settings.pairing_ttl_s)
        self.surface = Patient(platform)
        self.lanes = Lanes()
        self.progress = Progress()
        self.counts = self.progress.counts
        self.questions = ChatQuestions(bus, self.name, self.turns, platform, self.surface, self._say)
        self.files = ChatFiles(bus, platform, settings, workspaces, self._say)

    # --- the process ---

    async def run(self, stop: asyncio.Event) -> None:
        await self._start_platform(stop)
        if stop.is_set():
            return
        inbox_key = self.bus.keys.channel_inbox(self.name, self.platform.bot_id)
        outbox_key = self.bus.keys.channel_outbox(self.name)  # what the agent says unasked (a job's answer)
        consumer = GroupConsumer(self.bus, streams=[inbox_key, outbox_key], group=GROUP, consumer=self.instance_id,
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
            intake = Intake(self.bus, self.platform, self.settings, instance_id=self.instance_id,
                            progress=self.progress)
            poller = asyncio.create_task(intake.run(stop), name=f"{self.name}:updates")
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
                self.progress.failed(exc)
                delay = backoff(attempt, exc.retry_after)
                log.warning("%s: cannot reach the platform (%s); again in %.1fs", self.name, exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    return

    def details(self) -> dict[str, Any]:
        progress = self.progress
        return {"channel": self.name, "bot": self.platform.bot_id, "username": self.platform.username,
                "polling": int(progress.polling), "last_progress": round(progress.last, 3),
                "stall_s": self.settings.stall_s, "last_error": progress.last_error[:300], **progress.counts}

    # --- the handler ---

    async def handle(self, message: Message, _stream: str) -> list[Any]:
        if not isinstance(message, (ChannelUpdate, ChannelSend)):
            return []
        what = f"update {message.event_id}" if isinstance(message, ChannelUpdate) else f"sending {message.key}"
        try:
            if isinstance(message, ChannelUpdate) and message.press is None and not message.invite:
                async with self.lanes.turn(message.chat) as admitted:
                    await self._handle(message, admitted)
            else:
                await (self._handle(message) if isinstance(message, ChannelUpdate) else self._send_out(message))
        except PlatformAway as exc:  # still away after PATIENCE_S: left pending, delivered again later
            self.progress.failed(exc)
            raise PlatformDown(f"{self.name} is away ({exc}); {what} stays pending") from None
        except PlatformRefused as exc:  # will never work (the person blocked the bot, say): counted, logged
            self.progress.failed(exc)
            log.warning("%s: %s not done: %s", self.name, what, exc)
        return []

    async def _send_out(self, message: ChannelSend) -> None:
        """Said on the agent's own initiative: each piece once, whatever delivers the message again."""
        delivery = Delivery(self.bus, self.name, f"send:{message.key}")
        done = int((await delivery.read()).get("pieces", "0"))
        for n, piece in enumerate(self.surface.render(message.text)):
            if n >= done:
                await self.surface.send(message.chat, piece)
                await delivery.note(pieces=str(n + 1))
        if done == 0:
            self.counts["out"] += 1

    async def _handle(self, update: ChannelUpdate, admitted: Callable[[], None] = lambda: None) -> None:
        """One update; ``admitted`` is called once its turn is admitted (the next of its chat may be)."""
        identity = await self.access.identity(update.user, update.username)
        if update.invite:
            await self._invited(identity, update)
            return
        if update.press is not None:
            await self._pressed(identity, update)
            return
        if identity is None:
            await self._stranger(update)
            return
        # A written answer the agent waits for from this person here (in a group too: no mention needed).
        if update.text.strip() and not update.text.lstrip().startswith("/") and \
                await self.questions.answered_in_words(identity, update):
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
        if not update.text.strip() and not update.files:
            return
        await self._turn(identity, session, update, update.text, admitted)

    async def _invited(self, identity: Identity | None, update: ChannelUpdate) -> None:
        """An invitation into a conversation: taken from someone who may talk to the agent, declined (and the
        stranger's pairing code logged) from anyone else."""
        invited = self.platform
        if not isinstance(invited, Invited):
            return
        log.info("%s: %s invites the bot to %s: %s", self.name, update.user, update.chat,
                 "accepted" if identity else "declined")
        await patiently(lambda: invited.accept_invite(update.chat, identity is not None), what="answer an invitation")
        if identity is None:
            code, _ = await self.access.code_for(update.user, update.username)
            log.info("%s: a stranger wrote %s", self.name, kv(user=update.user, username=update.username, code=code))

    async def _session(self, identity: Identity, update: ChannelUpdate) -> str:
        """Each chat is a session of its own, per person (in a group, each member's own lane); /new starts
        a fresh one."""
        generation = int(await self.bus.redis.get(
            self.bus.keys.channel_generation(self.name, update.user, update.chat)) or 0)
        chat = SESSION_UNSAFE.sub("", update.chat)  # "-5001" (Telegram), "!room:server" (Matrix)
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
        if new and self.platform.tells_strangers:
            await self._say(update.chat, f"I don't know you yet. If you know who runs me, give them this code: "
                                         f"{code}\n(they let you in with: pincer channels pair {code})")

    async def _turn(self, identity: Identity, session: str, update: ChannelUpdate, text: str,
                    admitted: Callable[[], None]) -> None:
        delivery = Delivery(self.bus, self.name, update.event_id)
        record = await delivery.read()
        if record.get("done"):
            return  # answered before a restart: never twice
        reply = StreamedReply(self.surface, update.chat, delivery, edit_interval_s=self.settings.edit_interval_s,
                              shown=record.get("shown"))
        if "turn" in record:  # started before a restart: the Brain ran it on; its answer is in the transcript
            admitted()
            answer = await self._recorded_answer(session, record["turn"])
        else:
            ran = await self._run_turn(identity, session, update, text, reply, delivery, admitted)
            if ran is None:
                return
            answer = ran
        answer, files = attachments(answer)
        await reply.finish(answer)
        for path in files:
            await self.files.send(identity, update.chat, path)
        await delivery.note(done="1")
        self.counts["out"] += 1

    async def _run_turn(self, identity: Identity, session: str, update: ChannelUpdate, text: str,
                        reply: StreamedReply, delivery: Delivery, admitted: Callable[[], None]) -> str | None:
        # A person's files are fetched only once their turn is admitted (a sender past a limit costs nothing).
        files = partial(self.files.save, identity, update) if update.files else None
        try:
            turn = await self.turns.start(identity, session, agent_id=self.settings.agent, text=text,
                                          instructions=INSTRUCTIONS.format(platform=self.name.title(),
                                                                           channel=self.name),
                                          cancel_if_abandoned=False, add_to_text=files)
        except Refused as exc:
            admitted()
            await self._say(update.chat, f"⚠ {exc.message}")
            await delivery.note(done="1")
            return None
        await delivery.note(turn=turn.message.message_id)
        admitted()  # numbered in its session: the next message of this chat comes after it
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
                elif isinstance(event, QuestionRequest):
                    await self.questions.put(update, event)
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
        if update.data.startswith("q:"):
            await self.questions.pressed(identity, update)
            return
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

async def _awaited(task: asyncio.Task[None]) -> None:
    """The poller ends within a poll of ``stop``; waited for, then cancelled if it lingers."""
    with contextlib.suppress(TimeoutError, asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
