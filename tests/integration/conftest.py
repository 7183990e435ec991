"""Fixtures for integration tests: in-process Hands workers on the real Redis, and a tool caller."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bus.presence import alive
from bus.protocol import ToolExecute, ToolResult, now_ms
from bus.replies import ReplyInbox
from bus.streams import Bus
from hands.config import HandsSettings
from hands.registry import Category, RetryPolicy, ToolDefinition
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

    async def start(*, extra_tools: list[ToolDefinition] = (), **overrides: Any) -> HandsWorker:
        settings = HandsSettings.model_validate({"workspace": tmp_path / "ws", "skill_dirs": [SHIPPED_SKILLS],
                                                 **engine_defaults, **overrides})
        worker = HandsWorker(bus, settings, worker_id=f"w{len(running)}", heartbeat_s=0.5)
        for tool in extra_tools:
            worker.registry.register(tool)
        stop = asyncio.Event()
        running.append((stop, asyncio.create_task(worker.run(stop))))
        await async_wait_until(lambda: _alive(bus, len(running)), what="worker alive")
        return worker

    yield start
    for stop, _ in running:
        stop.set()
    await asyncio.gather(*(task for _, task in running))


async def _alive(bus: Bus, n: int) -> bool:
    return len(await alive(bus, "hands")) == n


@pytest.fixture
def ws() -> Iterator[Path]:
    """A workspace the sandbox uid can reach (pytest's own temp dirs are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="pincer-ws-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def call(bus: Bus):
    """Send a tool call over the bus and wait for its result (``call.inbox`` is the reply inbox)."""
    inbox = ReplyInbox(bus, "brain-engine", block_ms=100)
    await inbox.start()

    async def send(tool: str, args: dict | None = None, *, events: list | None = None, timeout: float = 20,
                   agent: str = "main", sender: str = "") -> ToolResult:
        request = ToolExecute(tool=tool, args=args or {}, session_id="s", reply_to=inbox.stream, agent_id=agent,
                              sender=sender, deadline=now_ms() + int(timeout * 1000))

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


