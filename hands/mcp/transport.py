"""The two ways to reach an MCP server: stdio of a program in the sandbox, or streamable HTTP.

The SDK's own stdio client spawns the program itself, outside any sandbox;
this one speaks the same newline-delimited JSON-RPC over the pipes of a
command the sandbox started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2  # the HTTP client the mcp SDK's transport takes (its own dependency)
from mcp import types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

from bus.config import ConfigError, from_environment
from hands.config import McpServerSettings
from hands.sandbox.env import sandbox_env
from hands.sandbox.runner import Extras, Sandbox
from hands.sandbox.running import Running

log = logging.getLogger("hands.mcp")

MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # one JSON-RPC line; past it the server is stopped


class ServerConfigError(ConfigError, ValueError):
    """An entry that cannot start as written (a missing variable, an unusable command); says how to fix it."""


def expand(server: str, where: str, values: dict[str, str]) -> dict[str, str]:
    """``${NAME}`` references to the worker's environment, resolved; a missing one is a ``ConfigError``."""
    return {key: from_environment(value, key=f"hands.mcp.servers.{server}.{where}.{key}",
                                  process="the Hands worker") for key, value in values.items()}


def command_dirs(settings: McpServerSettings) -> tuple[Path, ...]:
    """Directories the server's program needs read: its entry's ``read_only`` and the command's own."""
    dirs = [Path(p).expanduser().resolve() for p in settings.read_only]
    assert settings.command is not None
    found = shutil.which(settings.command)
    if found and not found.startswith(("/usr/", "/bin/", "/sbin/")):  # /usr is always there
        dirs.append(Path(found).resolve().parent)
    return tuple(dict.fromkeys(d for d in dirs if d.exists()))


async def start_stdio(name: str, settings: McpServerSettings, sandbox: Sandbox) -> Running:
    assert settings.command is not None
    env = sandbox_env(None) | expand(name, "env", settings.env)
    limits = sandbox.settings.model_copy(update={"memory_mb": settings.memory_mb, "cpu_s": settings.cpu_s})
    extra = Extras(read_only=command_dirs(settings), network=settings.network, limits=limits,
                   workspace=settings.workspace,
                   line_bytes=MAX_MESSAGE_BYTES)
    workdir = ""
    if settings.cwd:
        workdir = settings.cwd.removeprefix("/workspace").lstrip("/")
        if workdir.startswith("..") or (Path(settings.cwd).is_absolute() and not settings.cwd.startswith("/workspace")):
            raise ServerConfigError(f"hands.mcp.servers.{name}.cwd {settings.cwd!r}: a server's working directory "
                                    "is in the workspace (/workspace/...)")
    command = shutil.which(settings.command) or settings.command
    return await sandbox.start([command, *settings.args], workdir=workdir, env=env, extra=extra,
                               capture_stdout=False, session=f"mcp-server:{name}")


@contextlib.asynccontextmanager
async def stdio_streams(running: Running, gone: Callable[[str | None], None]) -> AsyncIterator[tuple[object, object]]:
    """SDK streams over a started program's stdin and stdout; ``gone`` is called once its stdout
    ends (it exited: None) or it broke the protocol (the reason), after which nothing more is read."""
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    stdout = running.process.stdout
    assert stdout is not None

    async def read() -> None:
        reason: str | None = None
        try:
            async with to_session:
                while True:
                    try:
                        line = await stdout.readline()
                    except ValueError:  # a line over the reader's limit
                        reason = f"it sent a message over {MAX_MESSAGE_BYTES:,} bytes"
                        break
                    if not line:
                        break
                    if not line.strip():
                        continue
                    try:
                        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    except ValueError as exc:
                        await to_session.send(exc)
                        continue
                    await to_session.send(SessionMessage(message))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return  # our own side closed: not the program's doing
        gone(reason)  # its stdout ended, or it broke the size rule (a cancellation skips this: we stopped it)

    async def write() -> None:
        try:
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await running.write(data.encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, BrokenPipeError, ConnectionError):
            gone("its stdin closed")

    tasks = [asyncio.create_task(read()), asyncio.create_task(write())]
    try:
        yield read_stream, write_stream
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in (read_stream, write_stream, to_session, from_session):
            await stream.aclose()


@contextlib.asynccontextmanager
async def http_streams(name: str, settings: McpServerSettings) -> AsyncIterator[tuple[object, object]]:
    assert settings.url is not None
    headers = expand(name, "headers", settings.headers)
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as client, \
            streamable_http_client(settings.url, http_client=client) as (read_stream, write_stream):
        yield read_stream, write_stream


@contextlib.asynccontextmanager
async def screened(read_stream: Any, screen: Callable[[SessionMessage], None]) -> AsyncIterator[Any]:
    """The read stream with ``screen`` applied to every message first (it may edit one in place)."""
    to_session, out = anyio.create_memory_object_stream[SessionMessage | Exception](0)

    async def forward() -> None:
        async with to_session:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                async for item in read_stream:
                    if isinstance(item, SessionMessage):
                        screen(item)
                    await to_session.send(item)

    task = asyncio.create_task(forward())
    try:
        yield out
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await out.aclose()
