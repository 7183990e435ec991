"""The loops a process keeps running beside its work (heartbeat, reaper, backlog upkeep) outlive a failure
nobody planned for: it is logged with its traceback and the next tick runs, instead of the task ending
unseen and leaving an instance that looks dead, or dead workers' calls never taken over."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from bus.consumer import GroupConsumer
from bus.loops import Background
from bus.presence import Presence
from bus.reaper import Reaper
from bus.streams import Bus
from hands.config import QueueSettings
from hands.lanes import Lanes
from tests.conftest import async_wait_until
from tests.fakes import fake_bus as in_memory_bus


@pytest.fixture
async def fake_bus() -> AsyncIterator[Bus]:
    bus = in_memory_bus(reap_interval_s=0.05)
    yield bus
    await bus.close()


def failing_once(ticks: list[int], at: int) -> Callable[[], Awaitable[None]]:
    async def tick() -> None:
        ticks.append(len(ticks))
        if len(ticks) == at:
            raise KeyError("a reply of a shape no one expected")
    return tick


async def run_until_ticked(owner: Any, method: str, start: Callable[[], Awaitable[None]],
                           stop: Callable[[], Awaitable[None]], monkeypatch: pytest.MonkeyPatch, *,
                           fail_at: int = 1) -> None:
    ticks: list[int] = []
    monkeypatch.setattr(owner, method, failing_once(ticks, fail_at))
    await start()
    try:
        await async_wait_until(lambda: len(ticks) >= fail_at + 2, what="ticks after the one that failed")
    finally:
        await stop()


async def test_the_heartbeat_goes_on(fake_bus: Bus, monkeypatch: pytest.MonkeyPatch,
                                     caplog: pytest.LogCaptureFixture) -> None:
    presence = Presence(fake_bus, "hands", "w1", interval_s=0.05)
    # The first beat is part of start (a failure there is the caller's); the loop's own ticks follow.
    await run_until_ticked(presence, "beat", presence.start, presence.stop, monkeypatch, fail_at=2)
    assert "heartbeat failed unexpectedly" in caplog.text and "KeyError" in caplog.text


async def test_the_reaper_goes_on(fake_bus: Bus, monkeypatch: pytest.MonkeyPatch,
                                  caplog: pytest.LogCaptureFixture) -> None:
    consumer = GroupConsumer(fake_bus, streams=[fake_bus.keys.hands_requests], group="g", consumer="w1", handler=None)
    reaper = Reaper(fake_bus, consumer, fake_bus.settings)
    await run_until_ticked(reaper, "reap_once", reaper.start, reaper.close, monkeypatch)
    assert "reaper pass failed unexpectedly" in caplog.text and "KeyError" in caplog.text


async def test_the_backlog_upkeep_goes_on(fake_bus: Bus, monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr("hands.lanes.KEEP_INTERVAL_S", 0.05)
    lanes = Lanes(fake_bus, QueueSettings(), limiter=None, registry=None, worker_id="w1",  # type: ignore[arg-type]
                  freed=lambda: None)
    async def one_worker() -> None:
        lanes.live_workers = 1

    monkeypatch.setattr(lanes, "_count_workers", one_worker)
    await run_until_ticked(lanes, "keep_once", lanes.start, lanes.close, monkeypatch)
    assert "backlog upkeep failed unexpectedly" in caplog.text and "KeyError" in caplog.text


async def test_background_holds_its_tasks_until_they_end_and_lets_go_after() -> None:
    tasks, gate = Background(), asyncio.Event()
    started = tasks.start(gate.wait())
    assert len(tasks) == 1 and list(tasks) == [started]
    gate.set()
    await tasks.wait()
    assert started.done() and len(tasks) == 0


async def test_background_finish_lets_the_quick_end_and_cancels_the_rest() -> None:
    tasks, gate = Background(), asyncio.Event()

    async def ends_once_let() -> str:
        await gate.wait()
        return "done"

    quick = tasks.start(ends_once_let())
    stuck = tasks.start(asyncio.Event().wait())
    asyncio.get_running_loop().call_soon(gate.set)  # let go while finish waits out its grace
    await tasks.finish(grace_s=0.5)
    assert quick.result() == "done" and stuck.cancelled() and len(tasks) == 0


async def test_background_wait_is_not_stopped_by_one_tasks_error() -> None:
    tasks = Background()

    gate = asyncio.Event()

    async def fails() -> None:
        raise RuntimeError("its own")

    async def after_the_failure() -> str:
        await gate.wait()
        return "later"

    failed, slower = tasks.start(fails()), tasks.start(after_the_failure())
    failed.add_done_callback(lambda _: gate.set())  # the slower ends only once the other has failed
    await tasks.wait()
    assert isinstance(failed.exception(), RuntimeError) and slower.result() == "later"
