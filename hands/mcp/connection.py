"""One MCP server as this worker sees it: started, handshaken, restarted when it dies, called.

A server that never answers its handshake is stopped after ``start_timeout_s``
and tried again with backoff, in the background: it never holds the worker's
start. Calls in flight when it dies get a recoverable error at once, not a
hang. A call cancelled (a timeout, ``tool:cancel``) sends the protocol's
``notifications/cancelled`` instead of killing the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from mcp import ClientSession, types

from bus.config import ConfigError
from bus.loops import Background
from bus.protocol import ErrorCode
from bus.release import VERSION
from hands.config import McpServerSettings
from hands.errors import ToolFailure
from hands.mcp.translate import TOOLS_LIMIT, protocol_failure, screen_tool_list
from hands.mcp.transport import http_streams, screened, start_stdio, stdio_streams
from hands.sandbox.runner import Sandbox
from hands.sandbox.running import Running

log = logging.getLogger("hands.mcp")

CLIENT = types.Implementation(name="pincer", version=VERSION)
ProgressNote = Callable[[str], Awaitable[Any]]


class McpConnection:
    def __init__(self, name: str, settings: McpServerSettings, *, sandbox: Sandbox, restart_max_s: float,
                 on_tools: Callable[[McpConnection], None]) -> None:
        self.name, self.settings, self.sandbox = name, settings, sandbox
        self.restart_max_s, self.on_tools = restart_max_s, on_tools
        self.state = "starting"  # starting | ready | restarting | failed | stopped
        self.error: str | None = None
        self.tools: list[types.Tool] = []
        self.screened_out: list[str] = []  # tools/list entries dropped before the SDK saw them, with why
        self.starts = 0
        self._session: ClientSession | None = None
        self._gone = asyncio.Event()
        self._refresh = asyncio.Event()
        self._slots = asyncio.Semaphore(settings.max_concurrency or 1_000_000)
        self._running: Running | None = None
        self._ended = asyncio.Event()  # the last stdio program is stopped and its exit known
        self._abandoned = Background()
        self._settled = asyncio.Event()  # ready, or failed for good: what a lazy first call waits for

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "tools": len(self.tools), "starts": self.starts,
                **({"error": self.error} if self.error else {}),
                "transport": "stdio" if self.settings.command else "http"}

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the server up until ``stop``: start, serve, and after a death wait (doubling) and start again."""
        failures = 0
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            began = loop.time()
            try:
                await self._serve_once(stop)
            except ConfigError as exc:  # ServerConfigError, a variable not set
                self.state, self.error = "failed", str(exc)
                self._settled.set()
                log.error("MCP server %s cannot start: %s", self.name, exc)
                return  # a config error does not fix itself: no restart loop
            except Exception as exc:
                self.error = self.error or _describe(exc)
            finally:
                self._session = None
                self._settled.clear()
            if stop.is_set():
                break
            failures = 1 if loop.time() - began > 60 else failures + 1  # a long good run resets the backoff
            delay = min(self.restart_max_s, 0.5 * 2 ** (failures - 1))
            self.state = "restarting"
            log.warning("MCP server %s stopped (%s); starting it again in %.1fs", self.name, self.error, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        self.state = "stopped"

    async def _serve_once(self, stop: asyncio.Event) -> None:
        self.state, self._gone = "starting", asyncio.Event()
        self.starts += 1
        self.screened_out = []
        async with self._streams() as (raw_read, write), \
                screened(raw_read, lambda m: screen_tool_list(m.message, self.screened_out.append)) as read, \
                ClientSession(read, write, message_handler=self._on_message, client_info=CLIENT) as session:
            try:
                async with asyncio.timeout(self.settings.start_timeout_s):
                    await session.initialize()
                    tools = await self._list_tools(session)
            except TimeoutError:
                self.error = f"no answer to its handshake within {self.settings.start_timeout_s:g}s"
                raise
            self._session, self.state, self.error = session, "ready", None
            self._set_tools(tools)
            self._settled.set()
            log.info("MCP server %s ready: %d tools", self.name, len(tools))
            while not stop.is_set() and not self._gone.is_set():
                waits = [asyncio.ensure_future(e.wait()) for e in (stop, self._gone, self._refresh)]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiting in waits:
                        waiting.cancel()
                if self._refresh.is_set() and not self._gone.is_set():
                    self._refresh.clear()
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(self.settings.start_timeout_s):
                            self._set_tools(await self._list_tools(session))
                        log.info("MCP server %s changed its tools: now %d", self.name, len(self.tools))
            self._session = None

    @contextlib.asynccontextmanager
    async def _streams(self) -> AsyncIterator[tuple[Any, Any]]:
        if self.settings.url is not None:
            async with http_streams(self.name, self.settings) as streams:
                yield streams
            return
        running = await start_stdio(self.name, self.settings, self.sandbox)
        self._running = running

        breach: list[str] = []
        ended = self._ended = asyncio.Event()

        def gone(reason: str | None) -> None:
            if reason:
                breach.append(reason)
            self._gone.set()

        try:
            async with stdio_streams(running, gone) as streams:
                yield streams
        finally:
            with contextlib.suppress(TimeoutError):  # its stdout ended: give it a moment to exit by itself
                await running.wait(1.0 if self._gone.is_set() else 0)
            await running.stop()
            if breach or self._gone.is_set() or not self.error:  # else our own reason to stop it stands
                self.error = breach[0] if breach else self._exit_note(running)
            self._running = None
            ended.set()

    async def wait_ready(self) -> None:
        """Until the server is ready or has failed for good, at most its start timeout."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled.wait(), self.settings.start_timeout_s)

    def _exit_note(self, running: Running) -> str:
        code = running.process.returncode
        stderr = running.err.text().strip().splitlines()[-3:]
        said = f"; it said: {' | '.join(stderr)[-500:]}" if stderr else ""
        return ("it closed its stdout" if code is None else f"it exited with status {code}") + said

    async def _list_tools(self, session: ClientSession) -> list[types.Tool]:
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor or len(tools) >= TOOLS_LIMIT:
                return tools[:TOOLS_LIMIT]

    def _set_tools(self, tools: list[types.Tool]) -> None:
        self.tools = tools
        self.on_tools(self)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._refresh.set()
        elif isinstance(message, Exception):
            log.warning("MCP server %s sent something that is not MCP: %s", self.name, message)

    async def call(self, tool: str, args: dict[str, Any], note: ProgressNote | None = None) -> types.CallToolResult:
        """Call one of the server's tools; the server dying meanwhile is a recoverable error at once."""
        session, gone = self._session, self._gone
        if session is None or gone.is_set():
            raise self._unavailable("is not running")

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            if note is not None:
                done = f"{progress:g}/{total:g}" if total else f"{progress:g}"
                await note(" ".join(p for p in (done, message) if p))

        async with self._slots:
            calling = asyncio.ensure_future(session.call_tool(tool, args, progress_callback=on_progress))
            watching = asyncio.ensure_future(gone.wait())
            try:
                await asyncio.wait({calling, watching}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                watching.cancel()
                if not calling.done():
                    calling.cancel()  # the SDK sends notifications/cancelled for it
                    self._abandoned.start(calling)
            if not calling.done():
                raise await self._stopped_during_call()
        try:
            return calling.result()
        except ToolFailure:
            raise
        except Exception as exc:
            if gone.is_set():
                raise await self._stopped_during_call() from None
            raise protocol_failure(self.name, exc) from None

    async def _stopped_during_call(self) -> ToolFailure:
        if self.settings.command is not None:  # say how it ended: wait (briefly) for its exit to be known
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), 3.0)
        return self._unavailable("stopped during the call")

    def _unavailable(self, what: str) -> ToolFailure:
        why = f" ({self.error})" if self.error else ""
        return ToolFailure(ErrorCode.SERVICE_UNAVAILABLE,
                           f"the MCP server {self.name} {what}{why}; it is started again automatically",
                           suggestions=["try the call again in a few seconds"], recoverable=True,
                           retryable=self.settings.idempotent)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
