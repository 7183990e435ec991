"""A Brain worker: consumer in group ``brain`` running one turn per ``chat:message``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from brain.catalog import ToolCatalog
from brain.config import BrainSettings
from brain.delegation import cancelled_before_start
from brain.deps import TurnDeps
from brain.llm import LiteLLMClient, LLMClient, resolve_model, takes_litellm, warm_up
from brain.scheduler import Scheduler
from brain.session_order import SessionOrder
from brain.spend import Governor
from brain.turn import FirstReads, Turn
from bus.admission import RateLimits
from bus.answers import Reply
from bus.broadcast import BroadcastReader
from bus.consumer import GroupConsumer, HandedOver, delivery
from bus.keys import BRAIN_GROUP
from bus.log import kv
from bus.metrics import Meter
from bus.presence import Presence
from bus.protocol import ChatCancel, ChatError, ChatMessage, ChatReply, ErrorCode, Message
from bus.reaper import Reaper
from bus.redis_client import RedisAway
from bus.replies import ReplyInbox
from bus.streams import Bus
from memory.flight import FlightRecorder
from memory.longterm import LongTermMemory
from memory.sessions import SessionStore

log = logging.getLogger("brain.worker")
SEEN_KEEP_S = 90 * 86_400


def default_llm(settings: BrainSettings) -> LLMClient | None:
    model = resolve_model(settings.model)
    if model is None:
        return None
    return LiteLLMClient(
        model=model,
        api_base=settings.api_base,
        api_key=settings.api_key.get_secret_value() if settings.api_key else None,
        timeout_s=settings.llm_timeout_s,
        retries=settings.llm_retries,
        connect_patience_s=settings.llm_connect_patience_s,
        fallbacks=settings.fallbacks,
        openai_direct=settings.openai_direct,
        prompt_cache=settings.prompt_cache,
        connections=settings.max_turns,
    )


class BrainWorker:
    def __init__(self, bus: Bus, settings: BrainSettings, *, instance_id: str, llm: LLMClient | None,
                 heartbeat_s: float = 3.0, rate: RateLimits | None = None, pause_at: str = "") -> None:
        self.bus, self.settings, self.instance_id = bus, settings, instance_id
        self.inbox = ReplyInbox(bus, instance_id)
        meter = Meter()
        recorder = FlightRecorder(bus.redis, bus.keys, keep_s=settings.record.keep_s, send=bus.batcher.send) \
            if settings.record.enabled else None
        sessions = SessionStore(bus.redis, bus.keys, cache_bytes=int(settings.transcript_cache_mb * 2**20),
                                batcher=bus.batcher)
        self.deps = TurnDeps(bus=bus, inbox=self.inbox, sessions=sessions,
                             memory=LongTermMemory(bus.redis, bus.keys),
                             catalog=ToolCatalog(bus, self.inbox, timeout_s=settings.tools_list_timeout_s),
                             settings=settings, llm=llm, meter=meter, spend=Governor(bus, settings, meter),
                             recorder=recorder, pause_at=pause_at)
        self._llm_override = llm  # one client for every agent (tests' fakes); None: each agent's own model
        self._llms: dict[str, LLMClient | None] = {}
        self.presence = Presence(bus, "brain", instance_id, interval_s=heartbeat_s,
                                 details=lambda: {"in_flight": len(self._running), "capacity": settings.max_turns,
                                                  "waiting": self.consumer.waiting,
                                                  "model": resolve_model(settings.model) or "(none)",
                                                  "agents": ",".join(settings.agent_ids()),
                                                  "metrics": self.deps.meter.snapshot()})
        self._sessions = SessionOrder(bus, instance_id, lease_s=settings.session_lease_s,
                                      wait_s=settings.session_wait_s or settings.max_turn_s + 60)
        self.control = BroadcastReader(bus, bus.keys.brain_control, self._on_control)
        self._running: dict[str, asyncio.Task[Any]] = {}  # session id -> the task running its turn
        self._cancels: dict[str, str] = {}  # session id -> who cancelled its running turn
        # Message id -> set when its turn here ends. A second copy (a resumed parent sends its sub-agent's
        # message again) waits for the first: the session's lease, held per Brain, would let both in.
        self._handling: dict[str, asyncio.Event] = {}
        # A message waiting for its session's earlier turn gives its turn slot away meanwhile (up to
        # max_waiting of them), so one busy session cannot keep other sessions' messages unread.
        self.consumer = GroupConsumer(bus, streams=[bus.keys.brain_inbox], group=BRAIN_GROUP,
                                      consumer=instance_id, handler=self.handle, concurrency=settings.max_turns,
                                      aside=settings.max_waiting)
        # A turn whose Brain died is taken over (and resumed from its transcript) by another Brain.
        self.reaper = Reaper(bus, self.consumer, bus.settings, on_poison=self._poisoned)
        self.deps.set_aside, self.deps.take_back = self.consumer.set_aside, self.consumer.take_back
        self.scheduler = Scheduler(bus, settings.scheduler, instance_id=instance_id, meter=meter,
                                   heartbeats=settings.heartbeats, rate=rate) if settings.scheduler.enabled else None

    async def handle(self, message: Message, stream: str) -> Sequence[Reply]:
        if isinstance(message, ChatCancel):  # sent to the group: pass it to every Brain
            await self.bus.publish(self.bus.keys.brain_control, message)
            return []
        if not isinstance(message, ChatMessage):
            log.warning("ignored %s: not supported by this Brain yet", message.type)
            return []
        while (earlier := self._handling.get(message.message_id)) is not None:
            self.consumer.set_aside()
            await earlier.wait()
        self._handling[message.message_id] = done = asyncio.Event()
        try:
            return await self._handle_turn(message)
        finally:
            del self._handling[message.message_id]
            done.set()

    async def _handle_turn(self, message: ChatMessage) -> Sequence[Reply]:
        # The turn's first reads go with the session's taking: one round trip.
        carry, read = FirstReads.carried(self.deps, message)
        async with self._sessions.turn(message, on_wait=self.consumer.set_aside, carry=carry) as lease:
            await self.consumer.take_back()  # a turn slot again, if it gave its own away while waiting
            log.info("turn start %s", kv(session=message.session_id, message=message.message_id))
            if message.job is None:  # the identity talks to the agent itself (heartbeats skip idle owners)
                seen, at = self.bus.keys.identity_seen(message.sender), f"{time.time():.3f}"
                self.bus.batcher.send(lambda pipe: pipe.set(seen, at, ex=SEEN_KEEP_S))  # rides the turn's next write
            agent = self.settings.for_agent(message.agent_id)
            if agent is None:
                return [(message.reply_to, ChatError(
                    session_id=message.session_id, message_id=message.message_id, code=ErrorCode.INVALID_ARGUMENTS,
                    message=f"no agent named {message.agent_id!r}; agents: {', '.join(self.settings.agent_ids())}"))]
            turn = Turn(replace(self.deps, settings=agent, llm=self._llm(message.agent_id, agent)), message, lease,
                        first=None if lease.carried is None else read(lease.carried))
            task = asyncio.current_task()
            assert task is not None
            self._running[message.session_id] = task
            started = time.monotonic()
            try:
                # A sub-agent whose parent stopped before it began: cancelled now (after it is findable
                # above, so a cancel sent meanwhile is not missed either).
                by = await cancelled_before_start(self.bus, message)
                final = await turn.run() if by is None else turn.cancelled(by)
            except asyncio.CancelledError:
                if message.session_id not in self._cancels:
                    raise  # the Brain itself is stopping
                task.uncancel()
                final = await turn.cancel(self._cancels[message.session_id])
            except HandedOver:
                raise  # another Brain holds the session now: it finishes the turn and answers
            except RedisAway as exc:
                # Not the turn's fault: the consumer keeps its message and runs it again once Redis takes
                # writes (a failover, a restart); that run resumes the turn from its transcript.
                log.warning("Redis away mid-turn; the turn resumes once Redis is back %s: %s",
                            kv(session=message.session_id, message=message.message_id), exc)
                raise
            except Exception as exc:  # the person must always hear back
                log.exception("turn crashed %s", kv(session=message.session_id))
                final = ChatError(session_id=message.session_id, message_id=message.message_id,
                                  code=ErrorCode.UNHANDLED, message=f"the Brain failed: {type(exc).__name__}: {exc}")
            finally:
                self._running.pop(message.session_id, None)
                self._cancels.pop(message.session_id, None)
        meter = self.deps.meter
        meter.count("pincer_chat_turns", message.agent_id, "ok" if isinstance(final, ChatReply) else final.code.value)
        meter.observe("pincer_chat_turn_seconds", time.monotonic() - started, message.agent_id)
        return [(message.reply_to, final)]

    def _llm(self, agent_id: str, settings: BrainSettings) -> LLMClient | None:
        if self._llm_override is not None:
            return self._llm_override
        if agent_id not in self._llms:
            self._llms[agent_id] = default_llm(settings)
        return self._llms[agent_id]

    async def _poisoned(self, message: Message) -> Sequence[Reply]:
        """A message whose turn killed Brain after Brain: tell the person instead of trying again."""
        if not isinstance(message, ChatMessage):
            return []
        return [(message.reply_to, ChatError(
            session_id=message.session_id, message_id=message.message_id, code=ErrorCode.WORKER_LOST,
            message=f"the Brains running this message stopped {delivery.get()} times before finishing it; it was "
                    "set aside (see `pincer dead list`). What was done is in the session transcript."))]

    def _takes_litellm(self) -> bool:
        """Whether any agent's model (or fallback, or cost budget) needs litellm: else it is never imported."""
        for agent_id in self.settings.agent_ids():
            agent = self.settings.for_agent(agent_id)
            assert agent is not None
            models = [resolve_model(agent.model) or "", *agent.fallbacks]
            if any(takes_litellm(m, openai_direct=agent.openai_direct) for m in models if m):
                return True
        return False

    async def _on_control(self, message: Message) -> None:
        """chat:cancel reaches every Brain; the one running that session's turn stops it."""
        if isinstance(message, ChatCancel) and message.session_id in self._running:
            self._cancels[message.session_id] = message.by
            self._running[message.session_id].cancel()

    async def run(self, stop: asyncio.Event) -> None:
        if self._llm_override is None and self._takes_litellm():
            # litellm takes seconds to import: here, off the loop, not in the first turn (a stalled
            # loop misses its lease renewals and another Brain would take its turns over).
            await asyncio.to_thread(warm_up)
        # Each service is closed in reverse order of its start, whatever fails on the way (or in a close).
        async with contextlib.AsyncExitStack() as services:
            await self.inbox.start()
            services.push_async_callback(self.inbox.close)
            await self.control.start()
            services.push_async_callback(self.control.close)
            await self.presence.start()
            services.push_async_callback(self.presence.stop)
            await self.reaper.start()
            services.push_async_callback(self.reaper.close)
            services.push_async_callback(self._close_llms)
            model = resolve_model(self.settings.model) or "(none configured)"
            log.info("brain ready: model %s", model)
            if self.scheduler is not None:
                scheduling = asyncio.create_task(self.scheduler.run(stop), name="scheduler")
                services.push_async_callback(_awaited, scheduling)
            await self.consumer.run(stop)

    async def _close_llms(self) -> None:
        """Each agent's model connections closed, whatever its model's road."""
        for llm in self._llms.values():
            if isinstance(llm, LiteLLMClient):
                await llm.close()


async def _awaited(task: asyncio.Task[Any]) -> None:
    """A service task, awaited at the end (it stops on the same event as the consumer)."""
    await task
