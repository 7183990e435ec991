"""Reading streams outside a consumer group: request/reply through a process's own inbox.

- ``ReplyInbox`` reads this instance's own reply stream and hands each message
  to whoever waits on its correlation id (call id, request id, message id).
- ``tail`` follows a stream from an id (inboxes and the broadcast control streams).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import Any

from redis import exceptions as redis_errors

from bus import trace
from bus.codec import MalformedMessage, decode
from bus.log import kv
from bus.loops import let_started_work_run
from bus.outcome import failure
from bus.protocol import Message
from bus.streams import CONNECTION_ERRORS, RECONNECT_DELAYS, Bus

log = logging.getLogger("bus")

TRIM_EVERY = 256  # replies read between two trims of an inbox stream
WAKE: dict[Any, Any] = {b"wake": b"closing"}  # added by close(): ends the inbox's blocking read at once


class ReplyInbox:
    """This instance's reply stream, routed to waiters by correlation id."""

    def __init__(self, bus: Bus, instance_id: str, *, block_ms: int = 1000) -> None:
        self.bus = bus
        self.stream = bus.keys.reply(instance_id)
        self.block_ms = block_ms
        self._waiters: dict[str, Callable[[Message], None]] = {}  # correlation id -> who takes its replies
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    async def start(self) -> None:
        self._task = asyncio.create_task(self._read_loop(), name=f"inbox:{self.stream}")

    async def close(self) -> None:
        # Let the blocking XREAD run out rather than cancel it: redis-py can
        # leave a cancelled blocking read hanging on its connection.
        self._closing = True
        if self._task:
            with contextlib.suppress(redis_errors.RedisError, OSError):  # wake the read now, not after its block
                await self.bus.redis.xadd(self.stream, WAKE)
            done, _ = await asyncio.wait({self._task}, timeout=self.block_ms / 1000 + 2)
            if not done:
                self._task.cancel()
        with contextlib.suppress(redis_errors.RedisError, OSError):
            await self.bus.redis.delete(self.stream)

    @contextlib.asynccontextmanager
    async def expect(self, correlation_id: str) -> AsyncIterator[asyncio.Queue[Message]]:
        """Register interest before publishing, so no reply can slip past."""
        queue: asyncio.Queue[Message] = asyncio.Queue()
        self._waiters[correlation_id] = queue.put_nowait
        try:
            yield queue
        finally:
            self._waiters.pop(correlation_id, None)

    async def request(
        self, stream: str, message: Message, correlation_id: str, *, timeout: float,
        final: tuple[type, ...] = (), on_event: Callable[[Message], Coroutine[Any, Any, None]] | None = None,
    ) -> Message:
        """Publish and wait for the reply (the first one, or the first of a ``final`` type,
        handing earlier ones such as ``tool:progress`` to ``on_event``); ``TimeoutError`` when none comes.

        The hot path of every tool call: one future and one timer, no queue or task per call; the
        request rides the next pipeline and a failed send is retried by its callback while Redis is away.
        """
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Message] = loop.create_future()
        events: list[asyncio.Task[None]] = []

        def deliver(reply: Message) -> None:
            if answer.done():
                return  # a duplicate (at-least-once delivery): the first answer stands
            if not final or isinstance(reply, final):
                answer.set_result(reply)
            elif on_event is not None:
                events.append(loop.create_task(on_event(reply)))

        def expire() -> None:
            if not answer.done():
                answer.set_exception(TimeoutError())

        self._waiters[correlation_id] = deliver
        timer = loop.call_later(timeout, expire)
        self._send(stream, message, answer)
        try:
            return await answer
        finally:
            timer.cancel()
            self._waiters.pop(correlation_id, None)
            if events:  # progress relayed before the answer, in order
                await asyncio.gather(*events, return_exceptions=True)

    def _send(self, stream: str, message: Message, answer: asyncio.Future[Message], failures: int = 0) -> None:
        """Queue a request; while Redis is away, queue it again with backoff until ``answer`` is done."""
        def sent(outcome: list[Any] | Exception) -> None:
            error = failure(outcome)
            if error is None or answer.done():
                return
            if not isinstance(error, CONNECTION_ERRORS):
                answer.set_exception(error)  # Redis refused it: the caller hears why
                return
            delay = RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS) - 1)]
            log.warning("Redis away while sending to %s, retrying in %.2fs: %s", stream, delay, error)
            asyncio.get_running_loop().call_later(delay, self._send, stream, message, answer, failures + 1)

        traceparent = trace.current.get()
        self.bus.batcher.send(lambda pipe: self.bus.add(pipe, stream, message, traceparent), done=sent)

    async def _read_loop(self) -> None:
        read = 0
        # The stream is ours alone and new, so read it all.
        async with contextlib.aclosing(tail(self.bus, self.stream, start="0-0", block_ms=self.block_ms,
                                            closing=lambda: self._closing)) as replies:
            async for entries in replies:
                if self._closing:
                    return
                for entry_id, fields in entries:
                    self._route(entry_id, fields)
                await let_started_work_run(self.bus.batcher)  # the callers just answered send before our next read
                read += len(entries)
                if read >= TRIM_EVERY:
                    # Delivered replies are not needed again; trimming now and then keeps
                    # the stream small without a round trip on every reply's path.
                    read = 0
                    with contextlib.suppress(*CONNECTION_ERRORS):  # next time, then
                        await self.bus.redis.xtrim(self.stream, minid=entries[-1][0], approximate=True)

    def _route(self, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        try:
            message = decode(fields)
        except MalformedMessage as exc:
            log.error("ignored malformed reply %s reason=%r", kv(stream=self.stream, entry=entry_id.decode()),
                      str(exc))
            return
        deliver = self._waiters.get(message.correlation_id or "")
        if deliver is None:
            log.debug("no one waits for %s", kv(type=message.type, correlation=message.correlation_id))
            return
        deliver(message)


async def tail(bus: Bus, stream: str, *, start: str, block_ms: int,
               closing: Callable[[], bool]) -> AsyncGenerator[list[tuple[bytes, dict[bytes, bytes]]], None]:
    """Every entry added to ``stream`` after ``start``, as (id, fields) in the batches each XREAD
    returns (a step of the generator per read, not per entry), reconnecting with backoff, until ``closing()``.

    ``closing`` is checked between blocking reads: stopping lets the last XREAD
    run out (at most ``block_ms``) instead of cancelling it mid-command. The reads hold one
    connection (``Bus.reader``) until the generator is closed: iterate it inside ``aclosing``.
    """
    last, failures = start, 0
    reader = bus.reader()
    try:
        while not closing():
            try:
                response = await reader.execute("XREAD", "COUNT", 512, "BLOCK", block_ms, "STREAMS", stream, last)
                failures = 0
            except (redis_errors.RedisError, OSError) as exc:  # never end: its waiters would wait for ever
                delay = RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS) - 1)]
                failures += 1
                if isinstance(exc, CONNECTION_ERRORS):
                    log.warning("%s unreachable, retrying in %.2fs: %s", stream, delay, exc)
                else:
                    log.error("reading %s refused, retrying in %.2fs: %s", stream, delay, exc)
                await asyncio.sleep(delay)
                continue
            for _stream, entries in response or []:
                if entries:
                    last = entries[-1][0].decode()
                    yield entries
    finally:
        with contextlib.suppress(redis_errors.RedisError, OSError):
            await reader.aclose()
