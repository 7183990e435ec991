"""Processes per session when Pincer is not root: run as an unprivileged user for real (setpriv), with and
without a cgroup folder delegated to it; and the refusal that says what to configure where none can be had."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hands.config import SandboxSettings
from hands.sandbox import cgroup as cgroup_module
from hands.sandbox.runner import Sandbox, SandboxUnavailable

NOBODY = 65534
PIDS_V1 = Path("/sys/fs/cgroup/pids")

# Run as nobody with the system's python3 (the test's own interpreter may sit where nobody cannot reach), over a
# copy of the module under test (it needs nothing but the standard library).
SCRIPT = """
import json, os, signal, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from pincer_cgroup import RunCgroup
base = Path(sys.argv[2])
found = {"uid": os.geteuid(), "alone": RunCgroup.create(session="a", pids_max=50) is None,
         "usable_alone": RunCgroup.usable(None), "usable_delegated": RunCgroup.usable(base)}
def forks(session, count, seconds):
    group = RunCgroup.create(session=session, pids_max=60, session_pids_max=60, delegated=base)
    line = f"for i in $(seq {count}); do sleep {seconds} & done; wait; echo done"
    return group, group.wrap(["/bin/sh", "-c", line])
hog_group, command = forks("alice/storm", 50, 30.5)
hog = subprocess.Popen(command, start_new_session=True, stderr=subprocess.DEVNULL)
session_dir = hog_group.dirs[0].parent
deadline = time.monotonic() + 30
while int((session_dir / "pids.current").read_text()) < 50 and time.monotonic() < deadline:
    time.sleep(0.05)
found["held"] = int((session_dir / "pids.current").read_text())
_, again = forks("alice/storm", 30, 0.2)
same = subprocess.run(again, capture_output=True, text=True, timeout=60)
found["same_session"] = same.stderr.lower()
_, theirs = forks("bob/main", 30, 0.2)
other = subprocess.run(theirs, capture_output=True, text=True, timeout=60)
found["other_session"] = [other.stdout.strip(), other.stderr]
os.killpg(hog.pid, signal.SIGKILL)
hog.wait()
print(json.dumps(found))
"""


@pytest.fixture
def delegated() -> Iterator[Path]:
    """A folder of the v1 pids hierarchy handed to nobody, as an operator delegates one."""
    if os.geteuid() != 0 or not PIDS_V1.is_dir():
        pytest.fail("this test makes a cgroup folder for nobody: it needs root and the v1 pids hierarchy "
                    "(this machine kind has both)")
    base = PIDS_V1 / f"pincer-test-{uuid.uuid4().hex[:8]}"
    base.mkdir()
    for path in [base, *base.iterdir()]:
        os.chown(path, NOBODY, NOBODY)
    yield base
    for folder in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        folder.rmdir()
    base.rmdir()


def test_not_root_each_session_is_capped_under_a_delegated_cgroup(delegated: Path) -> None:
    code = Path(tempfile.mkdtemp(prefix="pincer-nonroot-", dir="/tmp"))
    try:
        code.chmod(0o755)
        shutil.copy(cgroup_module.__file__, code / "pincer_cgroup.py")
        (code / "pincer_cgroup.py").chmod(0o644)
        done = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                               "/usr/bin/python3", "-c", SCRIPT, str(code), str(delegated)],
                              capture_output=True, text=True, timeout=180, cwd="/tmp")
    finally:
        shutil.rmtree(code, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["uid"] == NOBODY
    assert found["alone"] and not found["usable_alone"]  # not root, nothing delegated: no cap to be had
    assert found["usable_delegated"] and found["held"] >= 50
    assert "fork" in found["same_session"] or "resource temporarily unavailable" in found["same_session"]
    assert found["other_session"] == ["done", ""]  # another session forks freely meanwhile


def test_where_no_session_can_be_capped_commands_are_refused_saying_what_to_do(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroup_module.RunCgroup, "usable", staticmethod(lambda _delegated: False))
    workspace = Path(tempfile.mkdtemp(prefix="pincer-ws-", dir="/tmp"))
    workspace.chmod(0o755)
    refused = Sandbox(SandboxSettings(allow_degraded=True), workspace)
    with pytest.raises(SandboxUnavailable) as told:
        refused.check_allowed()
    message = str(told.value)
    for what in ("fork storm", "hands.sandbox.cgroup_dir", "allow_shared_process_limit: true", "root"):
        assert what in message, message
    accepted = Sandbox(SandboxSettings(allow_degraded=True, allow_shared_process_limit=True), workspace)
    accepted.check_allowed()  # the operator accepted one shared limit: commands run
    workspace.rmdir()
