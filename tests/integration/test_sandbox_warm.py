"""Warm sandboxes: a session's commands reuse one bwrap, still isolated and limited, torn down when idle,
at shutdown, and replaced when its runner dies. (test_sandbox.py runs its whole suite warm and cold too.)"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path

import pytest

from hands.sandbox.warm import WarmSandbox
from tests.conftest import async_wait_until, processes_matching

NS_AND_TMP = "readlink /proc/self/ns/pid; ls /tmp"


@pytest.fixture
async def warm(engine, ws: Path):
    if not shutil.which("bwrap"):
        pytest.fail("bubblewrap is not installed: .ci/run installs it (apt-get install bubblewrap)")
    worker = await engine(workspace=ws, sandbox={"tier": "bwrap", "warm": True, "warm_idle_s": 60,
                                                 "default_timeout_s": 5})
    assert worker.sandbox.warm is not None
    return worker


def sandboxes(worker) -> list[WarmSandbox]:
    return list(worker.sandbox.warm.all)


def gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def cgroups_left(sandbox: WarmSandbox) -> list[Path]:
    return [d for d in (sandbox.cgroup.dirs if sandbox.cgroup is not None else []) if d.exists()]


def runner_pids() -> list[int]:
    """Host pids of this test process's warm runners (the interpreter inside a bwrap, not bwrap itself);
    another test run on the machine has its own."""
    parents, argvs = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                argvs[int(entry.name)] = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the name

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid == os.getpid():
                return True
            pid = parents.get(pid, 0)
        return False

    return [pid for pid, argv in argvs.items()
            if argv[0].endswith(b"python3") and len(argv) > 3 and b"warm sandbox's runner" in argv[3] and ours(pid)]


async def test_a_sessions_commands_share_one_sandbox_and_other_sessions_get_their_own(warm, call) -> None:
    first = await call("exec", {"command": f"echo mine > /tmp/left; {NS_AND_TMP}"}, session="alice/1")
    again = await call("exec", {"command": NS_AND_TMP}, session="alice/1")
    theirs = await call("exec", {"command": NS_AND_TMP}, session="bob/1")
    assert first.success and first.metadata.sandbox == "bwrap", first
    ns = first.data["stdout"].split()[0]
    assert again.data["stdout"].split() == [ns, "left"]  # the same pid namespace, its /tmp kept
    assert theirs.data["stdout"].split()[0] != ns and "left" not in theirs.data["stdout"]  # another's
    assert len(sandboxes(warm)) == 2


async def test_one_session_cannot_see_anothers_processes(warm, call) -> None:
    hidden = await call("exec", {"command": "sleep 63.5", "background": True}, session="alice/2")
    assert hidden.data["status"] == "running", hidden
    look = await call("execute_python", {"code": (
        "import os\n"
        "seen = [open(f'/proc/{p}/cmdline', 'rb').read() for p in os.listdir('/proc') if p.isdigit()]\n"
        "print(sum(b'63' + b'.5' in c for c in seen), len(seen))\n")}, session="bob/2")
    matching, total = look.data["stdout"].split()
    assert matching == "0" and int(total) <= 4, look.data  # bwrap's init, the runner, python


async def test_isolation_and_limits_hold_in_a_warm_sandbox(warm, call) -> None:
    await call("exec", {"command": "true"}, session="s")  # warm from here on
    looked = await call("exec", {"command": "id -u; pwd; ulimit -n; cat /etc/shadow 2>&1 | head -c 40; echo",
                                 "workdir": "."}, session="s")
    uid, pwd, files, *_ = looked.data["stdout"].split("\n")
    assert (uid, pwd, files) == ("65534", "/workspace", "256")
    assert "root:" not in looked.data["stdout"]
    runner = await call("exec", {"command": "cat /proc/2/comm; head -c 1 /proc/2/environ"}, session="s")
    assert runner.data["stdout"] == "python3\n" and "Permission denied" in runner.data["stderr"]  # not dumpable
    net = await call("execute_python", {"code": (
        "import socket\n"
        "try:\n    socket.socket(socket.AF_INET); print('socket')\n"
        "except OSError as e: print('refused', e.errno)\n")}, session="s")
    assert net.data["stdout"] == "refused 1\n"
    flood = await call("exec", {"command": "yes flood | head -c 5000000"}, session="s")
    assert flood.data["output_dropped_bytes"] > 4_000_000
    slow = await call("exec", {"command": "sleep 64.5 & setsid sleep 64.5 & sleep 64.5", "timeout": 1}, session="s")
    assert slow.error.code.value == "TIMEOUT"
    await async_wait_until(lambda: not processes_matching("sleep 64.5"), timeout=10, what="every sleep to be gone")
    after = await call("exec", {"command": "echo still here"}, session="s")
    assert after.data["stdout"] == "still here\n" and len(sandboxes(warm)) == 1  # the same sandbox goes on


async def test_concurrent_commands_of_one_session_each_get_a_sandbox(warm) -> None:
    sandbox = warm.sandbox
    both = await asyncio.gather(*(sandbox.run(["/bin/sh", "-c", f"sleep 0.5; {NS_AND_TMP}"], workdir="",
                                              env={"PATH": "/usr/bin:/bin"}, timeout_s=10, session="c")
                                  for _ in range(2)))
    assert all(result.exit_code == 0 for result in both), both
    assert both[0].stdout != both[1].stdout  # two namespaces: neither waited for the other's sandbox
    assert len(sandboxes(warm)) == 2


async def test_an_idle_sandbox_is_torn_down(engine, call, ws: Path) -> None:
    worker = await engine(workspace=ws, sandbox={"tier": "bwrap", "warm": True, "warm_idle_s": 0.5})
    await call("exec", {"command": "true"}, session="idle")
    (sandbox,) = sandboxes(worker)
    pid = sandbox.process.pid
    assert not gone(pid)
    await async_wait_until(lambda: gone(pid), timeout=10, what="the idle sandbox's bwrap to be gone")
    assert not sandboxes(worker) and not runner_pids()
    await async_wait_until(lambda: not cgroups_left(sandbox), timeout=10, what="its cgroups removed")


async def test_shutdown_tears_every_sandbox_down(engine, call, ws: Path) -> None:
    worker = await engine(workspace=ws, sandbox={"tier": "bwrap", "warm": True})
    for session in ("a", "b"):
        await call("exec", {"command": "true"}, session=session)
    pids = [s.process.pid for s in sandboxes(worker)]
    assert len(pids) == 2 and len(runner_pids()) == 2
    await engine.stop(worker)
    await async_wait_until(lambda: all(gone(pid) for pid in pids) and not runner_pids(), timeout=10,
                           what="every warm sandbox to be gone")


async def test_a_killed_runner_is_replaced_and_the_next_command_runs_once(warm, call, ws: Path) -> None:
    first = await call("exec", {"command": "readlink /proc/self/ns/pid"}, session="k")
    (sandbox,) = sandboxes(warm)
    (runner,) = runner_pids()
    os.kill(runner, signal.SIGKILL)
    await async_wait_until(lambda: gone(sandbox.process.pid), timeout=10, what="its bwrap to follow the runner")
    counted = await call("exec", {"command": "echo once >> count.txt; readlink /proc/self/ns/pid"}, session="k")
    assert counted.success and counted.data["exit_code"] == 0, counted
    assert counted.data["stdout"] != first.data["stdout"]  # a new sandbox
    assert (ws / "count.txt").read_text() == "once\n"
    assert sandboxes(warm) != [sandbox] and len(runner_pids()) == 1
    await async_wait_until(lambda: not cgroups_left(sandbox), timeout=10, what="the dead sandbox's cgroups removed")


async def test_a_runner_killed_mid_command_fails_that_command_without_running_it_again(warm, call,
                                                                                      ws: Path) -> None:
    await call("exec", {"command": "true"}, session="m")
    (runner,) = runner_pids()
    running = asyncio.create_task(call("exec", {"command": "echo ran >> runs.txt; sleep 30"}, session="m"))
    await async_wait_until(lambda: (ws / "runs.txt").exists(), timeout=10, what="the command to start")
    os.kill(runner, signal.SIGKILL)
    result = await running
    assert result.success and result.data["signal"] == "SIGKILL", result  # ended with its sandbox
    assert (ws / "runs.txt").read_text() == "ran\n"  # and never run again elsewhere
    after = await call("exec", {"command": "echo fine"}, session="m")
    assert after.data["stdout"] == "fine\n"


async def test_past_warm_max_the_longest_idle_goes_and_a_busy_pool_runs_cold(engine, call, ws: Path) -> None:
    worker = await engine(workspace=ws, sandbox={"tier": "bwrap", "warm": True, "warm_max": 1})
    await call("exec", {"command": "true"}, session="a")
    (first,) = sandboxes(worker)
    await call("exec", {"command": "true"}, session="b")
    assert gone(first.process.pid)  # a's idle sandbox made room for b's
    (second,) = sandboxes(worker)
    assert second.key.session == "b"
    held = await call("exec", {"command": "sleep 65.5", "background": True}, session="b")
    assert held.data["status"] == "running"
    cold = await call("exec", {"command": "readlink /proc/self/ns/pid; echo ran"}, session="c")
    assert cold.success and cold.data["stdout"].endswith("ran\n"), cold  # cold: the only sandbox is busy
    assert sandboxes(worker) == [second]


async def test_a_request_too_large_for_one_message_runs_cold_and_the_sandbox_stays(warm) -> None:
    sandbox = warm.sandbox
    small = await sandbox.run(["/bin/sh", "-c", "readlink /proc/self/ns/pid"], workdir="", env={}, timeout_s=10,
                              session="big")
    many = ["x" * 1000] * 1500  # ~1.5 MB of arguments: more than one datagram takes, less than exec does
    large = await sandbox.run(["/bin/sh", "-c", 'echo "$#"; readlink /proc/self/ns/pid', "sh", *many], workdir="",
                              env={}, timeout_s=10, session="big")
    assert large.exit_code == 0 and large.stdout.split()[0] == "1500", large.stderr
    assert large.stdout.split()[1] != small.stdout.strip()  # a cold sandbox of its own
    (kept,) = sandboxes(warm)
    again = await sandbox.run(["/bin/sh", "-c", "readlink /proc/self/ns/pid"], workdir="", env={}, timeout_s=10,
                              session="big")
    assert again.stdout == small.stdout and sandboxes(warm) == [kept]
