"""``pincer mcp serve``: the official ``mcp`` client library lists and calls the pool's tools over stdio."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from bus.presence import alive
from bus.streams import Bus
from tests.conftest import ROOT, Processes, async_wait_until, identity_tree, processes_matching

pytestmark = pytest.mark.e2e


def server(env: dict[str, str], *args: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "gateway", "mcp", "serve", "--stdio", *args],
                                 env=env, cwd=str(ROOT))


async def test_an_mcp_client_lists_calls_and_cancels_pool_tools(bus: Bus, processes: Processes,
                                                                pincer_env: dict[str, str], tmp_path: Path) -> None:
    workspace = Path(tempfile.mkdtemp(prefix="pincer-e2e-mcp-"))  # one the sandbox uid may enter
    workspace.chmod(0o755)
    (workspace / "notes.txt").write_text("served over MCP\n")
    served = identity_tree(workspace, "mcp")  # `pincer mcp serve`'s default sender is no owner: its own tree
    served.mkdir(parents=True)
    (served / "notes.txt").write_text("served over MCP\n")
    processes.env = {**pincer_env, "PINCER_WORKSPACE": str(workspace), "PINCER_HANDS__PROGRESS_INTERVAL_S": "0.2",
                     "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true",
                     "PINCER_HANDS__TOOLS__AGENTS": "{narrow: {profile: minimal}}"}
    processes.start("hands", name="hands")
    try:
        await _exercise(bus, processes)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
        shutil.rmtree(identity_tree(workspace, ""), ignore_errors=True)


async def _exercise(bus: Bus, processes: Processes) -> None:
    await async_wait_until(lambda: alive(bus, "hands"), timeout=60, what="a Hands worker")

    async with stdio_client(server(processes.env)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = await session.list_tools()
        names = sorted(tool.name for tool in listed.tools)
        assert "read_file" in names and "exec" in names
        schema = next(t for t in listed.tools if t.name == "read_file").input_schema
        assert schema["properties"]["path"]["type"] == "string"

        read = await session.call_tool("read_file", {"path": "notes.txt"})
        assert not read.is_error and "served over MCP" in read.content[0].text
        assert read.structured_content["content"] == "served over MCP\n"

        missing = await session.call_tool("read_file", {"path": "nope.txt"})
        assert missing.is_error and json.loads(missing.content[0].text)["error"] == "FILE_NOT_FOUND"
        bad = await session.call_tool("read_file", {"path": 5})
        assert bad.is_error and json.loads(bad.content[0].text)["error"] == "INVALID_ARGUMENTS"

        seen: list[str] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append(message or "")

        slow = await session.call_tool("exec", {"command": "sleep 1; echo done"}, progress_callback=on_progress)
        assert not slow.is_error and "done" in slow.content[0].text
        assert seen and "exec" in seen[0]  # the pool's tool:progress reached the client as MCP progress

        async with anyio.create_task_group() as group:  # a client that gives up on a call stops it
            group.start_soon(session.call_tool, "exec", {"command": "sleep 66.75", "timeout": 120})
            await async_wait_until(lambda: processes_matching("sleep 66.75"), timeout=30, what="the command")
            group.cancel_scope.cancel()
        await async_wait_until(lambda: not processes_matching("sleep 66.75"), timeout=30,
                               what="the cancelled command to be killed")

    # Another agent's policy: only what it may use is listed.
    async with stdio_client(server(processes.env, "--agent", "narrow")) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        narrow = sorted(tool.name for tool in (await session.list_tools()).tools)
        assert "exec" not in narrow and "memory_read" in narrow


async def test_over_http_a_token_is_needed_and_names_the_sender(bus: Bus, processes: Processes,
                                                               pincer_env: dict[str, str]) -> None:
    import httpx
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    from bus.redis_server import free_port

    workspace = Path(tempfile.mkdtemp(prefix="pincer-e2e-mcp-"))
    workspace.chmod(0o755)
    (workspace / "notes.txt").write_text("served over HTTP\n")
    bobs = identity_tree(workspace, "bob")  # bob is no owner: his calls see his own tree
    bobs.mkdir(parents=True)
    (bobs / "notes.txt").write_text("served over HTTP\n")
    port = free_port()
    processes.env = {**pincer_env, "PINCER_WORKSPACE": str(workspace),
                     "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true",
                     "PINCER_HANDS__TOOLS__OWNER_ONLY": "[exec]", "PINCER_HANDS__TOOLS__OWNERS": "[alice]",
                     "PINCER_GATEWAY__LIMITS__BURST": "4", "PINCER_GATEWAY__LIMITS__MESSAGES_PER_MINUTE": "4"}
    tokens = {}
    for name, extra in (("alice", []), ("bob", []), ("carol", ["--agent", "other"])):
        made = processes.run("token", "create", name, *extra)
        assert made.returncode == 0, made.stderr
        tokens[name] = made.stdout.strip()
    processes.start("hands", name="hands")
    processes.start("mcp", "serve", "--http", str(port), name="mcp-http")
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        await async_wait_until(lambda: alive(bus, "hands"), timeout=60, what="a Hands worker")
        await async_wait_until(lambda: "streamable HTTP" in (processes.tmp_path / "mcp-http.log").read_text(),
                               timeout=60, what="the MCP HTTP server listening")
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                            "clientInfo": {"name": "t", "version": "1"}}}
        accept = {"Accept": "application/json, text/event-stream"}
        async with httpx.AsyncClient(timeout=10) as raw:
            assert (await raw.post(url, json=hello, headers=accept)).status_code == 401
            wrong = await raw.post(url, json=hello, headers={**accept, "Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            rebound = await raw.post(url, json=hello, headers={**accept, "Host": "evil.example:80",
                                                                "Authorization": f"Bearer {tokens['alice']}"})
            assert rebound.status_code == 403 and "host" in rebound.text.lower()
            foreign = await raw.post(url, json=hello, headers={**accept, "Origin": "https://evil.example",
                                                                "Authorization": f"Bearer {tokens['alice']}"})
            assert foreign.status_code == 403

        async def session_of(name: str):
            client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {tokens[name]}"}, timeout=30)
            return client, streamable_http_client(url, http_client=client)

        for name in ("alice", "bob", "carol"):
            client, transport = await session_of(name)
            async with client, transport as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                if name == "carol":  # her token is for agent `other` only
                    refused = await session.call_tool("read_file", {"path": "notes.txt"})
                    assert refused.is_error and json.loads(refused.content[0].text)["error"] == "FORBIDDEN"
                    continue
                names = {tool.name for tool in (await session.list_tools()).tools}
                assert ("exec" in names) is (name == "alice")  # owner_only: the token's name is the sender
                read = await session.call_tool("read_file", {"path": "notes.txt"})
                assert not read.is_error and "served over HTTP" in read.content[0].text

        # Each token has a session of its own: alice's background process is not bob's to list.
        client, transport = await session_of("alice")
        async with client, transport as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            started = await session.call_tool("exec", {"command": "sleep 30", "background": True})
            assert not started.is_error, started.content[0].text
            process_id = json.loads(started.content[0].text)["process_id"]
            mine = await session.call_tool("process", {"action": "list"})
            assert process_id in mine.content[0].text
        client, transport = await session_of("bob")
        async with client, transport as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            theirs = await session.call_tool("process", {"action": "list"})
            assert not theirs.is_error and process_id not in theirs.content[0].text
            # ... and its own limits: 4 calls a minute in a burst of 4 (one read, one list so far)
            outcomes = [json.loads(r.content[0].text).get("error") if r.is_error else "ok"
                        for r in [await session.call_tool("read_file", {"path": "notes.txt"}) for _ in range(3)]]
            assert outcomes == ["ok", "ok", "RATE_LIMITED"], outcomes
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
        shutil.rmtree(identity_tree(workspace, ""), ignore_errors=True)
