"""Auto-pipelining: Redis writes issued in the same event-loop tick share one round trip.

On this machine kind a loopback socket send costs ~130 µs, so a worker that
answers ten calls with ten pipelines pays ten times what one pipeline costs.
Callers write ``await batcher.run(build)`` and get their own results, or
``batcher.send(build, done=...)`` to be told by a callback, without a future
or a task switch per write (the hot path of every tool call, on both sides).
Every flush goes down one connection the batcher holds (``bus.redis_client.HeldConnection``),
as one transaction when it has more than one command.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from bus.outcome import Done, failure, log_failure
from bus.redis_client import HeldConnection, NotReplicated

log = logging.getLogger("bus.batching")

Build = Callable[[Pipeline], object]


class Batcher:
    def __init__(self, redis: Redis, *, replicas: tuple[int, int] | None = None) -> None:
        self.redis = redis
        self.replicas = replicas  # (how many, ms): each flush waits for them (redis.min_replicas)
        self._queue: list[tuple[Build, asyncio.Future[list[Any]] | Done]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._held = HeldConnection(redis)  # every write goes down it

    async def close(self, timeout_s: float = 5.0) -> None:
        """Send what is still queued (events sent without waiting, say), for up to ``timeout_s``,
        then give back the held connection."""
        if self._flusher is not None and not self._flusher.done():
            await asyncio.wait({self._flusher}, timeout=timeout_s)
        await self._held.aclose()

    @property
    def last_queued(self) -> Build | None:
        """The build queued last and not yet taken by a flush: one may still add to it (it is
        called when the pipeline is made), knowing nothing else was queued after it."""
        return self._queue[-1][0] if self._queue else None

    async def run(self, build: Build) -> list[Any]:
        """Queue the commands ``build`` adds to a pipeline; return their results."""
        return await self.queue(build)

    def queue(self, build: Build) -> asyncio.Future[list[Any]]:
        """Queue the commands now and await their results later: the caller may do other work while
        they travel (it must await the future, or their failure goes unheard)."""
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._enqueue(build, future)
        return future

    def send(self, build: Build, *, done: Done = log_failure) -> None:
        """Queue commands without waiting; ``done`` hears the outcome (by default a failure is logged).

        They still go out in order with everything queued before and after them.
        """
        self._enqueue(build, done)

    def flush_after_ready_work(self) -> None:
        """Start the next flush now, behind the tasks already scheduled: what they queue when they
        run (in this same loop turn) rides its pipeline, a turn sooner than a flush they start.

        Readers call it after waking the tasks a read is for (a worker's handlers, a Brain's
        callers); if none of them sends anything, the flush finds nothing and ends.
        """
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    def _enqueue(self, build: Build, target: asyncio.Future[list[Any]] | Done) -> None:
        self._queue.append((build, target))
        self.flush_after_ready_work()

    async def _flush(self) -> None:
        # A new task runs after everything already scheduled in this tick, so the
        # callers of this tick have queued their commands by now.
        while self._queue:
            batch, self._queue = self._queue, []
            await self._execute(batch)

    async def _execute(self, batch: list[tuple[Build, asyncio.Future[list[Any]] | Done]]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        sizes = []
        stack = pipe.command_stack
        for build, _ in batch:
            before = len(stack)
            build(pipe)
            sizes.append(len(stack) - before)
        try:
            results = await self._write(pipe)
        except BaseException as exc:  # connection lost: every caller hears it
            error = exc if isinstance(exc, Exception) else ConnectionError("cancelled")
            start = 0
            for (_, target), size in zip(batch, sizes, strict=True):  # unconfirmed: each with its own results
                _settle(target, error.part(start, size) if isinstance(error, NotReplicated) else error)
                start += size
            if not isinstance(exc, Exception):
                raise
            return
        start = 0
        for (_, target), size in zip(batch, sizes, strict=True):
            mine, start = results[start : start + size], start + size
            _settle(target, (failure(mine) or mine) if isinstance(target, asyncio.Future) else mine)

    async def _write(self, pipe: Pipeline) -> list[Any]:
        """Send what ``pipe`` holds and return each command's result (a refused one's error).

        The pipeline only collects the commands: they go down the batcher's held connection
        (``HeldConnection``), not through ``Pipeline.execute``, and more than one go as one
        MULTI/EXEC transaction. Redis wakes a reader blocked on a stream after every command
        outside a transaction, so a burst of requests (or a round of replies) would reach a
        worker (or a caller) a few at a time; in one transaction it arrives whole, and the
        reader reads it in one go (the figures: docs/bus.md). It also means a flush is applied whole
        or not at all: a command Redis refuses
        while queueing (out of memory, an ACL, a read-only replica) fails every caller of the
        flush, as a lost connection does, and a worker's acks never land without the replies
        they follow (``bus.answers.Answers``). (Lua scripts cannot be queued: redis-py's
        asyncio ``Script`` call is a coroutine.)
        """
        stack = cast(list[tuple[tuple[Any, ...], dict[str, Any]]], pipe.command_stack)  # as redis-py queued them
        return await self._held.send(stack, transaction=len(stack) > 1, replicas=self.replicas)


def _settle(target: asyncio.Future[list[Any]] | Done, outcome: list[Any] | Exception) -> None:
    """A callback gets its commands' results, errors among them; a future its results or first error."""
    if not isinstance(target, asyncio.Future):
        try:
            target(outcome)
        except Exception:  # one caller's bug must not keep the others from their outcome
            log.exception("a write's callback failed")
    elif not target.done():
        if isinstance(outcome, Exception):
            target.set_exception(outcome)
        else:
            target.set_result(outcome)
