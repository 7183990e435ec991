"""The daemon lifecycle of the installed package: up --detach, status, logs, restart, stop, stale state."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gateway.runtime.daemon import DaemonState, Proc
from gateway.runtime.procinfo import start_time
from tests.conftest import wait_until
from tests.e2e.conftest import Installed, descendants, installed_env, pid_alive
from tests.scripted_llm import ScriptedLLM

# The first test to use the installed wheel builds it and installs its dependencies from the package
# index (minutes on a machine with no download cache); pipx and uv install them again.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def run(
    installed: Installed, env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([installed.pincer, *args], env=env, cwd=env["HOME"], capture_output=True, text=True,
                          timeout=timeout)


def state_of(env: dict[str, str]) -> DaemonState:
    return DaemonState.model_validate_json((Path(env["PINCER_DATA_DIR"]) / "pincer.json").read_text())


def test_detach_status_logs_restart_and_stop(installed: Installed, tmp_path: Path,
                                             scripted_llm: ScriptedLLM) -> None:
    env = installed_env(tmp_path, scripted_llm)
    up = run(installed, env, "up", "--detach", "--hands", "2")
    assert up.returncode == 0, up.stderr + up.stdout
    assert f"Gateway on http://127.0.0.1:{env['PINCER_GATEWAY_PORT']}" in up.stdout
    state = state_of(env)
    assert state.ready and set(state.children) == {"gateway", "brain", "hands-1", "hands-2"}
    tree = descendants(state.supervisor.pid) | {state.supervisor.pid}
    try:
        again = run(installed, env, "up", "--detach")
        assert again.returncode == 1 and "already running" in again.stderr
        foreground = run(installed, env, "up")  # the lock refuses a second supervisor of the data dir
        assert foreground.returncode == 1 and "already running" in foreground.stdout

        chat = run(installed, env, "chat", "-m", "hello daemon")
        assert chat.returncode == 0 and "echo: hello daemon" in chat.stdout, chat.stderr

        status = run(installed, env, "status", "--json")
        assert status.returncode == 0, status.stderr
        local = json.loads(status.stdout)["local"]
        assert local["pid"] == state.supervisor.pid and local["ready"]
        assert {p["role"] for p in local["processes"] if p["alive"]} >= {"supervisor", "gateway", "brain", "hands-1"}
        assert all(p["rss_mb"] > 0 for p in local["processes"])

        logs = run(installed, env, "logs", "--role", "brain", "-n", "200")
        assert logs.returncode == 0 and "turn done" in logs.stdout
        every = run(installed, env, "logs", "-n", "5")
        assert "gateway |" in every.stdout and "hands-2 |" in every.stdout
        assert run(installed, env, "logs", "--role", "../etc").returncode == 2

        restarted = run(installed, env, "restart")
        assert restarted.returncode == 0, restarted.stderr
        new = state_of(env)
        assert new.supervisor.pid != state.supervisor.pid and set(new.children) == set(state.children)
        assert not [pid for pid in tree if pid_alive(pid)], "restart left the old processes running"
        tree = descendants(new.supervisor.pid) | {new.supervisor.pid}
    finally:
        stopped = run(installed, env, "stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stderr, stopped.stderr
    assert not [pid for pid in tree if pid_alive(pid)], "pincer stop left processes behind"
    assert not (Path(env["PINCER_DATA_DIR"]) / "pincer.json").exists()
    assert run(installed, env, "stop").stderr.startswith("pincer is not running here")


def test_a_stale_state_file_is_never_taken_for_pincer(installed: Installed, tmp_path: Path,
                                                     scripted_llm: ScriptedLLM) -> None:
    env = installed_env(tmp_path, scripted_llm)
    data = Path(env["PINCER_DATA_DIR"])
    data.mkdir(parents=True)
    # A pid that is alive but is not Pincer (this test's own, with another start time): a reused pid.
    me = os.getpid()
    reused = DaemonState(supervisor=Proc(pid=me, started=(start_time(me) or 0) + 1), argv=["up"],
                         gateway_url="http://127.0.0.1:1", log_dir=str(data / "logs"))
    (data / "pincer.json").write_text(reused.model_dump_json())
    stop = run(installed, env, "stop", "--timeout", "1")
    assert stop.returncode == 0 and "stale state file was removed" in stop.stderr
    assert not (data / "pincer.json").exists()  # and this process was not signalled: we are still here

    dead = reused.model_copy(update={"supervisor": Proc(pid=2**22 - 7, started=1)})
    (data / "pincer.json").write_text(dead.model_dump_json())
    up = run(installed, env, "up", "--detach")
    try:
        assert up.returncode == 0, up.stderr
        wait_until(lambda: state_of(env).ready, timeout=30, what="the new state file")
        assert state_of(env).supervisor.pid != dead.supervisor.pid
    finally:
        assert run(installed, env, "stop").returncode == 0


def test_a_bad_config_in_the_background_says_why_and_exits_78(installed: Installed, tmp_path: Path,
                                                              scripted_llm: ScriptedLLM) -> None:
    env = {**installed_env(tmp_path, scripted_llm), "PINCER_HANDS__CONCURRENCY__GLOBAL": "many"}
    up = run(installed, env, "up", "--detach")
    assert up.returncode == 78 and "hands.concurrency.global" in up.stderr


def test_a_scheduled_backup_writes_verified_archives_and_keeps_the_newest(installed: Installed, tmp_path: Path,
                                                                         scripted_llm: ScriptedLLM) -> None:
    env = {**installed_env(tmp_path, scripted_llm), "PINCER_RUNTIME__BACKUP__CRON": "*/3 * * * * *",
           "PINCER_RUNTIME__BACKUP__KEEP": "2"}
    up = run(installed, env, "up", "--detach", "--hands", "1")
    assert up.returncode == 0, up.stderr + up.stdout
    backups = Path(env["PINCER_DATA_DIR"]) / "backups"
    try:
        assert run(installed, env, "chat", "-m", "kept in the archive").returncode == 0

        def written() -> int:
            logs = run(installed, env, "logs", "-n", "400").stdout
            assert "scheduled backup FAILED" not in logs, logs
            return logs.count("scheduled backup done")

        wait_until(lambda: written() >= 3, timeout=90, what="three scheduled backups")
        archives = sorted(backups.glob("pincer-backup-*.tar.gz"))
        assert 1 <= len(archives) <= 2  # the older ones pruned
        checked = run(installed, env, "restore", str(archives[-1]), "--verify-only", "--json")
        assert checked.returncode == 0, checked.stderr
        assert json.loads(checked.stdout)["redis"]["keys"] > 0
    finally:
        assert run(installed, env, "stop").returncode == 0


def test_a_rolling_restart_replaces_every_process_while_turns_run_and_loses_none(
        installed: Installed, tmp_path: Path, scripted_llm: ScriptedLLM) -> None:
    import threading

    import httpx

    env = installed_env(tmp_path, scripted_llm)
    up = run(installed, env, "up", "--detach", "--hands", "1")
    assert up.returncode == 0, up.stderr + up.stdout
    before = state_of(env)
    token = (Path(env["PINCER_DATA_DIR"]) / "gateway.token").read_text().strip()
    client = httpx.Client(base_url=f"http://127.0.0.1:{env['PINCER_GATEWAY_PORT']}",
                          headers={"Authorization": f"Bearer {token}"}, timeout=120)
    codes: dict[str, int | str] = {}

    def turn(session: str) -> None:
        try:
            codes[session] = client.post(f"/v1/sessions/{session}/messages",
                                         json={"text": f"SLEEP 2\n{session}"}).status_code
        except httpx.HTTPError as exc:  # a connection the Gateway's own restart closed: the turn goes on
            codes[session] = type(exc).__name__

    try:
        turns = [threading.Thread(target=turn, args=(f"roll-{n}",)) for n in range(6)]
        for t in turns:
            t.start()
        wait_until(lambda: len(scripted_llm.requests) >= 6, timeout=30, what="six turns at the model")
        rolled = run(installed, env, "restart", "--rolling", timeout=600)
        assert rolled.returncode == 0, rolled.stderr
        for name in ("hands-1", "brain", "gateway"):
            assert f"restarting {name}" in rolled.stderr
        for t in turns:
            t.join(120)
        after = state_of(env)
        assert after.supervisor.pid == before.supervisor.pid and after.rolled == 1
        assert all(after.children[n].pid != before.children[n].pid for n in ("gateway", "brain", "hands-1"))

        def answered(session: str) -> bool:
            entries = client.get(f"/v1/sessions/{session}").json().get("entries", [])
            return any(m.get("role") == "assistant" and "slept 2s" in (m.get("content") or "") for m in entries)

        for n in range(6):
            wait_until(lambda n=n: answered(f"roll-{n}"), timeout=60, what=f"turn roll-{n} answered")
        assert all(code in (200, "RemoteProtocolError", "ReadError") for code in codes.values()), codes
    finally:
        client.close()
        assert run(installed, env, "stop").returncode == 0
