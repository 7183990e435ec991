"""The agent's questions (ask_user) in a chat: shown as messages with buttons, answered by a press or, for a
question without choices, by the person's next message in that chat; each answer goes through the Gateway's
``TurnRunner.answer_question``, which checks it is the turn's own person (docs/ask-user.md)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable

from bus.numbers import whole_number
from bus.protocol import ChannelUpdate, ErrorCode, QuestionRequest
from bus.streams import Bus
from gateway.channels.errors import PlatformRefused
from gateway.channels.platform import Patient, Platform, patiently
from gateway.tokens import Identity
from gateway.turns.refusal import Refused
from gateway.turns.runner import TurnRunner

Say = Callable[..., Awaitable[str]]  # the worker's ``_say(chat, text, *, buttons=())``


class ChatQuestions:
    def __init__(self, bus: Bus, channel: str, turns: TurnRunner, platform: Platform, surface: Patient,
                 say: Say) -> None:
        self.bus, self.channel, self.turns = bus, channel, turns
        self.platform, self.surface, self.say = platform, surface, say

    async def put(self, update: ChannelUpdate, request: QuestionRequest) -> None:
        """The agent's questions, each a message: its choices as buttons (``q:<id>:<question>:<choice>``, within
        Telegram's 64 bytes), or, without choices, answered by the person's next message in this chat."""
        count = len(request.questions)
        for n, question in enumerate(request.questions):
            head = f"❓ {question.text}" + (f"  ({n + 1}/{count})" if count > 1 else "")
            if question.choices:
                pressed = [(choice, f"q:{request.question_id}:{n}:{c}") for c, choice in enumerate(question.choices)]
                # two a row: six choices stay within Discord's five rows and fit a phone's width
                await self.say(update.chat, head, buttons=[pressed[i:i + 2] for i in range(0, len(pressed), 2)])
            else:
                await self.say(update.chat, f"{head}\n\n(Answer with your next message here.)")
        if any(not q.choices for q in request.questions):
            left_s = max(1, (request.expires_at - int(time.time() * 1000)) // 1000 + 1)
            await self.bus.redis.set(self.bus.keys.channel_awaiting(self.channel, update.user, update.chat),
                                     request.question_id, ex=left_s)

    async def answered_in_words(self, identity: Identity, update: ChannelUpdate) -> bool:
        """Whether the message answers a question of this person's waiting in this chat for written words."""
        key = self.bus.keys.channel_awaiting(self.channel, update.user, update.chat)
        raw: bytes | None = await self.bus.redis.get(key)  # type: ignore[assignment]  # bytes
        if raw is None:
            return False
        question_id = raw.decode()
        waiting = await self.turns.questions.unanswered(question_id)
        open_text = [n for n in waiting[1] if not waiting[0].questions[n].choices] if waiting else []
        if waiting is None or not open_text:
            await self.bus.redis.delete(key)
            return False
        given: list[str | None] = [None] * len(waiting[0].questions)
        given[open_text[0]] = update.text.strip()
        try:
            await self.turns.answer_question(identity, question_id, given)
        except Refused as exc:
            await self.say(update.chat, f"⚠ {exc.message}")
            return True
        if len(open_text) == 1:
            await self.bus.redis.delete(key)
        await self.say(update.chat, "✓ Noted.")
        return True

    async def pressed(self, identity: Identity | None, update: ChannelUpdate) -> None:
        """A choice of an agent's question: answered for its own person only, as an approval is."""
        _, question_id, index, choice = [*update.data.split(":"), "", "", ""][:4]
        said, chosen, asked = "This is not yours to answer, or it was answered already.", "", ""
        asked_at, chose = whole_number(index), whole_number(choice)
        if identity is not None and asked_at is not None and chose is not None:
            try:
                waiting = await self.turns.questions.unanswered(question_id)
                if waiting is None or asked_at >= len(waiting[0].questions) or \
                        chose >= len(waiting[0].questions[asked_at].choices):
                    raise Refused(ErrorCode.NOT_FOUND, "gone")
                asked = waiting[0].questions[asked_at].text
                chosen = waiting[0].questions[asked_at].choices[chose]
                given: list[str | None] = [None] * len(waiting[0].questions)
                given[asked_at] = chosen
                await self.turns.answer_question(identity, question_id, given)
                said = f"Answered: {chosen}"
            except Refused:
                chosen = ""
        await patiently(lambda: self.platform.answer_press(update.press or "", said), what="answer")
        if chosen and update.platform_message:
            who = f"@{update.username}" if update.username else identity.name if identity else ""
            with contextlib.suppress(PlatformRefused):
                await self.surface.edit(update.chat, update.platform_message,
                                        self.surface.render(f"❓ {asked}\n\n{said} ({who})")[0])
