"""Background loops that stop on an event rather than by being cancelled.

A task cancelled in the middle of a redis-py command can hang on its
connection (seen in this project with XREAD and XAUTOCLAIM), so periodic
loops tick through ``every`` and are stopped with ``finish``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bus.batching import Batcher


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
