"""A worker's side of the pool's backlog: a call's lane, this worker's room in it, parking, upkeep.

The Redis side (the lanes, the scripts) is ``hands/backlog.py``; the worker asks
here whether a call starts now (``room``), takes its place while it runs
(``take``/``release``), and otherwise parks it (``park``). A keeper task
counts the live workers every half second, feeds and measures every lane of
the pool, and, one worker per interval, sends back what waited too long.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from bus.loops import every, finish
from bus.presence import alive
from bus.protocol import ErrorCode, ToolExecute, now_ms
from bus.redis_client import RedisAway, RedisRefused
from bus.streams import Bus
from hands.backlog import Backlog, LaneState, describe, queued_ms
from hands.config import QueueSettings
from hands.errors import ToolFailure
from hands.limits import Limiter
from hands.registry import ToolRegistry

log = logging.getLogger("hands.lanes")

Gates = tuple[tuple[str, int], ...]
Entry = tuple[str, str, dict[bytes, bytes]]  # (stream, entry id, fields), as bus.consumer.current_entry holds it
KEEP_INTERVAL_S = 0.5


# Where a call read by this worker goes (Lanes.route): one of these.
@dataclass(frozen=True)
class Ungated:
    """A tool this worker lacks: its executor answers at once, no lane involved."""


@dataclass(frozen=True)
class Run:
    gates: Gates


@dataclass(frozen=True)
class Unrun:
    gates: Gates
    failure: ToolFailure


@dataclass(frozen=True)
class Park:
    """From the pool's entrance with no room here: into its lane (or QUEUE_FULL if the lane is full)."""

    gates: Gates


@dataclass(frozen=True)
class GiveBack:
    """From its lane, but the room this worker blocked with was taken since: back, for a worker with room."""

    gates: Gates


Route = Ungated | Run | Unrun | Park | GiveBack


class Lanes:
    def __init__(self, bus: Bus, queue: QueueSettings, limiter: Limiter, registry: ToolRegistry, *,
                 worker_id: str, freed: Callable[[], None], pool_limits: dict[str, int] | None = None) -> None:
        self.bus, self.queue, self.limiter, self.registry = bus, queue, limiter, registry
        # Pool-wide limits (hands.pool_limits): their free slots as last counted (every keeper tick), plus
        # what this worker took and gave back since. Another worker's takes show at the next count.
        self.pool_limits = pool_limits or {}
        self._pool_free = dict(self.pool_limits)
        self.worker_id, self._freed = worker_id, freed
        self.backlog = Backlog(bus, queue)
        self.streams: dict[str, Gates] = {}  # this worker's lane streams -> their gates
        self.states: dict[str, LaneState] = {}  # every lane of the pool, as last measured
        self.live_workers = 1
        # Calls taken on, per gate, counted when the worker decides (before any await): its room in
        # a lane. The limiter's slots are taken later, as a call runs; counting here keeps one read
        # from taking more than can start.
        self._taken: Counter[str] = Counter()
        self._gates: dict[str, Gates] = {}  # tool -> its gates, until the tools change (open)
        self._stop = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None

    def gates(self, tool: str) -> Gates | None:
        """The gates a call to ``tool`` passes, widest first (None for a tool this worker lacks)."""
        gates = self._gates.get(tool)
        if gates is None and tool in self.registry:
            definition = self.registry.get(tool)
            gates = self.limiter.gates(definition.category, definition.name, definition.max_concurrency)
            own = f"tool:{definition.name}"
            if own in self.pool_limits and all(gate != own for gate, _ in gates):  # its own lane, pool-wide
                gates = (*gates, (own, self.pool_limits[own]))
            self._gates[tool] = gates
        return gates

    def room(self, gates: Gates) -> int:
        taken, room, pool = self._taken, 1 << 30, self._pool_free
        for gate, capacity in gates:  # a loop, not min() over a generator: on every call
            room = min(room, capacity - taken[gate])
            if gate in pool:
                room = min(room, pool[gate])
        return room

    def room_in(self, stream: str) -> int | None:
        """How many calls of a lane's stream this worker could start now (None: not a lane)."""
        gates = self.streams.get(stream)
        return None if gates is None else self.room(gates)

    def take(self, gates: Gates) -> None:
        for gate, _ in gates:
            self._taken[gate] += 1
            if gate in self._pool_free:
                self._pool_free[gate] -= 1

    def release(self, gates: Gates) -> None:
        """A call ended: its place is free (the lanes waiting for room look again)."""
        for gate, _ in gates:
            self._taken[gate] -= 1
            if gate in self._pool_free:
                self._pool_free[gate] += 1
        self._freed()

    def left(self, stream: str, gates: Gates) -> None:
        """A call was read from ``stream``: if it is a lane's, refill the lane from its queues."""
        if stream in self.streams:
            self.backlog.feed_soon(gates[-1][0], self._cap(gates))

    def route(self, call: ToolExecute, stream: str, entry: Entry, *, delivery: int) -> Route:
        """Where a call read from ``stream`` (its ``delivery``-th time) goes; decided before any await, so
        the room counted is the room there is. A call taken over from a dead worker (a later delivery) or
        handed to this one has its own answer: never late, never moved again."""
        gates = self.gates(call.tool)
        if gates is None:
            return Ungated()
        first = delivery == 1
        if first and stream != self.bus.keys.hands_worker(self.worker_id) and \
                (late := self.overdue(call, entry)) is not None:
            return Unrun(gates, late)
        if self.room(gates) > 0:
            return Run(gates)
        if stream == self.bus.keys.hands_requests:
            return Park(gates)
        if stream in self.streams and first:
            return GiveBack(gates)
        return Run(gates)  # redelivered or handed over: it runs here, past the room if it must

    def overdue(self, call: ToolExecute, entry: Entry) -> ToolFailure | None:
        """QUEUE_TIMEOUT for a call that waited in the pool longer than ``hands.queue.wait_s``."""
        _stream, entry_id, fields = entry
        waited_s = (now_ms() - queued_ms(entry_id, fields)) / 1000
        if waited_s <= self.queue.wait_s:
            return None
        return ToolFailure(ErrorCode.QUEUE_TIMEOUT, f"waited {waited_s:.1f}s in the pool for a free slot, longer than "
                           f"hands.queue.wait_s ({self.queue.wait_s:g}s); it was not run",
                           suggestions=["try again later, or with fewer calls at once"], recoverable=True)

    async def park(self, call: ToolExecute, entry: Entry, gates: Gates) -> ToolFailure | None:
        """Put a call read from ``hands:requests`` in its lane (None: parked and acknowledged), or
        QUEUE_FULL when the lane holds its bound."""
        lane = gates[-1][0]
        _stream, entry_id, fields = entry
        for _attempt in range(2):
            bound = self._bound()
            held = await self.backlog.park(lane, call.session_id, entry_id, fields, cap=self._cap(gates), bound=bound)
            if held >= 0:
                return None
            await self._count_workers()
            if self._bound() <= bound:
                break  # the pool did not grow since the bound was taken: it stands
        setting = "hands.queue.pool_depth" if self.queue.pool_depth is not None else \
            f"hands.queue.depth {self.queue.depth} x {self.live_workers} live worker{'s' * (self.live_workers > 1)}"
        return ToolFailure(ErrorCode.QUEUE_FULL, f"the pool is busy: {-held} calls already wait in lane {lane}, "
                           f"its bound ({setting})", suggestions=["try again in a moment, or with fewer calls at once"],
                           recoverable=True)

    async def give_back(self, call: ToolExecute, entry: Entry, gates: Gates) -> None:
        """A call read from its lane that this worker cannot start after all (the room it blocked
        with was taken meanwhile): first in its session's queue again, for a worker with room."""
        _stream, entry_id, fields = entry
        await self.backlog.park(gates[-1][0], call.session_id, entry_id, fields, cap=self._cap(gates),
                                bound=1 << 62, given_back=True)

    def _cap(self, gates: Gates) -> int:
        """Calls a lane's stream may hold ready: what the pool could start in it at once."""
        return min(capacity for _, capacity in gates) * self.live_workers

    def _bound(self) -> int:
        return self.queue.pool_depth if self.queue.pool_depth is not None else self.queue.depth * self.live_workers

    async def _count_workers(self) -> None:
        self.live_workers = max(1, len(await alive(self.bus, "hands")))

    async def open(self) -> list[str]:
        """The lane streams of every tool this worker has (one per category, one per tool with a
        limit), registered for the pool; returns them for the consumer to read."""
        self._gates.clear()
        for name in self.registry.names():
            gates = self.gates(name)
            if gates is not None:
                self.streams[self.backlog.stream(gates[-1][0])] = gates
        await self.backlog.lanes([gates[-1][0] for gates in self.streams.values()])
        return list(self.streams)

    async def _count_pool_slots(self) -> None:
        """Free slots of each pool-wide limit: its capacity less the leases not yet run out. A call
        this worker took but has not yet given its lease counts against it too."""
        if not self.pool_limits:
            return
        now = now_ms()
        async with self.bus.redis.pipeline(transaction=False) as pipe:
            for gate in self.pool_limits:
                pipe.zcount(self.bus.keys.pool_limit(gate), now, "+inf")
            held = await pipe.execute()
        before = dict(self._pool_free)
        for (gate, capacity), holders in zip(self.pool_limits.items(), held, strict=True):
            taken_here = self._taken[gate]  # includes calls not yet holding their lease
            self._pool_free[gate] = capacity - max(int(holders), taken_here)
        if any(self._pool_free[gate] > before[gate] for gate in before):
            self._freed()

    def status(self) -> dict[str, dict[str, float]]:
        return describe(self.states, now_ms())

    async def start(self) -> None:
        await self._count_workers()
        self._keeper = asyncio.create_task(self._keep(), name="lanes")

    async def close(self) -> None:
        await finish(self._keeper, self._stop, grace_s=5)

    async def _keep(self) -> None:
        async for _ in every(KEEP_INTERVAL_S, self._stop):
            try:
                await self.keep_once()
            except (RedisAway, RedisRefused) as exc:  # Redis away: the next tick tries again
                log.warning("backlog upkeep failed: %s", exc)
            except Exception:  # an upkeep that ended would stop feeding the lanes, silently
                log.exception("backlog upkeep failed unexpectedly; the next tick tries again")

    async def keep_once(self) -> None:
        await self._count_workers()
        await self._count_pool_slots()
        expire = bool(await self.bus.redis.set(self.bus.keys.backlog_turn, self.worker_id, nx=True,
                                               px=int(KEEP_INTERVAL_S * 1000) - 50))
        states = {}
        for lane in await self.backlog.lanes(()):
            gates = self.streams.get(self.backlog.stream(lane))
            cap = self._cap(gates) if gates is not None else 0  # a tool this worker lacks: fed by those with it
            states[lane] = await self.backlog.keep(lane, cap=cap, expire=expire)
        self.states = states
