"""A chat turn as the Gateway runs it, whatever dialect asked: admit it, publish it, follow its events.

Admission decides everything before the Brain hears of the message: the
token may use the agent, a Brain is there to answer and not too far behind,
the token's rate allows it, and the session is the token's (a new one
becomes so). A turn whose client goes away before it ends is cancelled, so
no tool keeps running for nobody.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from starlette.types import Receive

from bus import otel, trace
from bus.log import kv
from bus.presence import instances
from bus.protocol import ChatCancel, ChatError, ChatMessage, ChatReply, ErrorCode, Message
from bus.replies import ReplyInbox
from bus.streams import CONNECTION_ERRORS, Bus
from gateway.config import GatewaySettings
from gateway.errors import Refused, not_found
from gateway.events import SessionEvents
from gateway.limits import CallerLimits
from gateway.session_names import owner_of, shown_to
from gateway.tokens import Identity
from memory.sessions import SessionStore

log = logging.getLogger("gateway.turns")

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
        self._followers: set[asyncio.Task[None]] = set()
        self._brains: tuple[float, Brains] = (0.0, Brains(0, frozenset()))
        self._cancels: set[asyncio.Task[None]] = set()

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

    async def admit(self, identity: Identity, session_id: str, *, agent_id: str, text: str,
                    instructions: str | None = None, ttl_s: int = 0, traceparent: str | None = None) -> ChatMessage:
        """The message to publish, or ``Refused`` saying why it will not run.

        The request's trace starts here (a child of the client's ``traceparent`` header, if valid)."""
        trace.current.set(trace.start(traceparent))
        if not identity.may_use(agent_id):
            raise Refused(403, ErrorCode.FORBIDDEN, f"this token may not use agent {agent_id!r}; "
                          f"it may use: {', '.join(identity.agents or ())}")
        brains = await self.brains()
        if not brains.count:
            raise Refused(503, ErrorCode.SERVICE_UNAVAILABLE, "no Brain is running to answer; start one with "
                          "`pincer brain` (or `pincer up`)", retry_after=5)
        if agent_id not in brains.agents:
            raise not_found(f"no agent named {agent_id!r}; agents: {', '.join(sorted(brains.agents))}")
        await self.limits.check_backlog()
        await self.limits.take_message(identity.name)
        seq = await self.sessions.claim_and_number(session_id, identity.name, owner=owner_of(session_id),
                                                   operator=identity.operator, ttl_s=ttl_s)
        if seq is None:  # someone else's: as if it did not exist
            raise not_found(f"no session {shown_to(identity, session_id)!r}")
        message = ChatMessage(session_id=session_id, agent_id=agent_id, sender=identity.name, text=text,
                              reply_to=self.inbox.stream, seq=seq, instructions=instructions or None)
        log.info("message in %s", kv(session=session_id, message=message.message_id, sender=identity.name))
        return message

    async def events(self, message: ChatMessage, *, cancel_if_abandoned: bool = True) -> AsyncIterator[Message]:
        """Every event of one turn, ending with its reply or error (or a Gateway-side timeout), each
        also appended to the session's event log.

        A caller that stops listening before the end cancels the turn (unless told not to).
        """
        ended = False
        opened, traceparent = otel.begin(f"invoke_agent {message.agent_id}", gen_ai__operation__name="invoke_agent",
                                         gen_ai__agent__name=message.agent_id,
                                         gen_ai__conversation__id=message.session_id)
        outcome: str | None = "went away"
        try:
            async with self.inbox.expect(message.message_id) as queue:
                token = trace.current.set(traceparent or trace.current.get())  # the Brain's work: our span's child
                try:
                    # Numbered already: a message not sent would hold the session's later ones back, so a
                    # failover or restart is waited out (a second copy resumes the turn, never runs it twice).
                    await self.bus.publish_until_sent(self.bus.keys.brain_inbox, message)
                finally:
                    trace.current.reset(token)
                try:
                    await self.log.append(message.session_id, message)
                except CONNECTION_ERRORS as exc:  # live followers miss the message; its turn goes on
                    log.warning("session event log not written %s: %s", kv(session=message.session_id), exc)
                try:
                    async with asyncio.timeout(self.settings.turn_timeout_s):
                        while True:
                            event = await queue.get()
                            ended = isinstance(event, (ChatReply, ChatError))
                            if ended:
                                outcome = event.code.value if isinstance(event, ChatError) else None
                            await self.log.append(message.session_id, event)
                            yield event
                            if ended:
                                return
                except TimeoutError:
                    ended, outcome = True, ErrorCode.TIMEOUT.value
                    timeout = ChatError(session_id=message.session_id, message_id=message.message_id,
                                        code=ErrorCode.TIMEOUT,
                                        message=f"no answer from the Brain within {self.settings.turn_timeout_s:g}s "
                                                "(gateway.turn_timeout_s)")
                    await self.log.append(message.session_id, timeout)
                    yield timeout
        finally:
            otel.end(opened, error=outcome)
            if not ended and cancel_if_abandoned:
                self.cancel_soon(message.session_id, by=f"{message.sender} (client went away)")

    def follow(self, message: ChatMessage, on_end: Callable[[], None]) -> None:
        """Run the turn to its end in the background (its events go to the session's log only):
        for clients that read the log, so a dropped connection does not cancel the turn."""
        async def run() -> None:
            try:
                async for _ in self.events(message, cancel_if_abandoned=False):
                    pass
            except Exception:
                log.exception("following a turn failed %s", kv(session=message.session_id))
            finally:
                on_end()

        task = asyncio.get_running_loop().create_task(run())
        self._followers.add(task)
        task.add_done_callback(self._followers.discard)

    async def cancel(self, session_id: str, *, by: str) -> None:
        await self.bus.publish(self.bus.keys.brain_control, ChatCancel(session_id=session_id, by=by))
        log.info("cancel asked %s", kv(session=session_id, by=by))

    def cancel_soon(self, session_id: str, *, by: str) -> None:
        """Cancel from a request that is itself being torn down: its own task may not await any more."""
        task = asyncio.get_running_loop().create_task(self.cancel(session_id, by=by))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def close(self) -> None:
        for follower in list(self._followers):  # the Gateway is stopping: those turns lose their follower
            follower.cancel()
        await asyncio.gather(*self._followers, return_exceptions=True)
        if self._cancels:
            await asyncio.gather(*self._cancels, return_exceptions=True)


async def until_disconnected(receive: Receive) -> None:
    """Return when the client of a plain (not streamed) request goes away (its body is read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
