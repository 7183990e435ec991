"""The process `pincer up` becomes once it is prepared: it starts and watches its children from a plan
handed over in an anonymous file, holds none of what preparing needed, and cleans up when stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from bus.redis_server import free_port
from gateway.runtime.procinfo import start_time
from gateway.runtime.watch import Child, Plan
from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_the_watcher_runs_the_plan_without_pydantic_or_tls_and_cleans_up_when_stopped(tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import os, time; print('child says', os.environ['ONLY_MINE'], flush=True); "
                                     "time.sleep(600)"]
    state_file = tmp_path / "pincer.json"
    lock = os.open(tmp_path / "pincer.lock", os.O_RDWR | os.O_CREAT, 0o600)
    plan = Plan(children=[Child("sleeper", sleeper, {"ONLY_MINE": "s3cret", "PATH": "/usr/bin:/bin"},
                                role="hands")],
                state={"children": {}, "rolled": 0, "ready": False}, state_file=str(state_file), lock_fd=lock,
                hands=1, gateway_url=f"http://127.0.0.1:{free_port()}", grace_s=5, log_dir=str(tmp_path / "logs"),
                log_max_bytes=2**20, log_backups=1)
    handed = os.memfd_create("plan", 0)
    os.write(handed, plan.dumps().encode())
    os.lseek(handed, 0, os.SEEK_SET)
    watcher = subprocess.Popen([sys.executable, "-m", "gateway.runtime.watch", str(handed)], cwd=ROOT,
                               pass_fds=(handed, lock), stdout=subprocess.PIPE, text=True,
                               env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    os.close(handed)
    os.close(lock)
    try:
        state = wait_until(lambda: (state_file.is_file() and json.loads(state_file.read_text())["children"]) or None,
                           timeout=30, what="the child in the state file")
        child = state["sleeper"]
        assert start_time(child["pid"]) == child["started"]
        log = tmp_path / "logs" / "sleeper.log"
        wait_until(lambda: log.is_file() and "child says s3cret" in log.read_text(), timeout=30, what="its log")
        mapped = Path(f"/proc/{watcher.pid}/maps").read_text()
        assert "pydantic_core" not in mapped and "_ssl" not in mapped and "libssl" not in mapped
        watcher.send_signal(signal.SIGTERM)
        assert watcher.wait(30) == 0
        said = watcher.stdout.read() if watcher.stdout else ""
        assert "sleeper | child says s3cret" in said and "stopped" in said
        assert start_time(child["pid"]) is None  # stopped with it
        assert not state_file.exists()
    finally:
        if watcher.poll() is None:
            watcher.kill()
