"""A chat turn as the Gateway runs it, whatever door asked: admit it, send it, follow its events, close it.

``TurnRunner.start`` is the one turn starter of every door (HTTP, SSE,
WebSocket, OpenAI): it takes one of the token's open-turn places, admits the
message, and sends it before anything is returned to the client, so a
numbered message is never left unsent (it would hold the session's later
ones back). Admission decides everything before the Brain hears of it: the
token may use the agent, a Brain is there to answer and not too far behind,
the token's rate allows it, and the session is the token's (a new one
becomes so). ``Turn.close`` gives back what the turn holds, once, whether
or not anyone read its events; a turn whose client goes away before it ends
is cancelled, so no tool keeps running for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bus import otel, trace
from bus.log import kv
from bus.loops import Background
from bus.presence import instances
from bus.protocol import (
    ApprovalDecision,
    ChatCancel,
    ChatError,
    ChatMessage,
    ChatReply,
    ErrorCode,
    Message,
    QuestionAnswer,
)
from bus.records import PendingApproval
from bus.replies import ReplyInbox
from bus.streams import Bus
from gateway.config import GatewaySettings
from gateway.tokens import Identity
from gateway.turns.events import SessionEvents
from gateway.turns.limits import CallerLimits, Hold
from gateway.turns.questions import PendingQuestions, checked_answers, gone
from gateway.turns.refusal import Refused, not_found
from gateway.turns.session_names import shown_to
from memory.session_ids import owner_in
from memory.sessions import SessionStore

log = logging.getLogger("gateway.turns")

AGENT_ID = r"^[A-Za-z0-9_-]{1,64}$"

class SendMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=200_000)
    agent_id: str = Field(default="main", pattern=AGENT_ID)
    # Answer 202 at once and run the turn to its end whoever listens: its events are read from
    # GET /v1/sessions/{id}/events (or the WebSocket), and a dropped connection does not cancel it.
    detach: bool = False


BRAINS_CHECK_S = 1.0  # which Brains are alive (and the agents they run) is read at most this often


@dataclass(frozen=True)
class Brains:
    count: int
    agents: frozenset[str]


class TurnRunner:
    def __init__(self, bus: Bus, inbox: ReplyInbox, sessions: SessionStore, limits: CallerLimits,
                 settings: GatewaySettings) -> None:
        self.bus, self.inbox, self.sessions, self.limits, self.settings = bus, inbox, sessions, limits, settings
        self.log = SessionEvents(bus, keep=settings.events.keep, keep_s=settings.events.keep_s)
        self._followers = Background()
        self._brains: tuple[float, Brains] = (0.0, Brains(0, frozenset()))
        self._cancels = Background()
        self.questions = PendingQuestions(bus)

    async def brains(self) -> Brains:
        """The live Brains and the agents they run (every Brain announces its agents)."""
        checked, known = self._brains
        if time.monotonic() - checked > BRAINS_CHECK_S:
            found = await instances(self.bus, "brain")
            agents = {a for i in found for a in (i.get("agents") or "main").split(",") if a}
            known = Brains(len(found), frozenset(agents))
            self._brains = (time.monotonic(), known)
        return known

    async def agents_for(self, identity: Identity) -> list[str]:
        return sorted(a for a in (await self.brains()).agents if identity.may_use(a))

    async def send_detached(self, identity: Identity, session_id: str, fields: dict[str, Any]) -> dict[str, Any]:
        """A message whose turn runs to its end whoever listens (its events go to the session's log)."""
        try:
            body = SendMessage.model_validate(
                {"text": fields.get("text"), "agent_id": fields.get("agent_id") or "main"}
            )
        except ValidationError as exc:
            raise Refused(
                ErrorCode.BAD_REQUEST,
                "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5]),
            ) from None
        turn = await self.start(identity, session_id, agent_id=body.agent_id, text=body.text,
                                      cancel_if_abandoned=False)
        self.follow(turn)
        return {"session_id": shown_to(identity, session_id), "message_id": turn.message.message_id,
                "seq": turn.message.seq}

    async def decide_approval(self, identity: Identity, approval_id: str, decision: Any) -> dict[str, Any]:
        if decision not in ("allow-once", "allow-always", "deny"):
            raise Refused(ErrorCode.BAD_REQUEST, "decision: one of allow-once, allow-always, deny")
        key = self.bus.keys.approval(approval_id)
        raw: dict[bytes, bytes] = await self.bus.redis.hgetall(key)  # type: ignore[assignment]  # bytes
        pending = PendingApproval.decode(raw)
        gone = not_found(f"no pending approval {approval_id!r}: it was answered, or it expired")
        if pending is None:
            raise gone
        if not identity.may_see(await self.sessions.owner(pending.session_id)):
            raise gone  # not the caller's: as if it did not exist
        if not await self.bus.redis.delete(key):  # the first answer wins
            raise gone
        decided = ApprovalDecision(approval_id=approval_id, decision=decision, by=identity.name)
        await self.bus.publish(pending.reply_to, decided)
        await self.log.append(pending.session_id, decided)
        log.info("approval decided %s", kv(approval=approval_id, decision=decision, by=identity.name))
        return {"approval_id": approval_id, "decision": decision, "by": identity.name}

    async def answer_question(self, identity: Identity, question_id: str, given: Any) -> dict[str, Any]:
        """Answer an ask_user call's questions (``given``: one per question, None for one not answered yet), as
        for an approval: only the session's owner (or an operator) may; anyone else finds no such question."""
        pending = await self.questions.find(question_id)
        if not identity.may_see(await self.sessions.owner(pending.session_id)):
            raise gone(question_id)  # not the caller's: as if it did not exist
        answers = checked_answers(pending.questions, given)
        complete = await self.questions.add(question_id, len(pending.questions), answers)
        if complete is None:
            log.info("question partly answered %s", kv(question=question_id, by=identity.name))
            return {"question_id": question_id, "answered": sorted(answers), "complete": False, "by": identity.name}
        answered = QuestionAnswer(question_id=question_id, answers=complete, by=identity.name)
        await self.bus.publish(pending.reply_to, answered)
        await self.log.append(pending.session_id, answered)
        log.info("question answered %s", kv(question=question_id, by=identity.name))
        return {"question_id": question_id, "answers": complete, "complete": True, "by": identity.name}

    async def own_session(self, identity: Identity, session_id: str, *, existing: bool = False) -> None:
        """Refuse (404, as if it did not exist) a session that is not the caller's."""
        owner, has_transcript = await self.sessions.ownership(session_id)
        if owner is None or not identity.may_see(owner) or (existing and not has_transcript):
            raise not_found(f"no session {shown_to(identity, session_id)!r}")

    async def admit(self, identity: Identity, session_id: str, *, agent_id: str, text: str,
                    instructions: str | None = None, ttl_s: int = 0, traceparent: str | None = None,
                    job: str | None = None, history_bytes: int = 0) -> ChatMessage:
        """The message to publish, or ``Refused`` saying why it will not run. Its text, instructions and
        ``history_bytes`` (what the caller writes as a new session's history) count in the day's text.

        The request's trace starts here (a child of the client's ``traceparent`` header, if valid)."""
        trace.current.set(trace.start(traceparent))
        if not identity.may_use(agent_id):
            raise Refused(ErrorCode.FORBIDDEN, f"this token may not use agent {agent_id!r}; "
                          f"it may use: {', '.join(identity.agents or ())}")
        brains = await self.brains()
        if not brains.count:
            raise Refused(ErrorCode.SERVICE_UNAVAILABLE, "no Brain is running to answer; start one with "
                          "`pincer brain` (or `pincer up`)", retry_after=5)
        if agent_id not in brains.agents:
            raise not_found(f"no agent named {agent_id!r}; agents: {', '.join(sorted(brains.agents))}")
        await self.limits.check_backlog()
        # One step: a message refused for its rate takes no number (a number never sent would hold the
        # session's later messages back).
        size = len(text.encode()) + len((instructions or "").encode()) + history_bytes
        seq = await self.limits.take_message(identity.name, size=size, then=self.sessions.claim_call(
            session_id, identity.name, owner=owner_in(session_id), operator=identity.operator, ttl_s=ttl_s))
        if seq is None:  # someone else's: as if it did not exist
            raise not_found(f"no session {shown_to(identity, session_id)!r}")
        message = ChatMessage(session_id=session_id, agent_id=agent_id, sender=identity.name, text=text,
                              reply_to=self.inbox.stream, seq=seq, instructions=instructions or None, job=job,
                              agents=identity.agents_stamp())
        log.info("message in %s", kv(session=session_id, message=message.message_id, sender=identity.name))
        return message

    async def start(self, identity: Identity, session_id: str, *, agent_id: str, text: str, stream: bool = False,
                    instructions: str | None = None, ttl_s: int = 0, traceparent: str | None = None,
                    cancel_if_abandoned: bool = True, job: str | None = None,
                    prepare: Callable[[ChatMessage], Awaitable[None]] | None = None, history_bytes: int = 0,
                    add_to_text: Callable[[], Awaitable[str]] | None = None) -> Turn:
        """A turn admitted and sent (``Refused`` if it may not run): the caller must ``close()`` it.

        ``prepare`` runs after admission and before the message is sent (a client's earlier messages
        written as the new session's history, of ``history_bytes``); ``add_to_text`` too, and what it
        returns is added to the message (a chat user's files: fetched only for a sender who was admitted).
        ``job``: the scheduled job this turn is a run of (`cron run`)."""
        hold = self.limits.hold_turn(identity.name, stream=stream)
        try:
            message = await self.admit(identity, session_id, agent_id=agent_id, text=text,
                                       instructions=instructions, ttl_s=ttl_s, traceparent=traceparent, job=job,
                                       history_bytes=history_bytes)
            if add_to_text is not None:
                message = message.model_copy(update={"text": (text + "\n\n" + await add_to_text()).strip()})
            if prepare is not None:
                await prepare(message)
        except BaseException:
            hold.release()
            raise
        turn = Turn(self, message, hold, cancel_if_abandoned=cancel_if_abandoned)
        try:
            await turn.send()
        except BaseException:
            await turn.close()
            raise
        return turn

    @contextlib.asynccontextmanager
    async def started(self, identity: Identity, session_id: str, **options: Any) -> AsyncIterator[Turn]:
        """``start`` for a request that reads the whole turn itself: closed when the block ends."""
        turn = await self.start(identity, session_id, **options)
        try:
            yield turn
        finally:
            await turn.close()

    def follow(self, turn: Turn, *, ended: Callable[[Message], Awaitable[None]] | None = None) -> None:
        """Run the turn to its end in the background (its events go to the session's log only):
        for clients that read the log, so a dropped connection does not cancel the turn. ``ended`` is
        given the turn's last event."""
        async def run() -> None:
            try:
                last: Message | None = None
                async for event in turn.events():
                    last = event
                if ended is not None and last is not None:
                    await ended(last)
            except Exception:
                log.exception("following a turn failed %s", kv(session=turn.message.session_id))
            finally:
                await turn.close()

        self._followers.start(run())

    async def cancel(self, session_id: str, *, by: str) -> None:
        await self.bus.publish(self.bus.keys.brain_control, ChatCancel(session_id=session_id, by=by))
        log.info("cancel asked %s", kv(session=session_id, by=by))

    def cancel_soon(self, session_id: str, *, by: str) -> None:
        """Cancel from a request that is itself being torn down: its own task may not await any more."""
        self._cancels.start(self.cancel(session_id, by=by))

    async def close(self) -> None:
        await self._followers.finish()  # the Gateway is stopping: those turns lose their follower
        await self._cancels.wait()


class Turn:
    """One admitted turn: its message sent, its events queued from the start for whoever reads them
    (each also appended to the session's event log), and all it holds given back by ``close``."""

    def __init__(self, runner: TurnRunner, message: ChatMessage, hold: Hold, *, cancel_if_abandoned: bool) -> None:
        self.runner, self.message, self.hold = runner, message, hold
        self.cancel_if_abandoned = cancel_if_abandoned
        self.ended = False
        self.outcome: str | None = "went away"
        self._held = contextlib.AsyncExitStack()
        self._queue: asyncio.Queue[Message] | None = None
        self._span: Any = None
        self._closed = False

    async def send(self) -> None:
        """Expect the turn's events, then send its message until Redis takes it."""
        runner, message = self.runner, self.message
        self._queue = await self._held.enter_async_context(runner.inbox.expect(message.message_id))
        self._span, traceparent = otel.begin(f"invoke_agent {message.agent_id}", gen_ai__operation__name="invoke_agent",
                                             gen_ai__agent__name=message.agent_id,
                                             gen_ai__conversation__id=message.session_id)
        token = trace.current.set(traceparent or trace.current.get())  # the Brain's work: our span's child
        runner.log.send(message.session_id, message)  # in the message's own round trip, just before it
        try:
            # Numbered already: a message not sent would hold the session's later ones back, so a
            # failover or restart is waited out (a second copy resumes the turn, never runs it twice).
            await runner.bus.publish_until_sent(runner.bus.keys.brain_inbox, message)
        finally:
            trace.current.reset(token)

    async def events(self) -> AsyncIterator[Message]:
        """Every event of the turn, ending with its reply or error (or a Gateway-side timeout)."""
        assert self._queue is not None, "a turn's events are read after it is sent"
        message, runner = self.message, self.runner
        try:
            async with asyncio.timeout(runner.settings.turn_timeout_s):
                while True:
                    event = await self._queue.get()
                    self.ended = isinstance(event, (ChatReply, ChatError))
                    if self.ended:
                        self.outcome = event.code.value if isinstance(event, ChatError) else None
                        await runner.log.append(message.session_id, event)  # in the log (and all before it)
                    else:  # with the next write: a delta or a tool event does not wait for its round trip
                        runner.log.send(message.session_id, event)
                    yield event
                    if self.ended:
                        return
        except TimeoutError:
            self.ended, self.outcome = True, ErrorCode.TIMEOUT.value
            timeout = ChatError(session_id=message.session_id, message_id=message.message_id, code=ErrorCode.TIMEOUT,
                                message=f"no answer from the Brain within {runner.settings.turn_timeout_s:g}s "
                                        "(gateway.turn_timeout_s)")
            await runner.log.append(message.session_id, timeout)
            yield timeout

    async def close(self) -> None:
        """Give back the open-turn place and the expectation; cancel the turn if nobody saw it end. Once."""
        if self._closed:
            return
        self._closed = True
        self.hold.release()
        try:
            await self._held.aclose()
        finally:
            if self._span is not None:
                otel.end(self._span, error=self.outcome)
            if not self.ended and self.cancel_if_abandoned:
                self.runner.cancel_soon(self.message.session_id, by=f"{self.message.sender} (client went away)")
