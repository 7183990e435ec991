"""Auto-pipelining: Redis writes issued in the same event-loop tick share one round trip.

On this machine kind a loopback socket send costs ~130 µs, so a worker that
answers ten calls with ten pipelines pays ten times what one pipeline costs.
Callers write ``await batcher.run(build)`` and get their own results, or
``batcher.send(build, done=...)`` to be told by a callback, without a future
or a task switch per write (the hot path of every tool call, on both sides).
Every flush goes down one connection the batcher holds (see ``Batcher._write``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import AbstractConnection

log = logging.getLogger("bus.batching")

Build = Callable[[Pipeline], object]
Done = Callable[[list[Any] | Exception], None]
"""Told a write's outcome: its commands' results (a refused command's error among them), or the
error that failed the whole pipeline (Redis away)."""


def failure(outcome: list[Any] | Exception) -> Exception | None:
    """What failed a write, if anything: the pipeline's error, else its first refused command's."""
    if isinstance(outcome, Exception):
        return outcome
    return next((r for r in outcome if isinstance(r, Exception)), None)


def _log_failure(outcome: list[Any] | Exception) -> None:
    error = failure(outcome)
    if error is not None:
        log.warning("a write sent without waiting failed: %s", error)


class Batcher:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._queue: list[tuple[Build, asyncio.Future[list[Any]] | Done]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._held: AbstractConnection | None = None  # taken from the pool at the first write

    async def close(self, timeout_s: float = 5.0) -> None:
        """Send what is still queued (events sent without waiting, say), for up to ``timeout_s``,
        then give back the held connection."""
        if self._flusher is not None and not self._flusher.done():
            await asyncio.wait({self._flusher}, timeout=timeout_s)
        if self._held is not None:
            held, self._held = self._held, None
            await self.redis.connection_pool.release(held)

    @property
    def last_queued(self) -> Build | None:
        """The build queued last and not yet taken by a flush: one may still add to it (it is
        called when the pipeline is made), knowing nothing else was queued after it."""
        return self._queue[-1][0] if self._queue else None

    async def run(self, build: Build) -> list[Any]:
        """Queue the commands ``build`` adds to a pipeline; return their results."""
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._enqueue(build, future)
        return await future

    def send(self, build: Build, *, done: Done = _log_failure) -> None:
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
            for _, target in batch:
                _settle(target, error)
            if not isinstance(exc, Exception):
                raise
            return
        start = 0
        for (_, target), size in zip(batch, sizes):
            mine, start = results[start : start + size], start + size
            _settle(target, (failure(mine) or mine) if isinstance(target, asyncio.Future) else mine)

    async def _write(self, pipe: Pipeline) -> list[Any]:
        """Send what ``pipe`` holds and return each command's result (a refused one's error).

        The pipeline only collects the commands: they go down the connection this batcher holds,
        packed in one write, and each reply is read and parsed by redis-py's own ``parse_response``.
        redis-py 8's ``Pipeline.execute`` would take a pooled connection, scan the commands for
        HIMPORT field sets and give the connection back through ``asyncio.shield`` (a task and a
        loop turn) every time: ~7.7 µs per command in a batch of 16 on this machine kind against
        ~4.6 this way, and twice the Python work for a lone command. A write on a broken
        connection fails its callers, as a pipeline's would, and the next write connects afresh.
        (Lua scripts cannot be queued: redis-py's asyncio ``Script`` call is a coroutine.)
        """
        if self._held is None:
            self._held = await self.redis.connection_pool.get_connection()
        held, commands = self._held, pipe.command_stack
        try:
            await held.send_packed_command(held.pack_commands([args for args, _ in commands]))
            results: list[Any] = []
            for args, options in commands:
                try:
                    results.append(await self.redis.parse_response(held, args[0], **options))
                except redis_errors.ResponseError as refused:  # as a pipeline reports it: among the results
                    results.append(refused)
            return results
        except BaseException:  # replies may be left unread: the connection must not be used half-read
            await held.disconnect(nowait=True)
            raise


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
