"""Progress of long work where a person waits: one rule for how often it is said and how it reads.

A ``Progress`` counts what is done of a total (bytes or items; the total may be
unknown, or grow) and shows it through a ``Sink`` no more often than its
``Throttle`` allows:

- on a terminal (``Terminal``), one line redrawn in place, at most every
  ``tty_every_s``, with a bar;
- anywhere else (``Lines``: a log, systemd's journal, a file), a line when
  another ``step`` of the total is done or ``every_s`` has passed since the
  last one, never more than one per ``min_s``: a few lines, never a flood;
- ``Brief`` hands on the short form ("fetching 1.2 of 4.1 GB") only when it
  changes, for a status a process publishes (a state file, a heartbeat).

The first and the last state are always shown. Time comes from a clock that
is a seam (``time.monotonic`` by default), so tests drive the throttling.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, TextIO

Unit = Literal["bytes", "items"]
BAR_ROOM = 23 + 80  # a bar (20 cells, brackets, a space) beside the longest line a piece of work says
Clock = Callable[[], float]


@dataclass(frozen=True)
class Throttle:
    """How often progress is shown: on a terminal every ``tty_every_s``; elsewhere every ``step`` of the
    total or every ``every_s``, whichever comes first, and at most once per ``min_s``."""

    every_s: float = 5.0
    step: float = 0.10
    min_s: float = 1.0
    tty_every_s: float = 0.2


@dataclass(frozen=True)
class Snapshot:
    """Where a piece of work stands: what it is, how far, how fast, and how long yet."""

    what: str  # "fetching the model"
    done: int
    total: int | None
    unit: Unit
    elapsed_s: float
    phase: str = ""  # a step within the work whose size is unknown ("building the wheel")
    noun: str = ""  # what an item is ("entries"); bytes need none
    finished: bool = False
    failed: bool = False  # finished without completing
    skipped: int = 0  # of ``done``, what was there already (a file fetched before): not part of the rate

    @property
    def fraction(self) -> float | None:
        return min(1.0, self.done / self.total) if self.total else None

    @property
    def rate(self) -> float | None:
        """Per second, over the whole run (steadier than the last moment's, and what an ETA needs)."""
        worked = self.done - self.skipped
        return worked / self.elapsed_s if self.elapsed_s >= 0.5 and worked > 0 else None

    @property
    def eta_s(self) -> float | None:
        if self.finished or not self.total or not self.rate:
            return None
        return max(0.0, (self.total - self.done) / self.rate)

    def amount(self) -> str:
        """"412.3 MB of 1.1 GB", "4,000/10,000 entries", "4,000 entries" (total unknown)."""
        if self.unit == "bytes":
            return f"{size(self.done)} of {size(self.total)}" if self.total else size(self.done)
        noun = f" {self.noun}" if self.noun else ""
        return f"{self.done:,}/{self.total:,}{noun}" if self.total else f"{self.done:,}{noun}"

    def line(self) -> str:
        """The full line: what, how much, how fast, how long yet (or how long it took)."""
        parts: list[str] = []
        if self.done or self.total:
            share = f" ({self.fraction:.0%})" if self.fraction is not None else ""
            parts.append(self.amount() + share)
        if self.rate and not self.phase:
            per = f"{size(round(self.rate))}/s" if self.unit == "bytes" else f"{self.rate:,.0f}/s"
            parts.append(per)
        if self.failed:  # how far it came, and how long it ran
            return f"{self.what}: failed" + (f" while {self.phase}" if self.phase else "") + \
                (f" at {self.amount()}" if self.done or self.total else "") + f", after {duration(self.elapsed_s)}"
        if self.finished:
            parts.append(f"done in {duration(self.elapsed_s)}")
        elif self.eta_s is not None:
            parts.append(f"{duration(self.eta_s)} left")
        else:
            parts.append(duration(self.elapsed_s))
        if self.phase and not self.finished:
            return f"{self.what}: {self.phase}, " + ", ".join(parts)
        return f"{self.what}: " + ", ".join(parts)

    def brief(self) -> str:
        """The short form for a status: "fetching the model: 1.2 of 4.1 GB", "building (2 min 5 s)"."""
        if self.finished:
            return ""
        if self.phase:
            return f"{self.what}: {self.phase} ({duration(self.elapsed_s, coarse=True)})"
        if self.unit == "bytes":
            total = f" of {self.total / 1e9:.1f} GB" if self.total else " GB"
            return f"{self.what}: {self.done / 1e9:.1f}{total}"
        return f"{self.what}: {self.amount()}"


class Sink(Protocol):
    """Where progress is shown; ``in_place``: a terminal line redrawn, not lines appended."""

    @property
    def in_place(self) -> bool: ...

    def show(self, snapshot: Snapshot) -> None: ...


class Lines:
    """Each state shown is a line for ``say`` (a print, a logger's info)."""

    in_place = False

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say

    def show(self, snapshot: Snapshot) -> None:
        self.say(snapshot.line())


class Terminal:
    """One line on a terminal, redrawn in place (cut to the terminal's width, so it never wraps), with a bar
    on a terminal wide enough for it beside the words; ended with a newline when the work is done."""

    in_place = True

    def __init__(self, stream: TextIO, *, prefix: str = "", width: int | None = None) -> None:
        self.stream, self.prefix, self.width = stream, prefix, width

    def show(self, snapshot: Snapshot) -> None:
        line, fraction = snapshot.line(), snapshot.fraction
        room = (self.width or shutil.get_terminal_size().columns) - 1 - len(self.prefix)
        if fraction is not None and room >= BAR_ROOM:  # a steady bar, or none: never one that comes and goes
            line = "[" + "#" * round(fraction * 20) + "." * (20 - round(fraction * 20)) + "] " + line
        self.stream.write(f"\r{self.prefix}{line[:max(room, 10)]}\x1b[K" + ("\n" if snapshot.finished else ""))
        self.stream.flush()


class Brief:
    """The short form for a status, handed on only when it changes (so a state file is written a few dozen
    times, not at every block); an empty text when the work is done."""

    in_place = False

    def __init__(self, publish: Callable[[str], None]) -> None:
        self.publish = publish
        self._last: str | None = None

    def show(self, snapshot: Snapshot) -> None:
        text = snapshot.brief()
        if text != self._last:
            self._last = text
            self.publish(text)


@dataclass
class Tee:
    """Several sinks at once (a terminal and a state file); in place if the first is."""

    sinks: tuple[Sink, ...]

    @property
    def in_place(self) -> bool:
        return bool(self.sinks) and self.sinks[0].in_place

    def show(self, snapshot: Snapshot) -> None:
        for sink in self.sinks:
            sink.show(snapshot)


def for_stream(stream: TextIO, say: Callable[[str], None], *, prefix: str = "") -> Sink:
    """A terminal's in-place line if ``stream`` is one, else ``say``'s lines."""
    return Terminal(stream, prefix=prefix) if stream.isatty() else Lines(say)


@dataclass
class Progress:
    """A piece of work with a size (or none), shown through ``sink`` as ``throttle`` allows. Safe to update
    from one thread while another reads ``snapshot()`` (a heartbeat)."""

    what: str
    total: int | None
    sink: Sink
    unit: Unit = "items"
    noun: str = ""
    throttle: Throttle = field(default_factory=Throttle)
    clock: Clock = time.monotonic
    done: int = 0
    phase: str = ""
    finished: bool = False
    failed: bool = False
    skipped: int = 0

    def __post_init__(self) -> None:
        self.started = self.clock()
        self._shown_at: float | None = None
        self._shown_fraction = 0.0
        self._lock = threading.Lock()

    def update(self, done: int, *, total: int | None = None, phase: str | None = None) -> None:
        """Now ``done`` (of ``total``, if it is now known better; in ``phase``, if it changed)."""
        with self._lock:
            self.done = done
            if total is not None:
                self.total = total
            changed = phase is not None and phase != self.phase
            if phase is not None:
                self.phase = phase
        self._maybe_show(force=changed)

    def advance(self, by: int) -> None:
        self.update(self.done + by)

    def skip(self, by: int) -> None:
        """``by`` more done that needed no work (found already there): counted, but not in the rate."""
        with self._lock:
            self.skipped += by
        self.update(self.done + by)

    def tick(self) -> None:
        """Nothing new is done, but time passed: shown again if due (a build's elapsed time)."""
        self._maybe_show(force=False)

    def finish(self, *, failed: bool = False) -> None:
        """The work is done (or ``failed``): its last state is always shown (once)."""
        with self._lock:
            if self.finished:
                return
            self.finished, self.failed = True, failed
        self._show(self.clock())

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(self.what, self.done, self.total, self.unit, self.clock() - self.started,
                            phase=self.phase, noun=self.noun, finished=self.finished, failed=self.failed,
                            skipped=self.skipped)

    def _maybe_show(self, *, force: bool) -> None:
        now = self.clock()
        if force or self._due(now):
            self._show(now)

    def _due(self, now: float) -> bool:
        if self._shown_at is None:
            return True  # the first state: the person learns at once that the work began
        since = now - self._shown_at
        rule = self.throttle
        if self.sink.in_place:
            return since >= rule.tty_every_s
        if since < rule.min_s:
            return False
        fraction = self.snapshot().fraction
        stepped = fraction is not None and fraction - self._shown_fraction >= rule.step
        return stepped or since >= rule.every_s

    def _show(self, now: float) -> None:
        snapshot = self.snapshot()
        self._shown_at = now
        self._shown_fraction = snapshot.fraction or 0.0
        self.sink.show(snapshot)


def size(count: int | None) -> str:
    """Bytes as a person reads them, in powers of 1000 as download tools count: 412.3 MB, 1.1 GB."""
    value = float(count or 0)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def duration(seconds: float, *, coarse: bool = False) -> str:
    """"42 s", "3 min 5 s", "1 h 2 min"; ``coarse``: whole minutes past the first (for a status)."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min" if coarse or not secs else f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
