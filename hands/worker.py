"""A Hands worker: one consumer in group ``hands`` answering ``tools:list`` and ``tool:execute``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Sequence
from typing import Any

from bus import otel
from bus.answers import Reply
from bus.broadcast import BroadcastReader
from bus.consumer import GroupConsumer, Moved, current_entry, delivery
from bus.keys import HANDS_GROUP
from bus.log import kv
from bus.metrics import Meter
from bus.presence import Presence, alive
from bus.protocol import (
    ErrorCode,
    Message,
    ToolCancel,
    ToolExecute,
    ToolProgress,
    ToolResult,
    ToolsAvailable,
    ToolsList,
    now_ms,
)
from bus.reaper import Reaper
from bus.redis_client import RedisAway
from bus.replies import ReplyInbox
from bus.streams import Bus
from bus.workspace import Workspace
from hands.approvals import ApprovalGate
from hands.background import BackgroundProcesses
from hands.call_records import CallRecords
from hands.config import HandsSettings
from hands.errors import ToolFailure
from hands.executor import Executor
from hands.lanes import GiveBack, Lanes, Park, Run, Ungated, Unrun
from hands.mcp.servers import McpServers
from hands.permissions import PermissionPolicy
from hands.pool_limits import PoolLimits
from hands.questions import PersonAsker
from hands.registry import Category, ToolRegistry
from hands.sandbox.runner import Sandbox
from hands.skills import SkillReport, load_skills, skill_reader
from hands.tools import builtin_tools
from memory.jobs import JobStore
from memory.longterm import LongTermMemory
from memory.recall import Recall

log = logging.getLogger("hands.worker")


def build_registry(settings: HandsSettings | None = None) -> ToolRegistry:
    registry = ToolRegistry()
    for tool in builtin_tools():
        if settings is not None and tool.category is Category.PERSON:  # how long it waits, for the Brain to read
            tool = tool.model_copy(update={"timeout_s": settings.ask_user.timeout_s})
        registry.register(tool)
    return registry


def load_registry(settings: HandsSettings) -> tuple[ToolRegistry, SkillReport]:
    """Built-in tools plus the skills of the configured directories."""
    registry = build_registry(settings)
    registry.register(skill_reader(registry))
    policy = PermissionPolicy(settings.policy, settings.workspace)
    return registry, load_skills(settings.skill_dirs, registry, policy)


class HandsWorker:
    def __init__(self, bus: Bus, settings: HandsSettings, *, worker_id: str, heartbeat_s: float = 3.0) -> None:
        self.bus, self.settings, self.worker_id = bus, settings, worker_id
        self.registry, self.skills = load_registry(settings)
        self.meter = Meter()
        self.sandbox = Sandbox(settings.sandbox, Workspace(settings.workspace).root, meter=self.meter)
        self.background = BackgroundProcesses(bus.redis, bus.keys, worker_id=worker_id,
                                              keep_s=settings.background.keep_s,
                                              max_per_session=settings.background.max_per_session,
                                              max_per_worker=settings.background.max_per_worker)
        self.inbox = ReplyInbox(bus, worker_id)  # answers this worker waits for (approval decisions)
        self.control = BroadcastReader(bus, bus.keys.hands_control, self._on_control)
        self._in_flight: dict[str, asyncio.Task[Any]] = {}
        self._cancelled: dict[str, str] = {}  # call id -> reason, also for calls not yet read
        # Python 3.11 makes a getpid call to find the running loop; current_task(loop) does not.
        self._loop: asyncio.AbstractEventLoop | None = None
        approvals = ApprovalGate(settings.exec, bus=bus, inbox=self.inbox)
        questions = PersonAsker(bus=bus, inbox=self.inbox, timeout_s=settings.ask_user.timeout_s)
        # Memory search's indexes, one per scope searched lately, kept up to date from the log in the background;
        # the heartbeat says how far a long build has come, and at once when it is done.
        self.recall = Recall(bus.redis, bus.keys, max_chunks=settings.recall.max_chunks,
                             log_keep_s=settings.recall.log_keep_s, on_built=lambda: self.presence.beat())
        self.pool = PoolLimits(bus, settings.pool_limits, lease_s=settings.pool_lease_s, wait_s=settings.queue.wait_s)
        self.executor = Executor(self.registry, settings, worker_id=worker_id, sandbox=self.sandbox,
                                 background=self.background, approvals=approvals, questions=questions,
                                 pool=self.pool,
                                 memory=LongTermMemory(bus.redis, bus.keys, recall=self.recall),
                                 progress=self._progress, meter=self.meter, schedules=JobStore(bus))
        self.mcp = McpServers(settings.mcp, self.registry, self.sandbox, bus=bus, worker_id=worker_id,
                              on_change=self._tools_changed)
        self.presence = Presence(bus, "hands", worker_id, interval_s=heartbeat_s, details=self._details)
        self.calls = CallRecords(bus, worker_id, keep_s=settings.call_record_s,
                                 running_here=lambda call_id: call_id in self._in_flight)
        # A call this worker has no room for goes to the pool's backlog (hands/backlog.py); a lane's
        # stream is read only as far as there is room in it. The consumer's own limit only bounds
        # what is handled at once (running, parking, or waiting in the limiter's queue).
        self.lanes = Lanes(bus, settings.queue, self.executor.limiter, self.registry, worker_id=worker_id,
                           freed=lambda: self.consumer.room_freed(), pool_limits=settings.pool_limits)
        self.consumer = GroupConsumer(
            bus,
            streams=[bus.keys.hands_requests, bus.keys.hands_worker(worker_id)],
            group=HANDS_GROUP,
            consumer=worker_id,
            handler=self.handle,
            concurrency=settings.concurrency.global_ + settings.queue.depth,
            room=self.lanes.room_in,
        )
        self.reaper = Reaper(bus, self.consumer, bus.settings, on_poison=self._poisoned)

    def _details(self) -> dict[str, Any]:
        """What `pincer status` shows of this worker."""
        return {
            "tools": len(self.registry.names()),
            "in_flight": self.consumer.in_flight,
            "running": len(self._in_flight),
            "capacity": self.settings.concurrency.global_,
            "queued": self.executor.limiter.waiting,
            "sandbox": self.sandbox.tier,
            "backlog": json.dumps(self.lanes.status()),
            "metrics": self.meter.snapshot(),
            "indexing": self.recall.building(),  # always written: a heartbeat's hash keeps fields it is not given
            **({"mcp": json.dumps(self.mcp.status())} if self.mcp.connections else {}),
        }

    async def _progress(self, stream: str, progress: ToolProgress) -> None:
        """Progress is advisory: Redis away (a restart, a failover) delays it, never fails the call."""
        try:
            await self.bus.publish(stream, progress)
        except RedisAway as exc:
            log.info("progress not sent %s: %s", kv(call=progress.call_id, status=progress.status), exc)

    async def _tools_changed(self) -> None:
        """An MCP server's tools came or changed: a new digest tells every Brain to ask again."""
        try:
            await self.consumer.add_gated(await self.lanes.open())
            await self.bus.redis.set(self.bus.keys.tools_digest, self.registry.digest())
        except RedisAway as exc:
            log.warning("tools digest not updated: %s", exc)

    async def handle(self, message: Message, stream: str) -> Sequence[Reply]:
        match message:
            case ToolExecute():
                return await self._route(message, stream)
            case ToolsList():
                if message.deadline is not None and message.deadline <= now_ms():
                    return []  # the asker has given up; an answer would only litter its stream
                policy = self.executor.tool_policy
                tools = [spec for spec in self.registry.brain_view() if policy.decide(
                    self.registry.get(spec.name), agent=message.agent_id, sender=message.sender).allowed]
                reply = ToolsAvailable(request_id=message.request_id, tools=tools,
                                       skills=self.registry.instructions(), digest=self.registry.digest(),
                                       worker_id=self.worker_id)
                return [(message.reply_to, reply)]
            case _:
                log.warning("ignored %s on %s: Hands does not handle it", message.type, stream)
                return []

    async def _route(self, call: ToolExecute, stream: str) -> Sequence[Reply]:
        entry = current_entry.get()
        match self.lanes.route(call, stream, entry, delivery=delivery.get()):
            case Ungated():
                return await self._handle_call(call, stream)
            case Run(gates):
                self.lanes.left(stream, gates)  # if from a lane, refill it
                self.lanes.take(gates)  # before any await: the next read counts it
                try:
                    return await self._handle_call(call, stream)
                finally:
                    self.lanes.release(gates)
            case Unrun(gates, failure):
                self.lanes.left(stream, gates)
                return [(call.reply_to, self.executor.unrun(call, failure))]
            case Park(gates):
                full = await self.lanes.park(call, entry, gates)
                if full is None:
                    raise Moved("parked in the pool's backlog")
                self.lanes.left(stream, gates)
                return [(call.reply_to, self.executor.unrun(call, full))]
            case GiveBack(gates):
                await self.lanes.give_back(call, entry, gates)
                raise Moved("given back to its lane")

    async def _handle_call(self, call: ToolExecute, stream: str) -> Sequence[Reply]:
        owner = None
        if stream != self.bus.keys.hands_worker(self.worker_id):  # handed to us: never handed on
            owner = await self._process_owner(call) if call.tool == "process" else self.mcp.owner_elsewhere(call.tool)
        if owner is not None:  # the background process (or stateful MCP server) runs elsewhere: its owner answers
            await self.bus.publish(self.bus.keys.hands_worker(owner), call)
            return []
        return [(call.reply_to, await self._execute(call))]

    async def _execute(self, call: ToolExecute) -> ToolResult:
        """Run a call, unless (or until) a ``tool:cancel`` for it arrives."""
        if call.call_id in self._cancelled:
            return self.executor.cancelled(call, self._cancelled[call.call_id])
        once = call.tool in self.registry and not self.registry.idempotent(call.tool)
        if once:
            earlier = await self.calls.claim(call)
            if isinstance(earlier, ToolResult):
                return earlier
            if earlier is not None:
                return self.executor.unrun(call, earlier)
        task = asyncio.current_task(self._loop)
        assert task is not None
        self._in_flight[call.call_id] = task
        try:
            with otel.span(f"execute_tool {call.tool}", gen_ai__operation__name="execute_tool",
                           gen_ai__tool__name=call.tool, gen_ai__tool__call__id=call.call_id) as opened:
                result = await self.executor.execute(call)
                otel.set_attributes(opened, **{"error.type": result.error.code.value if result.error else None,
                                               "pincer.worker": self.worker_id,
                                               "pincer.sandbox": result.metadata.sandbox})
        except asyncio.CancelledError:
            if call.call_id not in self._cancelled:
                raise  # the worker itself is stopping
            task.uncancel()
            result = self.executor.cancelled(call, self._cancelled[call.call_id])
        finally:
            self._in_flight.pop(call.call_id, None)
        if once:
            await self.calls.done(call, result)
        return result

    def _lost(self, call: ToolExecute, times: int) -> ToolFailure:
        return ToolFailure(
            ErrorCode.WORKER_LOST,
            f"the workers given {call.tool} stopped before answering, {times} times; the call may or may not "
            "have taken effect, and it is not run again", suggestions=["check whether it took effect"],
            retryable=False)

    async def _poisoned(self, message: Message) -> Sequence[Reply]:
        """An entry that outlived max_deliveries workers: answer it, so no one waits for ever."""
        if isinstance(message, ToolExecute):
            return [(message.reply_to, self.executor.unrun(message, self._lost(message, delivery.get())))]
        return []

    async def _on_control(self, message: Message) -> None:
        if not isinstance(message, ToolCancel):
            return
        self._cancelled[message.call_id] = message.reason
        while len(self._cancelled) > 10_000:  # remember recent cancels only
            self._cancelled.pop(next(iter(self._cancelled)))
        task = self._in_flight.get(message.call_id)
        if task is not None:
            log.info("cancelling call %s: %s", message.call_id, message.reason)
            task.cancel()

    async def _process_owner(self, call: ToolExecute) -> str | None:
        """The live worker that owns the background process a ``process`` call names, when it is not this one."""
        process_id = call.args.get("process_id")
        if not isinstance(process_id, str) or process_id in self.background.processes:
            return None
        owner = await self.background.owner(process_id)
        if owner is None or owner == self.worker_id or owner not in await alive(self.bus, "hands"):
            return None  # unknown, ours, or lost: the tool itself says which
        return owner

    async def run(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self.executor.workspace.ensure()
        await self.bus.redis.set(self.bus.keys.tools_digest, self.registry.digest())
        # Each service is closed in reverse order of its start, whatever fails on the way (or in a close).
        async with contextlib.AsyncExitStack() as services:
            await self.presence.start()
            services.push_async_callback(self.presence.stop)
            # The index's feed starts first and stops last.
            recall_stop = asyncio.Event()
            indexing = asyncio.create_task(self.recall.run(recall_stop), name="recall")
            services.push_async_callback(_stopped, indexing, recall_stop)
            await self.control.start()
            services.push_async_callback(self.control.close)
            await self.inbox.start()
            services.push_async_callback(self.inbox.close)
            services.push_async_callback(self.calls.close)
            services.push_async_callback(self.sandbox.close)  # after the background processes stop
            services.push_async_callback(self.background.stop_all)
            await self.pool.start()
            services.push_async_callback(self.pool.close)
            await self.reaper.start()
            services.push_async_callback(self.reaper.close)
            services.push_async_callback(self.mcp.close)  # after the lanes stop handing out calls (safe unstarted)
            await self.consumer.add_gated(await self.lanes.open())
            await self.lanes.start()
            services.push_async_callback(self.lanes.close)
            await self.mcp.start()
            for refusal in self.skills.refused:
                log.warning("skill refused: %s (%s)", refusal.reason, refusal.location)
            log.info("hands worker ready on %s: %d tools (%d from skills), %d instruction skills, workspace %s, "
                     "sandbox %s, concurrency %d", socket.gethostname(), len(self.registry.names()),
                     len(self.skills.tools), len(self.skills.instructions), self.executor.workspace.root,
                     self.sandbox.tier, self.settings.concurrency.global_)
            await self.consumer.run(stop)


async def _stopped(task: asyncio.Task[Any], stop: asyncio.Event) -> None:
    """A background task of the worker, told to stop and awaited."""
    stop.set()
    await task
