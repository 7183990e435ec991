"""Fixtures for integration tests: in-process Hands workers on the real Redis, a tool caller, and a Brain
with a fake LLM (``pool``) chatted with through its inbox (``chat``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from brain.config import BrainSettings
from brain.llm import LiteLLMClient
from brain.worker import BrainWorker
from bus.presence import alive
from bus.protocol import ChatError, ChatMessage, ChatReply, Message, ToolExecute, ToolResult, now_ms
from bus.replies import ReplyInbox
from bus.streams import Bus
from hands.config import HandsSettings, RetryPolicy
from hands.registry import Category, ToolDefinition
from hands.worker import HandsWorker
from tests.conftest import SHIPPED_SKILLS, async_wait_until


@pytest.fixture
def engine_defaults() -> dict[str, Any]:
    """Settings every worker of a test starts with; a test module may override this fixture."""
    return {}


@pytest.fixture
async def engine(bus: Bus, tmp_path: Path, engine_defaults: dict[str, Any]):
    """Start one in-process Hands worker with settings overrides and extra tools; stopped at teardown."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("alpha")
    running: list[tuple[asyncio.Event, asyncio.Task[None]]] = []
    stopped: set[str] = set()

    async def start(*, extra_tools: list[ToolDefinition] = (), **overrides: Any) -> HandsWorker:
        settings = HandsSettings.model_validate({"workspace": tmp_path / "ws", "skill_dirs": [SHIPPED_SKILLS],
                                                 **engine_defaults, **overrides})
        worker = HandsWorker(bus, settings, worker_id=f"w{len(running)}", heartbeat_s=0.5)
        for tool in extra_tools:
            worker.registry.register(tool)
        stop = asyncio.Event()
        running.append((stop, asyncio.create_task(worker.run(stop))))
        await async_wait_until(lambda: _alive(bus, len(running) - len(stopped)), what="worker alive")
        return worker

    async def stop_worker(worker: HandsWorker) -> None:
        """Stop one worker as a shutdown would (the rest keep running)."""
        stop, task = running[int(worker.worker_id[1:])]
        stop.set()
        await task
        stopped.add(worker.worker_id)

    start.stop = stop_worker  # type: ignore[attr-defined]
    yield start
    for stop, _ in running:
        stop.set()
    await asyncio.gather(*(task for _, task in running))


async def _alive(bus: Bus, n: int) -> bool:
    return len(await alive(bus, "hands")) == n


@pytest.fixture
async def call(bus: Bus):
    """Send a tool call over the bus and wait for its result (``call.inbox`` is the reply inbox)."""
    inbox = ReplyInbox(bus, "brain-engine", block_ms=100)
    await inbox.start()

    async def send(tool: str, args: dict | None = None, *, events: list | None = None, timeout: float = 20,
                   agent: str = "main", sender: str = "", session: str = "s",
                   agents: list[str] | None = None) -> ToolResult:
        request = ToolExecute(tool=tool, args=args or {}, session_id=session, reply_to=inbox.stream, agent_id=agent,
                              sender=sender, agents=agents, deadline=now_ms() + int(timeout * 1000))

        async def keep(event):
            if events is not None:
                events.append(event)

        return await inbox.request(bus.keys.hands_requests, request, request.call_id, timeout=timeout,
                                   final=(ToolResult,), on_event=keep)

    send.inbox = inbox  # type: ignore[attr-defined]
    yield send
    await inbox.close()


def gated(name: str, gate: asyncio.Event, *, category: Category = Category.SKILL, limit: int | None = None,
          running: list[int] | None = None) -> ToolDefinition:
    """A tool that waits for ``gate``; ``running`` records how many run at once."""
    state = {"now": 0}

    async def handler(_args, _ctx):
        state["now"] += 1
        if running is not None:
            running.append(state["now"])
        try:
            await gate.wait()
        finally:
            state["now"] -= 1
        return "done"

    return ToolDefinition(name=name, description=name, parameters={"type": "object"}, handler=handler,
                          category=category, max_concurrency=limit, retry=RetryPolicy(retries=0))


@pytest.fixture
async def pool(bus: Bus, tmp_path: Path):
    """Start a Brain (with the given fake LLM and settings) and optionally a Hands worker."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("alpha")
    tasks: list[tuple[asyncio.Event, asyncio.Task[None]]] = []
    models: list[Any] = []

    async def start(llm, *, hands: bool = True, tools: list[ToolDefinition] = (),
                    **settings: Any) -> dict[str, asyncio.Event]:
        defaults = {"tools_list_timeout_s": 1.0, "tool_deadline_s": 2.0}
        brain = BrainWorker(bus, BrainSettings(**{**defaults, **settings}), instance_id="brain-t", llm=llm,
                            heartbeat_s=0.5)
        models.append(llm)
        workers = [brain]
        if hands:
            hands_worker = HandsWorker(bus, HandsSettings(workspace=tmp_path / "ws", skill_dirs=[SHIPPED_SKILLS],
                                                          progress_interval_s=0.1),
                                       worker_id="hands-t", heartbeat_s=0.5)
            for tool in tools:
                hands_worker.registry.register(tool)
            workers.append(hands_worker)
        stops = {}
        for worker in workers:
            stop = stops[type(worker).__name__] = asyncio.Event()
            tasks.append((stop, asyncio.create_task(worker.run(stop))))
        return stops

    yield start
    for stop, _ in tasks:
        stop.set()
    await asyncio.gather(*(task for _, task in tasks))
    for llm in models:  # a real client's connections (the worker closes only the clients it made)
        if isinstance(llm, LiteLLMClient):
            await llm.close()


@pytest.fixture
async def brain_pool(bus: Bus, tmp_path: Path):
    """Start a Hands worker and ``count`` Brains sharing these settings and one model; stopped at teardown."""
    running: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    async def start(settings: BrainSettings, llm: Any, count: int = 1, **hands_settings: Any) -> list[BrainWorker]:
        hands = HandsWorker(bus, HandsSettings(**{"workspace": tmp_path, **hands_settings}),
                            worker_id=f"hands-p{len(running)}", heartbeat_s=0.5)
        made = [BrainWorker(bus, settings, instance_id=f"brain-p{len(running)}-{n}", llm=llm, heartbeat_s=0.5)
                for n in range(count)]
        for worker in [hands, *made]:
            stop = asyncio.Event()
            running.append((stop, asyncio.create_task(worker.run(stop))))
        return made

    yield start
    for stop, _ in running:
        stop.set()
    await asyncio.gather(*(task for _, task in running))


@pytest.fixture
async def chat(bus: Bus):
    inbox = ReplyInbox(bus, "gateway-t", block_ms=100)
    await inbox.start()

    async def send(text: str, session_id: str = "s1", agent_id: str = "main", **fields: Any) -> list[Message]:
        message = ChatMessage(session_id=session_id, text=text, reply_to=inbox.stream, agent_id=agent_id, **fields)
        events: list[Message] = []
        async with inbox.expect(message.message_id) as queue:
            await bus.publish(bus.keys.brain_inbox, message)
            async with asyncio.timeout(20):
                while not isinstance(event := await queue.get(), (ChatReply, ChatError)):
                    events.append(event)
        return [*events, event]

    yield send
    await inbox.close()
