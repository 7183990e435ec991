"""Every configured MCP server of one worker, and their tools kept in step with the registry."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from fnmatch import fnmatchcase
from typing import Any

from mcp import types

from hands.config import McpServerSettings, McpSettings
from hands.mcp.connection import McpConnection
from hands.mcp.translate import ToolRefused, description, parameters, result_data, tool_name
from hands.registry import Category, Handler, RetryPolicy, ToolContext, ToolDefinition, ToolRegistry
from hands.sandbox.runner import Sandbox

log = logging.getLogger("hands.mcp")

CATEGORIES = {category.key: category for category in Category}


class McpServers:
    def __init__(self, settings: McpSettings, registry: ToolRegistry, sandbox: Sandbox,
                 on_change: Callable[[], Awaitable[Any]] | None = None) -> None:
        self.registry, self.on_change = registry, on_change
        self.connections = {
            name: McpConnection(name, entry, sandbox=sandbox, restart_max_s=settings.restart_max_s,
                                on_tools=self._tools_changed)
            for name, entry in settings.servers.items() if entry.enabled
        }
        self.registered: dict[str, list[str]] = {name: [] for name in self.connections}  # our names, per server
        self.refused: dict[str, list[str]] = {name: [] for name in self.connections}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._notices: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        """Start every server in the background: a slow or broken one never holds the worker's start."""
        self._tasks = [asyncio.create_task(c.run(self._stop), name=f"mcp-{c.name}")
                       for c in self.connections.values()]

    async def close(self) -> None:
        self._stop.set()
        if self._tasks:
            _, stuck = await asyncio.wait(self._tasks, timeout=10)
            for task in stuck:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*stuck, return_exceptions=True)

    def status(self) -> dict[str, Any]:
        return {name: {**c.status(), **({"refused": self.refused[name]} if self.refused[name] else {})}
                for name, c in self.connections.items()}

    def _tools_changed(self, connection: McpConnection) -> None:
        server, entry = connection.name, connection.settings
        for name in self.registered[server]:
            self.registry.unregister(name)
        self.registered[server], self.refused[server] = [], list(connection.screened_out)
        for tool in connection.tools:
            if not any(fnmatchcase(tool.name, glob) for glob in entry.tools):
                continue
            try:
                definition = self._definition(connection, tool)
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
        if self.on_change is not None:
            notice = asyncio.ensure_future(self.on_change())
            self._notices.add(notice)
            notice.add_done_callback(self._notices.discard)

    def _definition(self, connection: McpConnection, tool: types.Tool) -> ToolDefinition:
        entry: McpServerSettings = connection.settings
        return ToolDefinition(
            name=tool_name(connection.name, tool.name), description=description(connection.name, tool),
            parameters=parameters(tool), handler=_handler(connection, tool.name),
            category=CATEGORIES[entry.category], timeout_s=entry.timeout_s, max_concurrency=entry.max_concurrency,
            idempotent=entry.idempotent, retry=None if entry.idempotent else RetryPolicy(retries=0),
            source=f"mcp:{connection.name}",
        )


def _handler(connection: McpConnection, tool: str) -> Handler:
    async def call_mcp_tool(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
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
