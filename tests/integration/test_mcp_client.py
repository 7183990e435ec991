"""MCP servers' tools in the Hands pool: real servers in the sandbox, and one that misbehaves on purpose."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bus.protocol import ErrorCode, ToolCancel
from tests.conftest import async_wait_until

RAW = Path(__file__).parent.parent / "mcp_servers" / "raw_server.py"


@pytest.fixture
def raw_dir() -> Iterator[Path]:
    """The raw server's script where the sandbox uid can read it (pytest's temp dirs are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="pincer-mcp-raw-"))
    path.chmod(0o755)
    shutil.copy(RAW, path / "raw_server.py")
    (path / "raw_server.py").chmod(0o644)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def raw(raw_dir: Path, mode: str = "normal", **entry) -> dict:
    return {"command": "/usr/bin/python3", "args": ["-u", str(raw_dir / "raw_server.py"), mode],
            "read_only": [str(raw_dir)], "start_timeout_s": 5, **entry}


async def ready(worker, server: str, *, starts: int = 1) -> None:
    def up() -> bool:
        status = worker.mcp.status()[server]
        return status["state"] == "ready" and status["starts"] >= starts
    await async_wait_until(up, timeout=30, what=f"MCP server {server} ready (start {starts})")


@pytest.fixture
async def raw_worker(engine, ws: Path, raw_dir: Path):
    worker = await engine(workspace=ws, mcp={"servers": {"raw": raw(raw_dir)}, "restart_max_s": 1},
                          sandbox={"allow_degraded": True})
    await ready(worker, "raw")
    return worker


async def test_a_servers_tools_join_the_registry_and_run_in_the_sandbox(raw_worker, call, bus) -> None:
    names = raw_worker.registry.names()
    assert {"mcp_raw_echo", "mcp_raw_a_b", "mcp_raw_peek"} <= set(names)
    echo = await call("mcp_raw_echo", {"text": "hello"})
    assert echo.success and echo.data["text"] == "echo: hello"
    bad = await call("mcp_raw_echo", {"words": 1})
    assert bad.error.code is ErrorCode.INVALID_ARGUMENTS  # the server's schema, checked before it is called
    peek = await call("mcp_raw_peek")
    lines = dict(line.split(": ", 1) for line in peek.data["text"].splitlines())
    assert lines["/etc/shadow"].startswith("refused") and lines["/root"].startswith("refused")
    assert lines["network"].startswith("refused") and lines["uid"] == "65534"
    digest = await bus.redis.get(bus.keys.tools_digest)
    assert digest.decode() == raw_worker.registry.digest()  # Brains learn of the new tools


async def test_what_a_server_cannot_offer_is_refused_with_a_reason(raw_worker) -> None:
    refused = "\n".join(raw_worker.mcp.status()["raw"]["refused"])
    assert "bad_schema: its inputSchema is not valid JSON Schema" in refused
    assert "not_an_object: its inputSchema has type 'string'" in refused
    assert "a_b: its name mcp_raw_a_b is taken" in refused  # a.b came first and sanitised to the same name
    assert "mcp_raw_bad_schema" not in raw_worker.registry.names()


async def test_results_are_shaped_and_errors_are_failures(raw_worker, call) -> None:
    failed = await call("mcp_raw_fail")
    assert failed.error.code is ErrorCode.TOOL_ERROR and "the disk is on fire" in failed.error.message
    assert failed.error.recoverable
    image = await call("mcp_raw_image")
    kinds = [(a["type"], a.get("mime_type")) for a in image.data["attachments"]]
    assert kinds == [("image", "image/png"), ("resource", "text/plain")]
    assert image.data["attachments"][0]["bytes"] == 8 and image.data["structured"] == {"width": 1}
    huge = await call("mcp_raw_huge", {"mb": 3})
    assert huge.success and huge.metadata.truncated and len(huge.data["text"]) < 60_000


async def test_a_message_over_the_cap_stops_the_server_which_comes_back(raw_worker, call) -> None:
    flood = await call("mcp_raw_huge", {"mb": 17})
    assert flood.error.code is ErrorCode.SERVICE_UNAVAILABLE and "over 16,777,216 bytes" in flood.error.message
    await ready(raw_worker, "raw", starts=2)
    assert (await call("mcp_raw_echo", {"text": "back"})).data["text"] == "echo: back"


async def test_a_server_killed_mid_call_is_an_error_then_it_works_again(raw_worker, call) -> None:
    died = await call("mcp_raw_die")
    assert died.error.code is ErrorCode.SERVICE_UNAVAILABLE and died.error.recoverable
    assert "exited with status 3" in died.error.message
    await ready(raw_worker, "raw", starts=2)
    assert (await call("mcp_raw_echo", {"text": "again"})).data["text"] == "echo: again"


async def test_a_cancelled_call_tells_the_server(raw_worker, call, bus) -> None:
    events: list = []
    slow = asyncio.create_task(call("mcp_raw_slow", events=events))
    await async_wait_until(lambda: any(getattr(e, "message", "") == "1/300 working" for e in events), timeout=20,
                           what="the slow call's progress")
    call_id = events[0].call_id
    await bus.publish(bus.keys.hands_control, ToolCancel(call_id=call_id, reason="the person pressed stop"))
    result = await slow
    assert result.error.code is ErrorCode.CANCELLED
    told = await call("mcp_raw_cancelled")
    assert told.data["text"] != "[]"  # the server received notifications/cancelled, and is still up
    assert raw_worker.mcp.status()["raw"]["starts"] == 1


async def test_a_list_change_is_picked_up(raw_worker, call) -> None:
    assert (await call("mcp_raw_grow")).success
    await async_wait_until(lambda: "mcp_raw_grown_0" in raw_worker.registry.names(), timeout=10,
                           what="the new tool registered")
    assert (await call("mcp_raw_grown_0")).data["text"] == "grown_0: done"


async def test_a_server_that_never_answers_does_not_hold_the_worker(engine, call, ws: Path, raw_dir: Path) -> None:
    worker = await engine(workspace=ws, mcp={"servers": {"mute": raw(raw_dir, "hang", start_timeout_s=1),
                                                         "raw": raw(raw_dir)}, "restart_max_s": 1},
                          sandbox={"allow_degraded": True})
    (ws / "a.txt").write_text("alpha")
    assert (await call("read_file", {"path": "a.txt"})).success  # the worker serves meanwhile
    await ready(worker, "raw")
    await async_wait_until(lambda: worker.mcp.status()["mute"]["starts"] >= 2, timeout=20,
                           what="the mute server tried again")
    assert "no answer to its handshake within 1s" in worker.mcp.status()["mute"]["error"]
    assert not any(name.startswith("mcp_mute_") for name in worker.registry.names())


async def test_a_secret_comes_from_the_environment_not_the_config(engine, ws, raw_dir, monkeypatch) -> None:
    monkeypatch.delenv("PINCER_TEST_MISSING", raising=False)
    worker = await engine(workspace=ws, mcp={"servers": {"raw": raw(raw_dir, env={"KEY": "${PINCER_TEST_MISSING}"})}},
                          sandbox={"allow_degraded": True})
    await async_wait_until(lambda: worker.mcp.status()["raw"]["state"] == "failed", timeout=10,
                           what="the server refused")
    assert "export PINCER_TEST_MISSING" in worker.mcp.status()["raw"]["error"]


async def test_a_stateful_server_runs_once_and_its_calls_find_it(engine, call, ws: Path, raw_dir: Path) -> None:
    config = {"workspace": ws, "mcp": {"servers": {"st": raw(raw_dir, stateful=True)}, "lease_s": 1},
              "sandbox": {"allow_degraded": True}}
    first, second = await engine(**config), await engine(**config)

    def one_runs_it() -> bool:
        states = sorted(w.mcp.status()["st"]["state"] for w in (first, second))
        return states in (["on w0", "ready"], ["on w1", "ready"])
    await async_wait_until(one_runs_it, timeout=30, what="one worker running the stateful server, one knowing where")
    await async_wait_until(lambda: all("mcp_st_count" in w.registry.names() for w in (first, second)), timeout=10,
                           what="both workers listing its tools")
    counts = [(await call("mcp_st_count")).data["text"] for _ in range(8)]
    assert counts == [str(n) for n in range(1, 9)]  # one process kept count, whichever worker read the call
    owner, other = (first, second) if first.mcp.status()["st"]["state"] == "ready" else (second, first)
    await engine.stop(owner)
    await async_wait_until(lambda: other.mcp.status()["st"]["state"] == "ready", timeout=30,
                           what="the other worker taking the server over")
    assert (await call("mcp_st_count")).data["text"] == "1"  # a new copy: its state starts again


async def test_a_lazy_server_starts_at_its_first_call(engine, call, bus, ws: Path, raw_dir: Path) -> None:
    config = {"workspace": ws, "mcp": {"servers": {"lz": raw(raw_dir, lazy=True)}}, "sandbox": {"allow_degraded": True}}
    await bus.redis.delete(bus.keys.mcp_tools("lz"))
    learner = await engine(**config)  # no list cached anywhere yet: it starts to learn the tools
    await ready(learner, "lz")
    await async_wait_until(lambda: bus.redis.get(bus.keys.mcp_tools("lz")), timeout=10,
                           what="the server's tool list cached for other workers")
    await engine.stop(learner)
    lazy = await engine(**config)
    await async_wait_until(lambda: "mcp_lz_echo" in lazy.registry.names(), timeout=10,
                           what="the lazy server's tools, from the cached list")
    assert lazy.mcp.status()["lz"]["state"] == "not started"
    echo = await call("mcp_lz_echo", {"text": "woken"})
    assert echo.data["text"] == "echo: woken" and lazy.mcp.status()["lz"]["state"] == "ready"


@pytest.mark.parametrize(("mount", "said"), [("rw", "wrote in /workspace"), ("ro", "refused 30 in /workspace"),
                                             ("none", "refused 2 in /tmp")])
async def test_the_workspace_is_mounted_as_the_entry_says(engine, call, ws: Path, raw_dir: Path, mount: str,
                                                          said: str) -> None:
    worker = await engine(workspace=ws, mcp={"servers": {"w": raw(raw_dir, workspace=mount)}},
                          sandbox={"tier": "bwrap"})
    await ready(worker, "w")
    touched = await call("mcp_w_touch")
    assert touched.data["text"] == said
    assert (ws / "mcp-touched.txt").exists() is (mount == "rw")
