"""Hands in-process: file tools inside the workspace, validation, shaping, error mapping."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from bus.protocol import ErrorCode, ToolExecute, now_ms
from hands.config import HandsSettings, RetryPolicy
from hands.executor import Executor
from hands.registry import Category, ToolDefinition
from hands.shaping import shape, size_of
from hands.worker import build_registry


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "hello.txt").write_text("line one\nline two\nline three\n")
    (ws / "sub").mkdir()
    (ws / "sub" / "deep.txt").write_text("deep")
    (tmp_path / "secret.txt").write_text("TOP SECRET")
    return ws


@pytest.fixture
def executor(workspace: Path) -> Executor:
    settings = HandsSettings(workspace=workspace, max_result_bytes=2_000, max_file_bytes=100_000)
    return Executor(build_registry(), settings, worker_id="w-test")


async def call(executor: Executor, tool: str, **args):
    return await executor.execute(ToolExecute(tool=tool, args=args, session_id="s", reply_to="r",
                                              deadline=now_ms() + 10_000))


async def test_read_file_returns_content_and_metadata(executor: Executor) -> None:
    result = await call(executor, "read_file", path="hello.txt")
    assert result.success, result.error
    assert result.data["content"] == "line one\nline two\nline three\n"
    assert result.data["total_lines"] == 3
    assert result.metadata.worker_id == "w-test" and result.metadata.tool_name == "read_file"
    assert not result.metadata.truncated


async def test_read_file_lines_window(executor: Executor) -> None:
    result = await call(executor, "read_file", path="hello.txt", offset=2, limit=1)
    assert result.data["content"] == "line two\n" and result.data["lines"] == [2, 2]


async def test_write_then_read_and_list(executor: Executor, workspace: Path) -> None:
    written = await call(executor, "write_file", path="new/dir/note.md", content="hé")
    assert written.success and written.data["bytes_written"] == 3
    assert (workspace / "new/dir/note.md").read_text() == "hé"
    appended = await call(executor, "write_file", path="new/dir/note.md", content="!", append=True)
    assert appended.success and (workspace / "new/dir/note.md").read_text() == "hé!"
    listing = await call(executor, "list_directory")
    names = [(e["name"], e["type"]) for e in listing.data["entries"]]
    assert names == [("new", "directory"), ("sub", "directory"), ("hello.txt", "file")]


@pytest.mark.parametrize("path", ["../secret.txt", "sub/../../secret.txt", "/etc/passwd", "/etc/../etc/shadow"])
async def test_paths_outside_the_workspace_are_refused(executor: Executor, path: str) -> None:
    result = await call(executor, "read_file", path=path)
    assert result.error.code is ErrorCode.PERMISSION_DENIED
    assert "outside the workspace" in result.error.message
    assert result.error.suggestions


async def test_absolute_path_inside_the_workspace_is_fine(executor: Executor, workspace: Path) -> None:
    result = await call(executor, "read_file", path=str(workspace / "sub" / "deep.txt"))
    assert result.success and result.data["content"] == "deep"


async def test_symlinks_are_not_followed_anywhere_in_the_path(
    executor: Executor, workspace: Path, tmp_path: Path
) -> None:
    os.symlink(tmp_path / "secret.txt", workspace / "link.txt")
    os.symlink(tmp_path, workspace / "escape")
    for path in ("link.txt", "escape/secret.txt"):
        result = await call(executor, "read_file", path=path)
        assert result.error.code is ErrorCode.PERMISSION_DENIED, path
        assert "symbolic link" in result.error.message
    written = await call(executor, "write_file", path="link.txt", content="pwned")
    assert written.error.code is ErrorCode.PERMISSION_DENIED
    assert (tmp_path / "secret.txt").read_text() == "TOP SECRET"


async def test_hard_links_are_refused_before_anything_changes(executor: Executor, workspace: Path,
                                                              tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.chmod(0o600)
    os.link(secret, workspace / "hard.txt")
    before = secret.stat()
    result = await call(executor, "read_file", path="hard.txt")
    assert result.error.code is ErrorCode.PERMISSION_DENIED and "hard link" in result.error.message
    for args in ({}, {"append": True}):  # truncating or appending: refused before the file is touched
        written = await call(executor, "write_file", path="hard.txt", content="pwned", **args)
        assert written.error.code is ErrorCode.PERMISSION_DENIED and "hard link" in written.error.message
        after = secret.stat()
        assert secret.read_text() == "TOP SECRET" and after.st_size == before.st_size
        assert (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid, before.st_mode)


async def test_a_root_worker_refusing_a_hard_link_gives_nothing_away(workspace: Path, tmp_path: Path) -> None:
    # As root, files the tools create go to the sandbox uid: a refused existing file must keep its owner.
    settings = HandsSettings(workspace=workspace, max_file_bytes=100_000)
    executor = Executor(build_registry(), settings, worker_id="w-test")
    executor.workspace.owner = (65534, 65534)
    secret = tmp_path / "secret.txt"
    os.link(secret, workspace / "linked.txt")
    owner = (secret.stat().st_uid, secret.stat().st_gid)
    refused = await call(executor, "write_file", path="linked.txt", content="x")
    assert refused.error.code is ErrorCode.PERMISSION_DENIED
    assert (secret.stat().st_uid, secret.stat().st_gid) == owner and secret.read_text() == "TOP SECRET"
    if os.geteuid() == 0:  # a file the call itself made is given to the sandbox uid
        made = await call(executor, "write_file", path="fresh.txt", content="x")
        assert made.success and (workspace / "fresh.txt").stat().st_uid == 65534


@pytest.mark.parametrize("tool", ["read_file", "write_file"])
async def test_fifos_and_other_special_files_never_block_a_worker(executor: Executor, workspace: Path,
                                                                tool: str) -> None:
    import socket

    os.mkfifo(workspace / "pipe")
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(workspace / "sock"))
    try:
        for path in ("pipe", "sock", "pipe", "pipe", "pipe", "pipe", "pipe", "pipe"):  # more than the thread pool
            args = {"content": "x"} if tool == "write_file" else {}
            result = await asyncio.wait_for(call(executor, tool, path=path, **args), timeout=5)
            assert result.error.code is ErrorCode.PERMISSION_DENIED and "not a regular file" in result.error.message
        assert (await call(executor, "read_file", path="hello.txt")).success  # the worker still answers
        directory = await call(executor, tool, path="sub", **({"content": "x"} if tool == "write_file" else {}))
        assert directory.error.code is ErrorCode.INVALID_ARGUMENTS
    finally:
        listening.close()


async def test_missing_file_is_file_not_found(executor: Executor) -> None:
    result = await call(executor, "read_file", path="nope/missing.txt")
    assert result.error.code is ErrorCode.FILE_NOT_FOUND and result.error.recoverable
    result = await call(executor, "read_file", path="missing.txt")
    assert result.error.code is ErrorCode.FILE_NOT_FOUND and "'missing.txt' does not exist" in result.error.message


async def test_unknown_tool_lists_the_available_ones(executor: Executor) -> None:
    result = await call(executor, "delete_everything")
    assert result.error.code is ErrorCode.TOOL_NOT_FOUND
    assert "available tools: " + ", ".join(executor.registry.names()) in result.error.message


async def test_invalid_arguments_one_line_per_path(executor: Executor) -> None:
    result = await call(executor, "read_file", path=5, offset=0, extra=True)
    assert result.error.code is ErrorCode.INVALID_ARGUMENTS
    lines = result.error.details["errors"]
    assert any(line.startswith("path: 5 is not of type 'string'") for line in lines)
    assert any(line.startswith("offset: 0 is less than the minimum of 1") for line in lines)
    assert any("extra" in line and "(arguments)" in line for line in lines)
    assert len(lines) == 3


async def test_big_results_are_cut_with_a_marker(executor: Executor, workspace: Path) -> None:
    (workspace / "big.txt").write_text("x" * 10_000)
    result = await call(executor, "read_file", path="big.txt")
    assert result.success and result.metadata.truncated
    assert size_of(result.data) <= 2_000
    assert result.data["content"].startswith("xxxx") and "truncated by Pincer" in result.data["content"]
    assert result.data["size"] == 10_000  # the rest of the structure survives


async def test_files_over_the_limit_are_refused(executor: Executor, workspace: Path) -> None:
    (workspace / "huge.bin").write_bytes(b"\0" * 100_001)
    result = await call(executor, "read_file", path="huge.bin")
    assert result.error.code is ErrorCode.RESOURCE_EXHAUSTED and "100,001 bytes" in result.error.message


async def test_expired_deadline_is_not_run(executor: Executor, workspace: Path) -> None:
    result = await executor.execute(ToolExecute(tool="write_file", args={"path": "late.txt", "content": "x"},
                                                reply_to="r", deadline=now_ms() - 1))
    assert result.error.code is ErrorCode.TIMEOUT and not (workspace / "late.txt").exists()


async def test_crashing_and_slow_handlers_become_errors(executor: Executor) -> None:
    import asyncio

    def crash(_args, _ctx):
        raise KeyError("boom")

    async def slow(_args, _ctx):
        await asyncio.sleep(30)

    for name, handler, timeout in (("crash", crash, None), ("slow", slow, 1.0)):
        executor.registry.register(ToolDefinition(name=name, description=name, handler=handler,
                                                  parameters={"type": "object"}, category=Category.SKILL,
                                                  timeout_s=timeout, retry=RetryPolicy(retries=0)))
    crashed = await call(executor, "crash")
    assert crashed.error.code is ErrorCode.UNHANDLED and "KeyError" in crashed.error.message
    slowed = await call(executor, "slow")
    assert slowed.error.code is ErrorCode.TIMEOUT and "within its 1s limit" in slowed.error.message


def test_shape_keeps_small_data_and_cuts_everything_else_under_the_limit() -> None:
    assert shape({"a": 1}, 1000) == ({"a": 1}, False)
    for data in ("é" * 5000, {"text": "\n" * 5000, "n": 1}, [{"x": "y" * 100}] * 100, {"a": list(range(3000))}):
        shaped, cut = shape(data, 1000)
        assert cut and size_of(shaped) <= 1000 and "truncated by Pincer" in str(shaped)


def test_registry_view_is_cached_and_hides_handlers() -> None:
    registry = build_registry()
    view = registry.brain_view()
    assert registry.brain_view() is view
    assert all(set(spec.model_dump()) == {"name", "description", "parameters", "metadata"} for spec in view)
    digest = registry.digest()
    registry.unregister("write_file")
    assert registry.brain_view() is not view and registry.digest() != digest
    with pytest.raises(ValueError, match="invalid parameter schema"):
        registry.register(ToolDefinition(name="bad", description="", handler=print,
                                         parameters={"type": "nonsense"}, category=Category.SKILL))


async def test_an_alias_runs_its_tool_and_is_listed_nowhere(executor: Executor) -> None:
    registry = executor.registry
    assert registry.get("execute_shell") is registry.get("exec") and "execute_shell" in registry
    assert "execute_shell" not in registry.names()
    assert [spec.name for spec in registry.brain_view()].count("exec") == 1
    assert all(spec.name != "execute_shell" for spec in registry.brain_view())
    # The wire still answers it: a caller naming execute_shell gets exec's validation (and run).
    result = await call(executor, "execute_shell", command="")
    assert result.error.code is ErrorCode.INVALID_ARGUMENTS and "command" in result.error.message
    for taken in ("execute_shell", "exec"):
        with pytest.raises(ValueError, match=f"the name {taken!r} is already registered"):
            registry.register(ToolDefinition(name=taken, description="", handler=print,
                                             parameters={"type": "object"}, category=Category.SKILL))
    with pytest.raises(ValueError, match="the name 'exec' is already registered"):
        registry.register(ToolDefinition(name="shell", aliases=("exec",), description="", handler=print,
                                         parameters={"type": "object"}, category=Category.SKILL))
    registry.unregister("exec")
    assert "execute_shell" not in registry
    registry.register(ToolDefinition(name="execute_shell", description="", handler=print,
                                     parameters={"type": "object"}, category=Category.SKILL))


def test_openat2_is_used_and_refuses_what_the_walk_refuses(workspace: Path, tmp_path: Path) -> None:
    import errno

    from bus.openat2 import openat2

    root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = openat2(root, "sub", os.O_RDONLY | os.O_DIRECTORY)
        assert fd is not None, "this kernel (5.6+) has openat2"
        os.close(fd)
        os.symlink(tmp_path, workspace / "out")
        for path, code in (("../", errno.EXDEV), ("out", errno.ELOOP), ("/proc/self/root", errno.EXDEV)):
            with pytest.raises(OSError) as info:
                openat2(root, path, os.O_RDONLY | os.O_DIRECTORY)
            assert info.value.errno == code, path
    finally:
        os.close(root)


async def test_symlink_swap_race_never_leaks(executor: Executor, workspace: Path, tmp_path: Path) -> None:
    """A thread flips sub/inner between a real directory and a link to the secret's directory."""
    import threading

    (tmp_path / "secret-dir").mkdir()
    (tmp_path / "secret-dir" / "f.txt").write_text("TOP SECRET")
    real = workspace / "real"
    real.mkdir()
    (real / "f.txt").write_text("harmless")
    target = workspace / "flip"
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            for make in (lambda: os.symlink(tmp_path / "secret-dir", target), lambda: os.symlink(real, target)):
                try:
                    make()
                    os.unlink(target)
                except OSError:
                    pass

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        results = [await call(executor, "read_file", path="flip/f.txt") for _ in range(300)]
    finally:
        stop.set()
        flipper.join()
    assert not any(r.success and "SECRET" in r.data["content"] for r in results)
    assert all(r.error.code in (ErrorCode.PERMISSION_DENIED, ErrorCode.FILE_NOT_FOUND) for r in results)


@pytest.mark.parametrize(("address", "allowed"), [
    ("93.184.216.34", True), ("2606:2800:220:1:248:1893:25c8:1946", True),
    ("64:ff9b::5db8:d822", True),  # NAT64 of a public IPv4 address stays public
    ("2002:5db8:d822::1", True),  # 6to4 of a public one too
    ("64:ff9b::a9fe:a9fe", False), ("64:ff9b::a00:1", False), ("64:ff9b:1::5db8:d822", False),
    ("2002:c0a8:101::1", False), ("::a9fe:a9fe", False), ("::ffff:0:7f00:1", False), ("::ffff:10.0.0.1", False),
    ("fec0::1", False), ("fe80::1", False), ("::1", False), ("::", False), ("ff02::1", False),
    ("2001:0:4136:e378:8000:63bf:f5ff:fffe", False),  # Teredo whose client is 10.0.0.1
])
def test_the_address_table_unwraps_every_embedded_ipv4(address: str, allowed: bool) -> None:
    import ipaddress

    from hands.netguard import public

    assert public(ipaddress.ip_address(address), also_allowed=[]) is allowed
