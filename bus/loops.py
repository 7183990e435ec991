"""Background loops that stop on an event rather than by being cancelled.

A task cancelled in the middle of a redis-py command can hang on its
connection (seen in this project with XREAD and XAUTOCLAIM), so periodic
loops tick through ``every`` and are stopped with ``finish``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bus.batching import Batcher


class Background:
    """Tasks started and not awaited where they start, held until they end: the event loop keeps only
    a weak reference to a task, so one that nobody holds may vanish mid-run."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Future[Any]]:
        return iter(list(self._tasks))

    def start(self, work: Awaitable[Any]) -> asyncio.Future[Any]:
        """Run ``work`` (a coroutine, or a task already running) to its end, held here meanwhile."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def wait(self) -> None:
        """Wait for every task to end (an error of one is its own: it does not stop the wait)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def finish(self, grace_s: float = 0.0) -> None:
        """Let the tasks end within ``grace_s``; cancel those still running, and wait for them."""
        if self._tasks and grace_s > 0:
            await asyncio.wait(set(self._tasks), timeout=grace_s)
        running = list(self._tasks)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


async def every(interval_s: float, stop: asyncio.Event) -> AsyncIterator[None]:
    """Tick every ``interval_s`` until ``stop`` is set."""
    while True:
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
            return
        except TimeoutError:
            yield


async def finish(task: asyncio.Task[None] | None, stop: asyncio.Event, *, grace_s: float) -> None:
    """Ask a loop to stop and wait for it; cancel it only if it does not stop within ``grace_s``."""
    stop.set()
    if task is None:
        return
    done, _ = await asyncio.wait({task}, timeout=grace_s)
    if not done:
        task.cancel()


def ready() -> asyncio.Future[None]:
    """An awaitable that is already done: for a caller told to await something there was no need for."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


async def sleep_or_stop(stop: asyncio.Event, delay: float) -> None:
    """Wait ``delay`` seconds, or less if ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=delay)


async def let_started_work_run(batcher: Batcher) -> None:
    """Let the tasks a read just woke run, and send what they queue, before the reader's next read.

    The batcher's flush is started behind those tasks, so their replies or requests go out in
    the same loop turn as they run; the reader resumes after it. Its next read's write would
    otherwise go out first and sit on the path of every reply or request (docs/bus.md).
    """
    batcher.flush_after_ready_work()
    await asyncio.sleep(0)
