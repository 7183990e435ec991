"""Every configured MCP server of one worker, and their tools kept in step with the registry.

Most servers run in every worker. A ``lazy`` one starts at its first call
(its tools come from the last list any worker saw, kept in Redis). A
``stateful`` one runs in one worker of the pool, the holder of its lease;
the others list its tools too and hand its calls to that worker's stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from bus.loops import Background
from bus.protocol import ErrorCode
from bus.redis_client import RedisAway
from bus.scripts import lua
from bus.streams import Bus
from bus.text import text
from hands.config import McpServerSettings, McpSettings, RetryPolicy
from hands.errors import ToolFailure
from hands.registry import Category, Handler, ToolContext, ToolDefinition, ToolRegistry
from hands.sandbox.runner import Sandbox

if TYPE_CHECKING:  # only named here; imported where a configured server needs them (the MCP SDK is ~24 MB)
    from mcp import types

    from hands.mcp.connection import McpConnection

log = logging.getLogger("hands.mcp")

CATEGORIES = {category.key: category for category in Category}

# Take the lease if free, or renew it if ours; answer who holds it.
CLAIM = lua("hands.mcp.servers.claim", """
local holder = redis.call('GET', KEYS[1])
if not holder or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
return holder
""")


class McpServers:
    def __init__(self, settings: McpSettings, registry: ToolRegistry, sandbox: Sandbox, *, bus: Bus,
                 worker_id: str, on_change: Callable[[], Awaitable[Any]] | None = None) -> None:
        self.settings, self.registry, self.bus, self.worker_id = settings, registry, bus, worker_id
        self.on_change = on_change
        enabled = {name: entry for name, entry in settings.servers.items() if entry.enabled}
        if enabled:  # a worker with no server never imports the MCP SDK
            from hands.mcp.connection import McpConnection
        self.connections = {
            name: McpConnection(name, entry, sandbox=sandbox, restart_max_s=settings.restart_max_s,
                                on_tools=self._listed)
            for name, entry in enabled.items()
        }
        self.registered: dict[str, list[str]] = {name: [] for name in self.connections}  # our names, per server
        self.refused: dict[str, list[str]] = {name: [] for name in self.connections}
        self.owners: dict[str, str | None] = {}  # stateful server -> the worker holding its lease
        self._server_of: dict[str, str] = {}  # registered tool name -> server
        self._runs: dict[str, tuple[asyncio.Event, asyncio.Task[None]]] = {}
        self._stop = asyncio.Event()
        self._leases: asyncio.Task[None] | None = None
        self._notices = Background()
        self._claim = bus.redis.register_script(CLAIM)

    async def start(self) -> None:
        """Start the servers in the background: a slow or broken one never holds the worker's start."""
        for name, connection in self.connections.items():
            entry = connection.settings
            if entry.stateful:
                continue  # the lease loop decides where it runs
            if entry.lazy and await self._cached_tools(name):
                continue  # its tools are known: it starts at its first call
            self._run(connection)
        if any(c.settings.stateful for c in self.connections.values()):
            await self._renew_leases()
            self._leases = asyncio.create_task(self._lease_loop(), name="mcp-leases")

    async def close(self) -> None:
        self._stop.set()
        if self._leases is not None:
            self._leases.cancel()
            await asyncio.gather(self._leases, return_exceptions=True)
        for name in list(self._runs):
            await self._halt(name)
        with contextlib.suppress(RedisAway):  # let another worker take our stateful servers now
            for name, owner in self.owners.items():
                if owner == self.worker_id:
                    await self.bus.redis.delete(self.bus.keys.mcp_owner(name))

    def status(self) -> dict[str, Any]:
        found = {}
        for name, connection in self.connections.items():
            status = connection.status()
            if name not in self._runs:
                owner = self.owners.get(name)
                status["state"] = f"on {owner}" if owner else "not started"
            found[name] = {**status, **({"refused": self.refused[name]} if self.refused[name] else {})}
        return found

    def owner_elsewhere(self, tool: str) -> str | None:
        """The worker that runs the stateful server behind ``tool``, when it is another one."""
        server = self._server_of.get(tool)
        if server is None or not self.connections[server].settings.stateful:
            return None
        owner = self.owners.get(server)
        return owner if owner is not None and owner != self.worker_id else None

    # -- running servers ------------------------------------------------------------------------

    def _run(self, connection: McpConnection) -> None:
        if connection.name not in self._runs and not self._stop.is_set():
            stop = asyncio.Event()
            self._runs[connection.name] = (
                stop,
                asyncio.create_task(connection.run(stop), name=f"mcp-{connection.name}"),
            )

    async def _halt(self, name: str) -> None:
        stop, task = self._runs.pop(name)
        stop.set()
        _, stuck = await asyncio.wait([task], timeout=10)
        for late in stuck:
            late.cancel()
            await asyncio.gather(late, return_exceptions=True)

    async def _lease_loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.settings.lease_s / 3)
            if self._stop.is_set():
                return
            try:
                await self._renew_leases()
            except RedisAway as exc:
                log.warning("MCP leases not renewed: %s", exc)

    async def _renew_leases(self) -> None:
        for name, connection in self.connections.items():
            if not connection.settings.stateful:
                continue
            holder = await self._claim(keys=[self.bus.keys.mcp_owner(name)],
                                       args=[self.worker_id, int(self.settings.lease_s * 1000)])
            owner = text(holder)
            self.owners[name] = owner
            if owner == self.worker_id:
                self._run(connection)
            else:
                if name in self._runs:
                    log.warning("MCP server %s: worker %s holds its lease now; stopping our copy", name, owner)
                    await self._halt(name)
                await self._cached_tools(name)

    # -- tools ----------------------------------------------------------------------------------

    async def _cached_tools(self, server: str) -> bool:
        """Register the tools a server last listed anywhere (for one we do not run now)."""
        from mcp import types

        from hands.mcp.translate import tool_name

        raw = await self.bus.redis.get(self.bus.keys.mcp_tools(server))
        if not raw:
            return False
        try:
            tools = [types.Tool.model_validate(t, by_name=False) for t in json.loads(raw)]
        except ValueError:
            return False
        names = [tool_name(server, t.name) for t in tools]
        if sorted(names) != sorted(self.registered[server]):
            self._register(self.connections[server], tools, local=False)
        return True

    def _listed(self, connection: McpConnection) -> None:
        """A server we run listed its tools (started, or told us they changed)."""
        self._register(connection, connection.tools, local=True)
        entry = connection.settings
        if entry.stateful or entry.lazy:
            cache = json.dumps([t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in connection.tools])
            self._later(self.bus.redis.set(self.bus.keys.mcp_tools(connection.name), cache))

    def _register(self, connection: McpConnection, tools: list[types.Tool], *, local: bool) -> None:
        from hands.mcp.translate import ToolRefused

        server, entry = connection.name, connection.settings
        for name in self.registered[server]:
            self.registry.unregister(name)
            self._server_of.pop(name, None)
        self.registered[server], self.refused[server] = [], list(connection.screened_out)
        for tool in tools:
            if not any(fnmatchcase(tool.name, glob) for glob in entry.tools):
                continue
            try:
                definition = self._definition(connection, tool, local=local)
                if definition.name in self.registry:
                    raise ToolRefused(f"its name {definition.name} is taken by another tool (built-in, skill or "
                                      "another of this server's tools)")
                self.registry.register(definition)
            except (ToolRefused, ValueError) as exc:
                reason = f"{tool.name}: {exc}"
                self.refused[server].append(reason)
                log.warning("MCP server %s: tool refused: %s", server, reason)
                continue
            self.registered[server].append(definition.name)
            self._server_of[definition.name] = server
        if self.on_change is not None:
            self._later(self.on_change())

    def _later(self, work: Awaitable[Any]) -> None:
        self._notices.start(work)

    def _definition(self, connection: McpConnection, tool: types.Tool, *, local: bool) -> ToolDefinition:
        from hands.mcp.translate import description, parameters, tool_name

        entry: McpServerSettings = connection.settings
        if entry.stateful and not local:
            handler = self._elsewhere(connection.name)  # reached only when no live worker holds the lease
        else:
            handler = _handler(connection, tool.name, start=self._start_lazily if entry.lazy else None)
        return ToolDefinition(
            name=tool_name(connection.name, tool.name), description=description(connection.name, tool),
            parameters=parameters(tool), handler=handler,
            category=CATEGORIES[entry.category], timeout_s=entry.timeout_s, max_concurrency=entry.max_concurrency,
            idempotent=entry.idempotent, retry=None if entry.idempotent else RetryPolicy(retries=0),
            source=f"mcp:{connection.name}",
        )

    def _elsewhere(self, server: str) -> Handler:
        async def no_owner(_args: dict[str, Any], _ctx: ToolContext) -> None:
            raise ToolFailure(ErrorCode.SERVICE_UNAVAILABLE,
                              f"the stateful MCP server {server} runs in one worker of the pool, and no live worker "
                              "holds it now; another takes it over within hands.mcp.lease_s",
                              suggestions=["try the call again in a few seconds"], recoverable=True, retryable=False)
        return no_owner

    async def _start_lazily(self, connection: McpConnection) -> None:
        self._run(connection)
        await connection.wait_ready()


def _handler(connection: McpConnection, tool: str,
             start: Callable[[McpConnection], Awaitable[None]] | None = None) -> Handler:
    from hands.mcp.translate import result_data

    async def call_mcp_tool(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        if start is not None and connection.state != "ready":
            await start(connection)
        result = await connection.call(tool, args, ctx.progress)
        return result_data(connection.name, result)

    return call_mcp_tool


def configured_tool(settings: McpSettings, name: str) -> ToolDefinition | None:
    """What the policy knows of ``mcp_<server>_<tool>`` without starting the server (its name and the
    server's category): enough for ``pincer policy explain``."""
    for server, entry in settings.servers.items():
        if name.startswith(f"mcp_{server}_") and entry.enabled:
            return ToolDefinition(name=name, description=f"a tool of MCP server {server}",
                                  parameters={"type": "object"}, handler=lambda _args, _ctx: None,
                                  category=CATEGORIES[entry.category], source=f"mcp:{server}")
    return None
