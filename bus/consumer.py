"""``GroupConsumer``: one consumer in a Redis consumer group, running a handler for every message.

It reads its own pending entries first, then new ones, runs a handler per
message within a concurrency limit, and writes the handler's replies and the
XACK in one transaction, so no ack lands without its reply (``bus/answer_writer.py``).
Garbage is acknowledged, logged and copied to the ``dead`` stream; a read that
fails is retried, so the loop never ends while the process runs. Streams read
"gated" (``add_gated``) are read by a loop each, only as far as ``room`` allows.
An entry whose handler met Redis away is held and run again here (``bus/outage.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Any

from redis import exceptions as redis_errors

from bus import trace
from bus.answer_writer import AnswerWriter
from bus.answers import Reply, dead_letter
from bus.codec import MalformedMessage, decode
from bus.errors import PincerError
from bus.log import kv
from bus.loops import let_started_work_run, sleep_or_stop
from bus.outage import REDIS_AWAY, Outage
from bus.protocol import Message
from bus.redis_client import HeldConnection
from bus.slots import Slots
from bus.streams import CONNECTION_ERRORS, RECONNECT_DELAYS, Bus

log = logging.getLogger("bus")

# How many times the entry being handled has been delivered (2+ means another
# consumer, or an earlier life of this one, took it and never acknowledged it).
delivery: ContextVar[int] = ContextVar("delivery", default=1)
# The entry being handled (stream, entry id, fields): for a handler that moves it elsewhere itself.
current_entry: ContextVar[tuple[str, str, dict[bytes, bytes]]] = ContextVar("current_entry")
# Whether the entry being handled has given its slot away while it waits (GroupConsumer.set_aside).
_aside: ContextVar[bool] = ContextVar("aside", default=False)
Handler = Callable[[Message, str], Awaitable[Sequence[Reply]]]
"""Handles one message (with the stream it came from); returns (stream, message) replies."""


class HandedOver(PincerError):
    """Raised by a handler that found another consumer doing its work: no reply, no ack, no dead letter."""


class Moved(HandedOver):
    """Raised by a handler that moved its entry to another stream and acknowledged it itself (a Hands
    worker putting a call it cannot start now into the pool's backlog)."""


class GroupConsumer:
    """One consumer in a consumer group, running a handler for every message it reads."""

    def __init__(
        self,
        bus: Bus,
        *,
        streams: Sequence[str],
        group: str,
        consumer: str,
        handler: Handler,
        concurrency: int = 10,
        batch: int = 32,
        block_ms: int = 1000,
        aside: int = 0,
        room: Callable[[str], int | None] | None = None,
    ) -> None:
        self.bus, self.streams, self.group, self.consumer = bus, list(streams), group, consumer
        self.handler = handler
        self.aside_limit, self._aside_count = aside, 0
        # Entries per read, as the floor reads (why 32: docs/bus.md, Scale-out and reliability).
        self.batch, self.block_ms = batch, block_ms
        # How many entries of a gated stream (``add_gated``) the handler could start now. Each gated
        # stream is read by a loop of its own, no more than that per read and not at all without
        # room, so what cannot start stays in Redis for whichever consumer has room first; one
        # XREADGROUP has one COUNT for all its streams, hence a loop (and a connection) each.
        self.room = room
        self._gated: dict[str, asyncio.Event] = {}  # gated stream -> set when room may have come
        self._waiting_for_room: set[str] = set()
        self._gated_loops: list[asyncio.Task[None]] = []
        self._stop: asyncio.Event | None = None
        self._slots = Slots(concurrency)
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}  # (stream, entry id) -> its handler's task
        self.holding: dict[str, set[str]] = {s: set() for s in self.streams}  # entry ids being handled
        self.dispatched = 0  # entries handed to the handler, over this consumer's life
        self._entries_read = 0  # and read (a malformed or trimmed one is read, never handed over)
        self.outage = Outage(bus, group, consumer, lambda: self.stopping)
        self.answers = AnswerWriter(bus, group, self.outage, self._release, lambda: self.stopping)

    @property
    def stopping(self) -> bool:
        """Asked to stop: read nothing more, take nothing over, and let go of work held through an outage."""
        return self._stop is not None and self._stop.is_set()

    @property
    def in_flight(self) -> int:
        """Entries being handled or answered."""
        return len(self._tasks) + self.answers.writing

    @property
    def waiting(self) -> int:
        """Entries held without a slot while they wait for something else (``set_aside``)."""
        return self._aside_count

    async def add_gated(self, streams: Sequence[str]) -> None:
        """Read more streams, each by a loop of its own as far as ``room`` allows (group made first)."""
        for stream in streams:
            if stream in self._gated:
                continue
            await self.bus.ensure_group(stream, self.group)
            self.streams.append(stream)
            self.holding.setdefault(stream, set())
            self._gated[stream] = asyncio.Event()
            if self._stop is not None:
                self._start_gated(stream, self._stop)

    def room_freed(self) -> None:
        """The handler's room grew: the gated streams waiting for room look again."""
        if self._waiting_for_room:
            for stream in list(self._waiting_for_room):
                if self.room is not None and (self.room(stream) or 0) > 0:
                    self._gated[stream].set()

    def _start_gated(self, stream: str, stop: asyncio.Event) -> None:
        async def read() -> None:
            reader = self.bus.reader()
            try:
                await self._read_until(stop, reader, {stream: "0"}, gated=stream)
            finally:
                await reader.aclose()

        self._gated_loops.append(asyncio.get_running_loop().create_task(read(), name=f"read:{stream}"))

    async def run(self, stop: asyncio.Event) -> None:
        """Read and dispatch until ``stop`` is set, then wait for in-flight work."""
        for stream in self.streams:
            await self.bus.ensure_group(stream, self.group)
        self._stop = stop
        for stream in self._gated:
            self._start_gated(stream, stop)
        # After a restart, our own unacknowledged entries come first.
        cursor = {stream: "0" for stream in self.streams if stream not in self._gated}
        reader = self.bus.reader()
        try:
            await self._read_until(stop, reader, cursor)
        finally:
            await reader.aclose()
        if self._gated_loops:  # each ends within one block_ms of stop
            await asyncio.wait(self._gated_loops, timeout=self.block_ms / 1000 + 5)
        await self.drain(self.bus.settings.drain_timeout_s)
        await self.answers.finish()

    async def burst(self) -> int:
        """Handle every entry there is now (our own pending ones first), wait until their answers are in
        Redis, and return how many were handled: a whole consumer with no loop to stop, nothing to sleep
        on (what a unit test, or a one-shot command, wants). Entries a handler publishes to the streams
        it reads are handled too, if they arrive before the last read finds nothing."""
        for stream in self.streams:
            await self.bus.ensure_group(stream, self.group)
        cursor = dict.fromkeys(self.streams, "0")
        started, never = self.dispatched, asyncio.Event()
        reader = self.bus.reader()
        try:
            while True:
                before, new_only = self._entries_read, all(c == ">" for c in cursor.values())
                cursor = await self._read_once(reader, cursor, never, block=False)
                if new_only and self._entries_read == before:
                    if not self._tasks:
                        break
                    await asyncio.wait(set(self._tasks.values()))  # what they publish is read next
        finally:
            await reader.aclose()
        await self.drain()
        return self.dispatched - started

    async def _read_until(self, stop: asyncio.Event, reader: HeldConnection, cursor: dict[str, str], *,
                          gated: str | None = None) -> None:
        failures = 0
        while not stop.is_set():
            count = None
            if gated is not None:
                self._gated[gated].clear()
                count = self.room(gated) if self.room is not None else None
                if count is not None and count <= 0 and cursor[gated] == ">":  # own pending: always read
                    await self._wait_for_room(gated, stop)
                    continue
            try:
                cursor = await self._read_once(reader, cursor, stop, count)
                failures = 0
            except Exception as exc:  # a read loop that ended would leave its streams unread, silently
                delay = RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS) - 1)]
                failures += 1
                if isinstance(exc, redis_errors.ResponseError) and "NOGROUP" in str(exc):
                    log.warning("consumer group %s vanished (Redis restarted?); recreating it", self.group)
                    with contextlib.suppress(*CONNECTION_ERRORS):  # else the next read says NOGROUP again
                        for stream in self.streams:
                            await self.bus.ensure_group(stream, self.group)
                    continue
                if isinstance(exc, CONNECTION_ERRORS):
                    log.warning("redis unreachable, retrying in %.2fs: %s", delay, exc)
                else:
                    log.exception("reading %s failed; retrying in %.2fs", ", ".join(cursor), delay)
                await sleep_or_stop(stop, delay)

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait for what is running; past ``timeout_s``, hand the rest back and stop it."""
        started = asyncio.get_running_loop().time()
        running: set[asyncio.Task[None]] = set()
        if self._tasks:
            _done, running = await asyncio.wait(set(self._tasks.values()), timeout=timeout_s)
        if not running:  # answers still on their way to Redis
            left = None if timeout_s is None else max(0.0, timeout_s - (asyncio.get_running_loop().time() - started))
            await self.answers.all_written(left)
        if not running:
            return
        handed = await self.hand_back()
        log.warning("drain timeout: handed back %d entr%s still running", handed, "y" if handed == 1 else "ies")
        for task in running:
            task.cancel()
        await asyncio.wait(running, timeout=5)

    async def hand_back(self) -> int:
        """Give up the entries being handled: marked idle past the claim threshold, so another
        consumer's reaper takes them at its next pass (their delivery count is kept)."""
        idle_ms = int(self.bus.settings.claim_idle_s * 1000) * 10
        handed = 0
        for stream, held in self.holding.items():
            ids = sorted(held)
            held.clear()  # no longer renewed by our reaper
            if ids:
                with contextlib.suppress(redis_errors.RedisError, OSError):
                    await self.bus.redis.xclaim(stream, self.group, self.consumer, min_idle_time=0,
                                                message_ids=list[Any](ids), idle=idle_ms, justid=True)
                    handed += len(ids)
        return handed

    def set_aside(self) -> bool:
        """Called by a handler about to wait for something other than its own work (its session's
        earlier turn): its slot goes to the next entry meanwhile, for up to ``aside`` entries at
        once. Returns whether it did; the handler calls ``take_back`` before it does its work."""
        if _aside.get() or self._aside_count >= self.aside_limit:
            return False
        self._aside_count += 1
        _aside.set(True)
        self._slots.give()
        return True

    async def take_back(self) -> None:
        """Wait for a slot again after ``set_aside`` (nothing to do if the handler kept its slot)."""
        if not _aside.get():
            return
        await self._slots.take()
        self._aside_count -= 1
        _aside.set(False)

    async def _wait_for_room(self, stream: str, stop: asyncio.Event) -> None:
        self._waiting_for_room.add(stream)
        try:  # a slot freeing sets the event (room_freed); the timeout is a safety net
            await asyncio.wait_for(self._gated[stream].wait(), self.block_ms / 1000)
        except TimeoutError:
            pass
        finally:
            self._waiting_for_room.discard(stream)

    async def _read_once(self, reader: HeldConnection, cursor: dict[str, str], stop: asyncio.Event,
                         room: int | None = None, *, block: bool = True) -> dict[str, str]:
        free = await self._slots.free_soon(stop)  # read only when there is room to run what we read
        if stop.is_set():
            return cursor
        count = min(self.batch, free, max(room, 1) if room is not None else self.batch)
        waits = ("BLOCK", self.block_ms) if block else ()
        response = await reader.execute("XREADGROUP", "GROUP", self.group, self.consumer, "COUNT", count,
                                        *waits, "STREAMS", *cursor, *cursor.values())
        for raw_stream, entries in response or []:
            stream = raw_stream.decode()
            if cursor[stream] != ">" and not entries:
                cursor = {**cursor, stream: ">"}  # pending backlog done; now new entries
            self._entries_read += len(entries)
            for raw_id, fields in entries:
                if cursor[stream] != ">":
                    cursor = {**cursor, stream: raw_id.decode()}
                if fields is None:  # pending entry deleted by trimming
                    await self.bus.redis.xack(stream, self.group, raw_id)
                    continue
                # Our own pending entries (read from id 0) were delivered before: to an earlier life of us.
                await self.dispatch(stream, raw_id.decode(), fields, times=1 if cursor[stream] == ">" else 2)
        if not response:
            return dict.fromkeys(cursor, ">")
        await let_started_work_run(self.bus.batcher)  # their replies go out before our next read does
        return cursor

    async def dispatch(self, stream: str, entry_id: str, fields: dict[bytes, bytes], *, times: int = 1) -> None:
        """Run the handler for one entry in its own task (``times``: its delivery count)."""
        try:
            message = decode(fields)
        except MalformedMessage as exc:
            await dead_letter(self.bus, stream, self.group, entry_id, fields, str(exc))
            return
        self.dispatched += 1
        if not self._slots.take_now():  # we read only as many as there were slots: rarely taken meanwhile
            await self._slots.take()
        self.holding.setdefault(stream, set()).add(entry_id)
        current_entry.set((stream, entry_id, fields))
        delivery.set(times)  # the task copies the context: its handler sees this count, and the trace
        trace.current.set(trace.from_entry(fields))
        self._tasks[stream, entry_id] = asyncio.get_running_loop().create_task(
            self._handle(stream, entry_id, fields, message))

    async def _handle(self, stream: str, entry_id: str, fields: dict[bytes, bytes], message: Message) -> None:
        answered = False
        quick = 0  # runs cut off in a row while Redis took the very next write: not an outage, then
        try:
            while True:
                try:
                    replies = await self.handler(message, stream)
                    break
                except asyncio.CancelledError:
                    raise
                except HandedOver as exc:  # another consumer holds the entry now: it answers and acknowledges
                    if not isinstance(exc, Moved):
                        log.info("handed over %s: %s", kv(stream=stream, entry=entry_id), exc)
                    return
                except REDIS_AWAY as exc:
                    # Not the message's fault, so not a delivery: it stays held here (the reaper renews it, so
                    # nobody claims it and max_deliveries counts only workers that died) and runs again once
                    # Redis takes writes (a failover's replica may take a while to confirm them).
                    log.warning("Redis away while handling %s (%s); run again here once Redis takes writes",
                                kv(stream=stream, entry=entry_id), exc)
                    again = await self.outage.run_again(stream, entry_id, quick)
                    if again is None:
                        return
                    quick = again
                    delivery.set(max(delivery.get(), 2))  # a second run: the handler treats it as a repeat
                except CONNECTION_ERRORS as exc:  # the handler's own socket, not Redis: pending, for the reaper
                    log.warning("handler cut off %s (%s); left pending for the reaper",
                                kv(stream=stream, entry=entry_id), exc)
                    return
                except Exception as exc:  # a handler bug must not lose the message or kill the loop
                    log.exception("handler failed %s", kv(stream=stream, entry=entry_id, type=message.type))
                    await dead_letter(
                        self.bus, stream, self.group, entry_id, fields, f"handler crashed: {type(exc).__name__}: {exc}"
                    )
                    return
            # The task ends here; the entry stays held (and its slot taken) until the reply is written.
            self.answers.send(stream, entry_id, fields, replies, _aside.get())
            answered = True
        finally:
            self._tasks.pop((stream, entry_id), None)  # by key: current_task() costs a getpid call on 3.11
            if not answered:
                self._release(stream, entry_id, _aside.get())

    def _release(self, stream: str, entry_id: str, aside: bool) -> None:
        """The entry is answered (or left to the reaper): its slot goes to the next one."""
        self.holding.get(stream, set()).discard(entry_id)
        if aside:  # its slot was given away and never taken back
            self._aside_count -= 1
        else:
            self._slots.give()
