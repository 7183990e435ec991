"""Real MCP servers from npm and PyPI behind real Hands, Brain and Gateway processes, through chat turns."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bus.redis_server import free_port
from tests.conftest import Processes, wait_until
from tests.e2e.conftest import send, start_stack
from tests.mcp_servers.installed import everything_server, time_server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def everything_http() -> Iterator[str]:
    """The Node reference server over streamable HTTP, on its own (an HTTP server is not Pincer's to start)."""
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="pincer-mcp-http-")[1])
    with log.open("wb") as out:
        server = subprocess.Popen(["node", str(everything_server()), "streamableHttp"], stdout=out,
                                  stderr=subprocess.STDOUT, env={"PATH": "/usr/bin:/bin", "PORT": str(port)})
    try:
        wait_until(lambda: "listening on port" in log.read_text(), timeout=60, what="the HTTP MCP server listening")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.kill()
        server.wait()
        log.unlink()


def test_real_servers_tools_are_called_through_chat_turns(processes: Processes, pincer_env: dict[str, str],
                                                         everything_http: str, ws: Path,
                                                         tmp_path: Path) -> None:
    venv = time_server()
    entry = everything_server()
    servers = {
        "time": {"command": str(venv / "bin" / "python"), "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
                 "read_only": [str(venv)]},
        "everything": {"command": shutil.which("node"), "args": [str(entry), "stdio"],
                       "read_only": [str(entry.parents[3])], "tools": ["echo", "get-sum", "get-tiny-image"]},
        "remote": {"url": everything_http, "tools": ["echo"]},
    }
    processes.env.update({"PINCER_HANDS__MCP__SERVERS": json.dumps(servers), "PINCER_WORKSPACE": str(ws),
                          "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true"})
    start_stack(processes, hands=1)
    log = tmp_path / "hands-0.log"
    for name in servers:
        wait_until(lambda name=name: f"MCP server {name} ready" in log.read_text(), timeout=90,
                   what=f"MCP server {name} ready in the Hands log")

    clock = send(processes.env, 'CALL mcp_time_get_current_time {"timezone": "Asia/Tokyo"}', session="mcp-1")
    assert clock.status_code == 200, clock.text
    assert "Asia/Tokyo" in clock.json()["text"] and "+09:00" in clock.json()["text"]

    total = send(processes.env, 'CALL mcp_everything_get-sum {"a": 2, "b": 40}', session="mcp-2").json()
    assert total["tool_calls"][0]["tool"] == "mcp_everything_get-sum" and "42" in total["text"]

    image = send(processes.env, "CALL mcp_everything_get-tiny-image {}", session="mcp-3").json()
    assert "image/png" in image["text"] and "cannot see yet" in image["text"]

    remote = send(processes.env, 'CALL mcp_remote_echo {"message": "over http"}', session="mcp-4").json()
    assert "over http" in remote["text"]

    # Only the allowed tools of a server were offered to the model.
    listing = subprocess.run([sys.executable, "-m", "gateway", "tools"], env=processes.env, capture_output=True,
                             text=True, timeout=60)
    offered = {word for word in listing.stdout.split() if word.startswith("mcp_")}
    assert {"mcp_everything_echo", "mcp_everything_get-sum", "mcp_remote_echo"} <= offered
    assert "mcp_everything_trigger-long-running-operation" not in offered and "mcp_remote_get-sum" not in offered

    status = subprocess.run([sys.executable, "-m", "gateway", "status", "--json"], env=processes.env,
                            capture_output=True, text=True, timeout=60)
    worker = json.loads(status.stdout)["instances"]["hands"][0]
    assert {name: s["state"] for name, s in worker["mcp"].items()} == dict.fromkeys(servers, "ready")
    assert worker["mcp"]["everything"]["transport"] == "stdio" and worker["mcp"]["remote"]["transport"] == "http"
    shown = subprocess.run([sys.executable, "-m", "gateway", "status"], env=processes.env, capture_output=True,
                           text=True, timeout=60)
    assert "MCP servers" in shown.stdout and "everything" in shown.stdout
