"""Adversarial calls to the code tools through the bus: each is refused or contained, and the host is unchanged."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from bus.protocol import ErrorCode
from tests.conftest import async_wait_until, processes_matching

TIERS = ["bwrap", "landlock", "rlimits"]


# bwrap runs every test both ways (a session's sandbox kept warm, and a bwrap per command); the other tiers
# have no warm path, so they run cold only.
MODES = [("bwrap", True), *((tier, False) for tier in TIERS)]


@pytest.fixture(params=MODES, ids=[f"{tier}-{'warm' if warm else 'cold'}" for tier, warm in MODES])
def mode(request: pytest.FixtureRequest) -> tuple[str, bool]:
    if request.param[0] == "bwrap" and not shutil.which("bwrap"):
        pytest.fail("bubblewrap is not installed: .ci/run installs it (apt-get install bubblewrap)")
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def tier(mode: tuple[str, bool]) -> str:
    return mode[0]


@pytest.fixture
def warm(mode: tuple[str, bool]) -> bool:
    return mode[1]


@pytest.fixture
async def sandboxed(engine, tier: str, warm: bool, ws: Path):
    worker = await engine(workspace=ws, sandbox={"tier": tier, "allow_degraded": True, "default_timeout_s": 5,
                                                 "warm": warm})
    assert worker.sandbox.tier == tier and (worker.sandbox.warm is not None) == warm
    return worker


async def test_commands_run_in_the_workspace_as_an_unprivileged_user(sandboxed, call, tier: str, ws: Path) -> None:
    result = await call("exec", {"command": "id -u; echo made > out.txt; pwd"})
    assert result.success and result.metadata.sandbox == tier
    uid, pwd = result.data["stdout"].split()
    assert uid == "65534" and result.data["exit_code"] == 0
    assert pwd == ("/workspace" if tier == "bwrap" else str(ws))
    assert (ws / "out.txt").read_text() == "made\n"
    py = await call("execute_python", {"code": "print(sum(range(10)))"})
    assert py.data["stdout"] == "45\n" and py.metadata.sandbox == tier
    argv = await call("exec", {"argv": ["printf", "%s-%s", "a b", "$HOME"]})
    assert argv.data["stdout"] == "a b-$HOME"  # no shell: nothing expanded


async def test_secrets_and_files_outside_stay_out_of_reach(sandboxed, call) -> None:
    shadow = await call("exec", {"command": "cat /etc/shadow"})
    assert shadow.data["exit_code"] != 0 and "root:" not in shadow.data["stdout"]
    before = Path("/etc/hostname").read_bytes()
    outside = await call("exec", {"command": "echo pwned > /etc/hostname; echo pwned > /root/pincer-pwned"})
    assert outside.data["exit_code"] != 0
    assert Path("/etc/hostname").read_bytes() == before and not Path("/root/pincer-pwned").exists()


async def test_a_sleep_that_outlives_its_timeout_leaves_no_orphan(sandboxed, call) -> None:
    result = await call("exec", {"command": "sleep 77.5 & sleep 77.5 & sleep 77.5", "timeout": 1})
    assert result.error.code is ErrorCode.TIMEOUT and "within its 1s limit and was killed" in result.error.message
    assert result.metadata.attempts == 1  # exec is not idempotent: never run twice
    await async_wait_until(lambda: not processes_matching("sleep 77.5"), timeout=10, what="the sleeps to be gone")


async def test_fork_bomb_and_memory_hog_are_contained(sandboxed, call) -> None:
    bomb = await call("exec", {"command": "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", "timeout": 4})
    assert bomb.success or bomb.error.code is ErrorCode.TIMEOUT
    await async_wait_until(lambda: not processes_matching("bomb"), timeout=10, what="the fork bomb to be gone")
    hog = await call("execute_python", {"code": "x = bytearray(2 * 1024 ** 3); print('allocated')"})
    assert hog.success and hog.data["exit_code"] != 0 and "MemoryError" in hog.data["stderr"]


async def test_an_output_flood_is_capped(sandboxed, call) -> None:
    flood = await call("exec", {"command": "yes flood | head -c 20000000; echo end >&2"})
    assert flood.success and flood.data["exit_code"] == 0
    assert flood.data["output_dropped_bytes"] > 19_000_000 and flood.data["stderr"] == "end\n"
    assert flood.metadata.truncated and "truncated by Pincer" in flood.data["stdout"]  # and shaped to 50 KB


async def test_env_injection_is_refused(sandboxed, call) -> None:
    refused = await call("exec", {"command": "true", "env": {"LD_PRELOAD": "/tmp/evil.so", "OK": "1"}})
    assert refused.error.code is ErrorCode.PERMISSION_DENIED and "LD_PRELOAD" in refused.error.message
    fine = await call("exec", {"command": "echo $GREETING; env | grep -c API_KEY || true",
                               "env": {"GREETING": "hello"}})
    assert fine.data["stdout"].split() == ["hello", "0"]  # no provider keys leak in


async def test_bad_arguments(sandboxed, call, ws: Path) -> None:
    both = await call("exec", {"command": "true", "argv": ["true"]})
    assert both.error.code is ErrorCode.INVALID_ARGUMENTS
    escape = await call("exec", {"command": "true", "workdir": "../.."})
    assert escape.error.code is ErrorCode.PERMISSION_DENIED
    os.symlink("/", ws / "rootlink")
    linked = await call("exec", {"command": "ls", "workdir": "rootlink"})
    assert linked.error.code is ErrorCode.PERMISSION_DENIED and "symbolic link" in linked.error.message


@pytest.mark.parametrize("mode", [m for m in MODES if m[0] in ("bwrap", "landlock")], indirect=True,
                         ids=lambda m: f"{m[0]}-{'warm' if m[1] else 'cold'}")
async def test_no_network_and_no_ptrace(sandboxed, call) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        result = await call("execute_python", {"code": (
            "import socket, ctypes, os\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')\n"
            "except OSError as e: print('refused', e.errno)\n"
            "print('ptrace', ctypes.CDLL(None, use_errno=True).ptrace(16, os.getppid(), 0, 0), ctypes.get_errno())\n"
            "try:\n    socket.socket(40, socket.SOCK_STREAM); print('vsock open')\n"
            "except OSError as e: print('vsock refused', e.errno)\n"
        )})
    lines = result.data["stdout"].splitlines()
    assert lines[0] == "refused 1" and lines[1] == "ptrace -1 1" and lines[2] == "vsock refused 1"


async def test_degraded_tier_is_refused_unless_allowed(engine, call, ws: Path) -> None:
    await engine(workspace=ws, sandbox={"tier": "rlimits"})
    refused = await call("exec", {"command": "true"})
    assert refused.error.code is ErrorCode.PERMISSION_DENIED
    assert "apt-get install bubblewrap" in refused.error.message and "allow_degraded" in refused.error.message


def test_bwrap_is_the_tier_when_installed() -> None:
    from hands.config import SandboxSettings
    from hands.sandbox.runner import Sandbox

    if not shutil.which("bwrap"):
        pytest.fail("bubblewrap is not installed: .ci/run installs it (apt-get install bubblewrap)")
    assert Sandbox(SandboxSettings(), Path("/tmp")).tier == "bwrap"
    assert subprocess.run(["bwrap", "--version"], capture_output=True).returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="only root drops to another uid for commands")
async def test_a_workspace_the_sandbox_cannot_reach_is_explained(engine, call, tmp_path: Path) -> None:
    await engine()  # the workspace under pytest's private temp dir
    refused = await call("exec", {"command": "true"})
    assert refused.error.code is ErrorCode.PERMISSION_DENIED
    assert "cannot enter" in refused.error.message and "PINCER_WORKSPACE" in refused.error.message


async def test_a_process_that_leaves_the_session_still_dies(sandboxed, call, tier: str) -> None:
    from hands.sandbox.cgroup import RunCgroup

    probe = RunCgroup.create()
    if tier == "rlimits" and probe is None:
        pytest.skip("without namespaces, only a cgroup (root, cgroup2) catches a setsid process")
    if probe is not None:
        probe.remove()
    result = await call("exec", {"command": "setsid sleep 88.5 & sleep 88.5", "timeout": 1})
    assert result.error.code is ErrorCode.TIMEOUT
    await async_wait_until(
        lambda: not processes_matching("sleep 88.5"), timeout=10, what="even the setsid sleep to be gone"
    )


@pytest.mark.parametrize("mode", [m for m in MODES if m[0] in ("bwrap", "landlock")], indirect=True,
                         ids=lambda m: f"{m[0]}-{'warm' if m[1] else 'cold'}")
async def test_the_host_stays_out_of_reach(sandboxed, call, tier: str, ws: Path, tmp_path: Path) -> None:
    """What the README's tier table promises for the two sandboxed tiers, tried from inside."""
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o777)
    target = outside / "theirs.txt"
    target.write_text("not yours")
    if os.geteuid() == 0:
        os.chown(target, 65534, 65534)  # owned by the sandbox uid, so only the sandbox stops a chmod
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(outside / "agent.sock"))
    server.listen()
    os.chmod(outside / "agent.sock", 0o777)
    try:
        result = await call("execute_python", {"code": (
            "import os, socket\n"
            "print('processes', len([p for p in os.listdir('/proc') if p.isdigit()]))\n"
            "try:\n"
            f"    s = socket.socket(socket.AF_UNIX); s.connect({str(outside / 'agent.sock')!r}); print('connected')\n"
            "except OSError as e: print('socket refused', e.errno)\n"
            "try:\n"
            f"    os.chmod({str(target)!r}, 0o777); print('chmod done')\n"
            "except OSError as e: print('chmod refused', e.errno)\n"
            "a, b = socket.socketpair(); a.send(b'x'); print('socketpair', b.recv(1))\n"
            "try:\n"
            "    open('mine.txt', 'w').close(); os.chmod('mine.txt', 0o600); print('own files', '0o600')\n"
            "except OSError as e: print('own chmod refused', e.errno)\n"
        )})
        assert result.success, result
        lines = result.data["stdout"].splitlines()
        assert int(lines[0].split()[1]) <= 3, lines[0]  # its own few, not the host's hundreds
        assert lines[1].startswith("socket refused") and lines[2].startswith("chmod refused"), lines
        assert lines[3] == "socketpair b'x'"
        assert target.stat().st_mode & 0o777 != 0o777 and target.read_text() == "not yours"
        # bwrap: its own files' modes are its own; landlock: chmod by path is refused even in the workspace
        assert lines[4] == ("own files 0o600" if tier == "bwrap" else "own chmod refused 1")
    finally:
        server.close()


async def test_one_sessions_fork_storm_does_not_starve_another(sandboxed) -> None:
    """RLIMIT_NPROC counts the sandbox uid machine-wide; a pids cgroup per session keeps each session to its own
    cap, however many commands it runs, and another session forks freely meanwhile."""
    sandbox = sandboxed.sandbox
    assert sandbox.session_caps, "as root on this machine kind a pids controller caps each session"
    cap = sandbox.settings.processes
    hog = await sandbox.start(["/bin/sh", "-c", f"for i in $(seq {cap - 20}); do sleep 60.25 & done; wait"],
                              workdir="", env={}, session="alice/storm")
    try:
        await async_wait_until(lambda: len(processes_matching("sleep 60.25")) >= cap - 20, timeout=30,
                               what="the first command to hold most of its session's process cap")
        other = await sandbox.run(["/bin/sh", "-c", "for i in $(seq 100); do sleep 0.1 & done; wait; echo all-ran"],
                                  workdir="", env={}, timeout_s=30, session="bob/main")
        assert other.stdout == "all-ran\n" and "fork" not in other.stderr, other
        # A second command of the same session has only what its session has left (its own cap is more).
        more = await sandbox.run(["/bin/sh", "-c", "for i in $(seq 100); do sleep 5.75 & done; echo looped"],
                                 workdir="", env={}, timeout_s=30, session="alice/storm")
        assert "fork" in more.stderr.lower() or "resource temporarily unavailable" in more.stderr.lower(), more
    finally:
        await hog.stop()
    await async_wait_until(lambda: not processes_matching("sleep 60.25"), timeout=10, what="the hog to be gone")
