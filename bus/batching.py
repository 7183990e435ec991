"""Auto-pipelining: Redis writes issued in the same event-loop tick share one round trip.

On this machine kind a loopback socket send costs ~130 µs, so a worker that
answers ten calls with ten pipelines pays ten times what one pipeline costs.
Callers write ``await batcher.run(build)`` and get their own results, or
``batcher.send(build, done=...)`` to be told by a callback, without a future
or a task switch per write (the hot path of every tool call, on both sides).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

log = logging.getLogger("bus.batching")

Build = Callable[[Pipeline], object]
Ack = tuple[str, str, str]  # stream, group, entry id
Done = Callable[[list[Any] | Exception], None]
"""Told a write's outcome: its commands' results, or the error that failed it."""


def _log_failure(outcome: list[Any] | Exception) -> None:
    if isinstance(outcome, Exception):
        log.warning("a write sent without waiting failed: %s", outcome)


class Batcher:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._queue: list[tuple[Build, asyncio.Future[list[Any]] | Done, Ack | None]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def run(self, build: Build, *, ack: Ack | None = None) -> list[Any]:
        """Queue the commands ``build`` adds to a pipeline; return their results.

        ``ack``: an entry to acknowledge after those commands. The acks of a batch go
        out as one XACK per stream and group, at the end of the pipeline (after every
        reply in it), instead of one command each.
        """
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._enqueue(build, future, ack)
        return await future

    def send(self, build: Build, *, ack: Ack | None = None, done: Done = _log_failure) -> None:
        """Queue commands without waiting; ``done`` hears the outcome (by default a failure is logged).

        They still go out in order with everything queued before and after them.
        """
        self._enqueue(build, done, ack)

    def _enqueue(self, build: Build, target: asyncio.Future[list[Any]] | Done, ack: Ack | None) -> None:
        self._queue.append((build, target, ack))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        # A new task runs after everything already scheduled in this tick, so the
        # callers of this tick have queued their commands by now.
        while self._queue:
            batch, self._queue = self._queue, []
            await self._execute(batch)

    async def _execute(self, batch: list[tuple[Build, asyncio.Future[list[Any]] | Done, Ack | None]]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        sizes = []
        acks: dict[tuple[str, str], list[str]] = {}
        for build, _, ack in batch:
            before = len(pipe.command_stack)
            build(pipe)
            sizes.append(len(pipe.command_stack) - before)
            if ack is not None:
                acks.setdefault(ack[:2], []).append(ack[2])
        for (stream, group), ids in acks.items():
            pipe.xack(stream, group, *ids)
        try:
            results = await pipe.execute(raise_on_error=False)
        except BaseException as exc:  # connection lost: every caller hears it
            error = exc if isinstance(exc, Exception) else ConnectionError("cancelled")
            for _, target, _ack in batch:
                _settle(target, error)
            if not isinstance(exc, Exception):
                raise
            return
        ack_results = dict(zip(acks, results[sum(sizes):]))
        start = 0
        for (_, target, ack), size in zip(batch, sizes):
            mine, start = results[start : start + size], start + size
            acked = ack_results.get(ack[:2]) if ack is not None else None
            error = next((r for r in [*mine, acked] if isinstance(r, Exception)), None)
            _settle(target, mine if error is None else error)


def _settle(target: asyncio.Future[list[Any]] | Done, outcome: list[Any] | Exception) -> None:
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
