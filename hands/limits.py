"""Layered concurrency limits with one FIFO wait queue, and the memory watermark.

A call needs a slot at every gate it passes: global, its category, its tool
(when the tool sets ``max_concurrency``). It takes them all at once or waits
in the queue; it never holds a wide slot while waiting for a narrow one, so a
burst of one slow tool cannot starve the others. Waiters are admitted in
arrival order among those whose gates are free. The queue has a depth
(``QUEUE_FULL`` beyond it) and a wait limit (``QUEUE_TIMEOUT``). Slots are
released in reverse order on every path, cancellation included.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bus.protocol import ErrorCode
from hands.config import ConcurrencySettings, QueueSettings
from hands.errors import ToolFailure
from hands.registry import Category


@dataclass(eq=False)
class _Waiter:
    gates: tuple[tuple[str, int], ...]
    admitted: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Limiter:
    def __init__(self, concurrency: ConcurrencySettings, queue: QueueSettings) -> None:
        self.concurrency, self.queue = concurrency, queue
        self._in_use: Counter[str] = Counter()
        self._waiters: list[_Waiter] = []
        self._gates: dict[tuple[str, str, int | None], tuple[tuple[str, int], ...]] = {}

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def room(self) -> int:
        """Calls that could start now at the global gate (0 when the worker is full)."""
        return max(0, self.concurrency.global_ - self._in_use["global"])

    def gates(self, category: str, tool: str, tool_limit: int | None) -> tuple[tuple[str, int], ...]:
        """The (gate, capacity) pairs a call passes, widest first."""
        key = (category, tool, tool_limit)
        if key not in self._gates:  # settings are fixed for the worker's life
            self._gates[key] = self._make_gates(category, tool, tool_limit)
        return self._gates[key]

    def _make_gates(self, category: str, tool: str, tool_limit: int | None) -> tuple[tuple[str, int], ...]:
        short = Category(category).key  # file_operation -> file
        gates = [("global", self.concurrency.global_), (f"category:{short}",
                                                          getattr(self.concurrency, short, self.concurrency.global_))]
        if tool_limit is not None:
            gates.append((f"tool:{tool}", tool_limit))
        return tuple(gates)

    def slot(self, category: str, tool: str, tool_limit: int | None) -> _Slot:
        """``async with limiter.slot(...)``: hold a slot at every gate the call passes."""
        return _Slot(self, self.gates(category, tool, tool_limit))

    def take_if_free(self, gates: tuple[tuple[str, int], ...]) -> bool:
        """Take a slot at every gate now if each has one (no await: the common case); else False."""
        in_use = self._in_use
        for gate, capacity in gates:
            if in_use[gate] >= capacity:
                return False
        self._take(gates)
        return True

    async def wait(self, gates: tuple[tuple[str, int], ...]) -> None:
        """Queue for a slot at every gate (``QUEUE_FULL``, ``QUEUE_TIMEOUT``); ``release`` it after."""
        if len(self._waiters) >= self.queue.depth:
            raise ToolFailure(
                ErrorCode.QUEUE_FULL,
                f"this worker is busy: {len(self._waiters)} calls are already waiting (hands.queue.depth)",
                suggestions=["try again in a moment"], recoverable=True,
            )
        waiter = _Waiter(gates)
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.admitted), self.queue.wait_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if waiter.admitted.done():  # admitted in the same instant: give the slots back
                self.release(gates)
            else:
                waiter.admitted.cancel()
                self._waiters.remove(waiter)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise ToolFailure(
                ErrorCode.QUEUE_TIMEOUT,
                f"waited {self.queue.wait_s:g}s for a free slot (hands.queue.wait_s) and none came",
                suggestions=["try again later, or with fewer calls at once"], recoverable=True,
            ) from None

    def _free(self, gates: tuple[tuple[str, int], ...]) -> bool:
        return all(self._in_use[gate] < capacity for gate, capacity in gates)

    def _take(self, gates: tuple[tuple[str, int], ...]) -> None:
        for gate, _ in gates:
            self._in_use[gate] += 1

    def release(self, gates: tuple[tuple[str, int], ...]) -> None:
        for gate, _ in reversed(gates):
            self._in_use[gate] -= 1
        if not self._waiters:
            return
        for waiter in list(self._waiters):  # admit, oldest first, whoever now fits
            if self._free(waiter.gates):
                self._waiters.remove(waiter)
                self._take(waiter.gates)
                waiter.admitted.set_result(None)


class _Slot:
    """A held slot; a plain class rather than a generator context manager."""

    __slots__ = ("gates", "limiter")

    def __init__(self, limiter: Limiter, gates: tuple[tuple[str, int], ...]) -> None:
        self.limiter, self.gates = limiter, gates

    async def __aenter__(self) -> None:
        if not self.limiter.take_if_free(self.gates):
            await self.limiter.wait(self.gates)

    async def __aexit__(self, *_exc: object) -> None:
        self.limiter.release(self.gates)


def memory_used_share(meminfo: Path = Path("/proc/meminfo")) -> float:
    """Share of this machine's memory in use (1 - MemAvailable/MemTotal); 0 where unknown."""
    try:
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        total = int(fields["MemTotal"].split()[0])
        available = int(fields["MemAvailable"].split()[0])
    except (OSError, KeyError, ValueError):
        return 0.0
    return 1 - available / total if total else 0.0


_last_reading = [0.0, 0.0]  # when, share: /proc/meminfo is read at most twice a second


def check_memory(watermark: float) -> None:
    now = time.monotonic()
    if now - _last_reading[0] > 0.5:
        _last_reading[:] = [now, memory_used_share()]
    used = _last_reading[1]
    if used > watermark:
        raise ToolFailure(
            ErrorCode.RESOURCE_EXHAUSTED,
            f"this worker's machine is using {used:.0%} of its memory, above the {watermark:.0%} "
            "watermark (hands.memory_watermark); new work is refused until it drops",
            suggestions=["try again later"], recoverable=True,
        )
