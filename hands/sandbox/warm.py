"""Warm sandboxes: a session's commands reuse a bwrap kept running for it, a runner inside forking each one.

A cold command pays for a bwrap start (~11 ms for ``true``); a warm one is a
message to a runner already inside (``warm_runner.py``), started with the
same arguments, rlimits, uid, seccomp filter and a pids cgroup of its own
under the session's. One warm sandbox runs one command at a time: a session's
concurrent commands each take an idle one or start another, so each command
still has its sandbox's cgroup caps to itself. A sandbox is for one session
and one workspace (an identity's, with its shared folders): another session
never gets it. Idle for ``hands.sandbox.warm_idle_s``, it is torn down; so is
every one at the worker's shutdown. A runner that died is dropped and the
command goes to a new one, but only when the request provably never reached
it: a command is never run twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import select
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bus.errors import PincerError
from hands.sandbox.cgroup import RunCgroup

log = logging.getLogger("hands.sandbox")
RUNNER_SOURCE = (Path(__file__).parent / "warm_runner.py").read_text()
KILL_WAIT_S = 6.0  # the runner's own grace (3 s) and its sweep (2 s), and a margin
ATTEMPTS = 3  # sandboxes tried for one command before it runs cold
MAX_REQUEST = 1024 * 1024  # the runner reads a request of up to 2 MiB in one datagram; larger ones run cold
SEND_BUFFER = 4 * 1024 * 1024  # one request is one datagram: a long command line and its environment fit


@dataclass(frozen=True)
class WarmKey:
    """What a warm sandbox is for: one session, in one workspace with its shared folders as mounted."""

    session: str
    root: Path
    shared: tuple[tuple[str, str, bool], ...] = ()


class NotDelivered(PincerError):
    """The runner was gone before it could read the request: the command did not run anywhere."""


class TooLarge(NotDelivered):
    """The request is larger than one message may be: the command runs cold, the sandbox stays."""


class WarmProcess:
    """A command running in a warm sandbox, shaped as ``Running`` uses asyncio's ``Process``."""

    def __init__(self, sandbox: WarmSandbox, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader,
                 stderr: asyncio.StreamReader, transports: list[asyncio.BaseTransport]) -> None:
        self.sandbox, self.stdin, self.stdout, self.stderr = sandbox, stdin, stdout, stderr
        self.transports = transports  # the output pipes' ends, closed if the command never starts
        self.ended: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @property
    def returncode(self) -> int | None:
        return self.ended.result() if self.ended.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self.ended)

    def close_pipes(self) -> None:
        self.stdin.close()
        for transport in self.transports:
            transport.close()

    def finish(self, code: int) -> None:
        if not self.ended.done():
            self.ended.set_result(code)

    async def kill_tree(self) -> None:
        """The runner kills its group (SIGTERM, grace, SIGKILL) and whatever it left; a runner that does not
        answer in time loses its whole sandbox, and the command with it."""
        if self.returncode is not None:
            return
        with contextlib.suppress(OSError):
            self.sandbox.control.send(json.dumps({"kill": True}).encode())
        try:
            await asyncio.wait_for(self.wait(), KILL_WAIT_S)
        except TimeoutError:
            log.warning("a warm sandbox's runner did not stop its command in time; tearing the sandbox down")
            await self.sandbox.close()
        self.finish(-signal.SIGKILL)


class WarmSandbox:
    """One bwrap with a runner inside, its control socket and its cgroup."""

    def __init__(self, key: WarmKey, process: asyncio.subprocess.Process, control: socket.socket,
                 cgroup: RunCgroup | None, *, on_idle: Callable[[WarmSandbox], None],
                 on_gone: Callable[[WarmSandbox], None]) -> None:
        self.key, self.process, self.control, self.cgroup = key, process, control, cgroup
        self.on_idle, self.on_gone = on_idle, on_gone
        self.idle_since = time.monotonic()
        self.current: WarmProcess | None = None
        self.gone = False
        self.listener = asyncio.create_task(self._listen(), name="warm-sandbox")

    def alive(self) -> bool:
        """Still there to take a request: its process runs and the runner's end is open."""
        if self.gone or self.process.returncode is not None:
            return False
        poller = select.poll()
        poller.register(self.control.fileno(), select.POLLIN | select.POLLHUP)
        return not poller.poll(0)  # idle, the runner says nothing: anything to read is its end closing

    async def run(self, argv: list[str], *, env: dict[str, str], cwd: str, line_bytes: int) -> WarmProcess:
        """Hand a command to the runner; ``NotDelivered`` when the runner was provably gone before it."""
        if not self.alive():
            raise NotDelivered
        loop = asyncio.get_running_loop()
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        theirs = [stdin_r, stdout_w, stderr_w]
        try:
            # Ready before the request goes: a quick command's exit can arrive at the next await.
            transports: list[asyncio.BaseTransport] = []
            stdin = await _writer(loop, stdin_w)
            process = WarmProcess(self, stdin, await _reader(loop, stdout_r, line_bytes, transports),
                                  await _reader(loop, stderr_r, line_bytes, transports), transports)
            if not self.alive():
                process.close_pipes()
                raise NotDelivered
            request = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
            if len(request) > MAX_REQUEST:
                process.close_pipes()
                raise TooLarge
            self.current = process
            try:
                socket.send_fds(self.control, [request], theirs)
            except OSError as exc:  # a datagram is queued whole or not at all
                self.current = None
                process.close_pipes()
                raise (TooLarge if exc.errno == errno.EMSGSIZE else NotDelivered) from None
        finally:
            for fd in theirs:  # the runner holds its own copies now
                os.close(fd)
        return process

    async def close(self) -> None:
        """Tear the whole sandbox down: the runner, bwrap, whatever still runs in it."""
        self.gone = True
        if self.listener is not asyncio.current_task():
            self.listener.cancel()  # its read leaves the loop before the socket is closed under it
            await asyncio.wait([self.listener])
        await self._teardown()

    async def _teardown(self) -> None:
        self.control.close()  # the runner reads EOF: it kills its command and ends
        if self.cgroup is not None:
            self.cgroup.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        await self.process.wait()
        if self.cgroup is not None:
            await self.cgroup.remove_when_empty()
        if self.current is not None:
            self.current.finish(-signal.SIGKILL)

    async def _listen(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await loop.sock_recv(self.control, 65536):
                code = _exit_code(json.loads(data))
                if self.current is not None:
                    current, self.current = self.current, None
                    self.idle_since = time.monotonic()
                    current.finish(code)
                    self.on_idle(self)
        except (OSError, ValueError):
            pass
        self.gone = True  # the runner died (or said something no runner says): so did its sandbox
        if self.current is not None:
            self.current.finish(-signal.SIGKILL)
        await self._teardown()
        self.on_gone(self)  # only now: the pool's close() waits for a teardown under way


def _exit_code(message: Any) -> int:
    """The exit code a runner reported; ValueError for anything else (a command could take its runner over:
    what it says is believed only as far as its own session's exit codes)."""
    code = message.get("exit") if isinstance(message, dict) else None
    if not isinstance(code, int) or not -64 < code < 256 or (code < 0 and -code not in _SIGNALS):
        raise ValueError(f"not a runner's message: {message!r:.100}")
    return code


_SIGNALS = {s.value for s in signal.Signals}
Launch = Callable[[WarmKey, int], Awaitable[tuple[asyncio.subprocess.Process, RunCgroup | None]]]


class WarmPool:
    """Each session's idle warm sandboxes; one is taken per command, and given back when it ends."""

    def __init__(self, launch: Launch, *, idle_s: float, most: int) -> None:
        self.launch, self.idle_s, self.most = launch, idle_s, most
        self.starting = 0  # sandboxes being started now: counted against ``most`` too
        self.idle: dict[WarmKey, list[WarmSandbox]] = {}
        self.all: set[WarmSandbox] = set()
        self.reaper: asyncio.Task[None] | None = None
        self.closing = False

    async def run(self, key: WarmKey, argv: list[str], *, env: dict[str, str], cwd: str,
                  line_bytes: int) -> WarmProcess | None:
        """Run a command in one of ``key``'s idle sandboxes, or a new one; None when ``most`` sandboxes run
        commands already (the caller runs it cold). To make room, the longest idle one of any session goes."""
        for _ in range(ATTEMPTS):
            sandbox = self._take(key)
            if sandbox is None:
                if len(self.all) + self.starting >= self.most and not await self._evict():
                    return None
                sandbox = await self._start(key)
            try:
                return await sandbox.run(argv, env=env, cwd=cwd, line_bytes=line_bytes)
            except TooLarge:
                self._given_back(sandbox)
                return None
            except NotDelivered:
                log.info("a warm sandbox's runner was gone; the command goes to another")
                await sandbox.close()
            except BaseException:  # cancelled before the request went: the sandbox is still free
                if sandbox.current is None:
                    self._given_back(sandbox)
                raise
        log.warning("warm sandboxes' runners keep dying before they take a command; this one runs cold")
        return None

    async def close(self) -> None:
        self.closing = True
        if self.reaper is not None:
            self.reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.reaper
        for sandbox in list(self.all):
            await sandbox.close()
        self.all.clear()
        self.idle.clear()

    async def _evict(self) -> bool:
        """Tear down the longest idle sandbox, of any session; False when none is idle."""
        idle = [s for waiting in self.idle.values() for s in waiting]
        if not idle:
            return False
        oldest = min(idle, key=lambda s: s.idle_since)
        self.idle[oldest.key].remove(oldest)
        self.all.discard(oldest)
        await oldest.close()
        return True

    def _take(self, key: WarmKey) -> WarmSandbox | None:
        waiting = self.idle.get(key, [])
        while waiting:
            sandbox = waiting.pop()
            if sandbox.alive():
                return sandbox
        return None

    async def _start(self, key: WarmKey) -> WarmSandbox:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.starting += 1
        try:
            process, cgroup = await self.launch(key, theirs.fileno())
        except BaseException:
            ours.close()
            raise
        finally:
            self.starting -= 1
            theirs.close()
        ours.setblocking(False)
        with contextlib.suppress(OSError):  # capped by net.core.wmem_max; past it, such a command runs cold
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        sandbox = WarmSandbox(key, process, ours, cgroup, on_idle=self._given_back, on_gone=self._gone)
        self.all.add(sandbox)
        if self.reaper is None or self.reaper.done():
            self.reaper = asyncio.create_task(self._reap(), name="warm-sandbox-reaper")
        return sandbox

    def _given_back(self, sandbox: WarmSandbox) -> None:
        if not self.closing and not sandbox.gone:
            self.idle.setdefault(sandbox.key, []).append(sandbox)

    def _gone(self, sandbox: WarmSandbox) -> None:
        self.all.discard(sandbox)
        waiting = self.idle.get(sandbox.key, [])
        if sandbox in waiting:
            waiting.remove(sandbox)

    async def _reap(self) -> None:
        """Tear down the sandboxes idle for ``idle_s``; ends when none is left."""
        while self.all:
            await asyncio.sleep(min(max(self.idle_s / 4, 0.05), 5.0))
            now, expired = time.monotonic(), []
            for key, waiting in list(self.idle.items()):
                expired += [s for s in waiting if now - s.idle_since >= self.idle_s]
                waiting[:] = [s for s in waiting if now - s.idle_since < self.idle_s]
                if not waiting:
                    del self.idle[key]
            for sandbox in expired:  # none of them can be taken any more
                self.all.discard(sandbox)
                await sandbox.close()


async def _reader(loop: asyncio.AbstractEventLoop, fd: int, limit: int,
                  transports: list[asyncio.BaseTransport]) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
                                                os.fdopen(fd, "rb", buffering=0))
    transports.append(transport)
    return reader


async def _writer(loop: asyncio.AbstractEventLoop, fd: int) -> asyncio.StreamWriter:
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), loop=loop),
        os.fdopen(fd, "wb", buffering=0))
    return asyncio.StreamWriter(transport, protocol, None, loop)
