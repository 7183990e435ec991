"""A started command, in whatever sandbox: its output as it comes (capped), stdin, waiting, and a stop
that always ends its whole tree."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from hands.sandbox.cgroup import RunCgroup

log = logging.getLogger("hands.sandbox")

KILL_GRACE_S = 3.0
READ_GRACE_S = 2.0


@dataclass
class Output:
    """Keeps the first and the last ``cap // 2`` bytes of a stream and counts what fell between."""

    cap: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    dropped: int = 0
    total: int = 0  # bytes seen so far: an offset for "what is new since"

    def since(self, offset: int) -> tuple[str, int]:
        """Output after byte ``offset`` still held in the tail, and the new offset."""
        tail_start = self.total - len(self.tail)
        if offset >= tail_start:
            return self.tail[offset - tail_start:].decode(errors="replace"), self.total
        if offset < len(self.head):  # still in the head: head rest, then the tail
            gap = f"\n…[{self.dropped:,} bytes not kept]…\n" if self.dropped else ""
            return self.head[offset:].decode(errors="replace") + gap + self.tail.decode(errors="replace"), self.total
        return f"…[{tail_start - offset:,} bytes not kept]…\n" + self.tail.decode(errors="replace"), self.total

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        excess = len(self.tail) - self.cap // 2
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    def text(self) -> str:
        middle = f"\n…[{self.dropped:,} bytes of output not kept]…\n" if self.dropped else ""
        return self.head.decode(errors="replace") + middle + self.tail.decode(errors="replace")


@dataclass
class RunResult:
    exit_code: int | None
    signal: str | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_ms: int
    tier: str
    dropped_bytes: int


class Child(Protocol):
    """What ``Running`` needs of a started command: asyncio's ``Process``, or a warm sandbox's command."""

    @property
    def returncode(self) -> int | None: ...
    @property
    def stdin(self) -> asyncio.StreamWriter | None: ...
    @property
    def stdout(self) -> asyncio.StreamReader | None: ...
    @property
    def stderr(self) -> asyncio.StreamReader | None: ...
    async def wait(self) -> int: ...


class Running:
    """A started command: its output as it comes, stdin, waiting, and a stop that kills the tree."""

    def __init__(self, process: Child, tier: str, output_bytes: int, *, cgroup: RunCgroup | None = None,
                 capture_stdout: bool = True, kill_tree: Callable[[], Awaitable[None]] | None = None) -> None:
        self.process, self.tier, self.cgroup = process, tier, cgroup
        # How its whole tree dies: the group of the process we started, or a warm sandbox's runner's doing.
        self._kill_tree = kill_tree
        self.started = time.monotonic()
        self.out, self.err = Output(output_bytes), Output(output_bytes)
        self.timed_out = self.killed = False
        self._readers = [asyncio.create_task(_drain(process.stderr, self.err))]
        if capture_stdout:  # else the caller reads process.stdout itself (a protocol spoken over it)
            self._readers.append(asyncio.create_task(_drain(process.stdout, self.out)))

    @property
    def done(self) -> bool:
        return self.process.returncode is not None

    async def write(self, data: bytes, *, close: bool = False) -> None:
        stdin = self.process.stdin
        if stdin is None or stdin.is_closing():
            raise BrokenPipeError("the command's stdin is closed")
        with contextlib.suppress(ConnectionResetError):
            stdin.write(data)
            await stdin.drain()
        if close:
            stdin.close()

    async def wait(self, timeout_s: float | None) -> bool:
        """True when it exited within ``timeout_s`` (None: wait for ever); a timeout marks it timed out."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.process.wait()
            return True
        except TimeoutError:
            self.timed_out = True
            return False

    async def stop(self) -> None:
        """Kill the whole tree if it still runs, then collect the rest of its output."""
        if self.process.returncode is None:
            self.killed = True
            if self.cgroup is not None:
                self.cgroup.kill()  # every process of the command at once, wherever it went
            if self._kill_tree is not None:
                await self._kill_tree()
            else:
                assert isinstance(self.process, asyncio.subprocess.Process)
                await _kill_tree(self.process)
        if self.cgroup is not None:
            self.cgroup.kill()  # stragglers of a command that ended by itself
            await self.cgroup.remove_when_empty()
        # A descendant that escaped the group may still hold the pipes: never wait on it for ever.
        _, stuck = await asyncio.wait(self._readers, timeout=READ_GRACE_S)
        for reader in stuck:
            reader.cancel()
        if stuck:
            log.warning("a command's output pipes stayed open after it ended; stopped reading them")

    def result(self) -> RunResult:
        code = self.process.returncode
        return RunResult(
            exit_code=code if code is not None and code >= 0 else None,
            signal=signal.Signals(-code).name if code is not None and code < 0 else None,
            stdout=self.out.text(), stderr=self.err.text(), timed_out=self.timed_out,
            duration_ms=int((time.monotonic() - self.started) * 1000), tier=self.tier,
            dropped_bytes=self.out.dropped + self.err.dropped,
        )


async def run_to_end(running: Running, *, timeout_s: float, stdin: bytes | None = None) -> RunResult:
    """A started command to its end (or its timeout, which kills the whole tree), then its result."""
    try:
        if stdin is not None:
            await running.write(stdin, close=True)
        await running.wait(timeout_s)
    finally:
        await running.stop()
    return running.result()


async def _drain(stream: asyncio.StreamReader | None, into: Output) -> None:
    """Read a stream to its end, keeping only what ``into`` keeps: a flood never grows memory."""
    if stream is None:
        return
    while chunk := await stream.read(65536):
        into.add(chunk)


async def _kill_tree(process: asyncio.subprocess.Process) -> None:
    """SIGTERM the whole group, give it a grace period, then SIGKILL the group whatever happened:
    the leader exiting early does not mean every process it started did."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(process.wait()), KILL_GRACE_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()
