"""The local daemon: which `pincer up` owns a data dir, what it runs, and how to start and stop it from outside.

A running supervisor holds an exclusive lock on ``<data_dir>/pincer.lock``
(the kernel drops it when the process dies, so a crash leaves nothing stale
that matters) and keeps ``<data_dir>/pincer.json`` current: its own pid and
each child's, with the start time the kernel gives each process. A pid is
taken for Pincer's only while that start time still matches, so a pid reused
by another program is never signalled.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, Field

from bus.errors import PincerError
from bus.private_file import append_private, open_private, write_private
from gateway.runtime.logfiles import private_dir
from gateway.runtime.procinfo import resident_mb, start_time

STATE_FILE = "pincer.json"
LOCK_FILE = "pincer.lock"


class Proc(BaseModel):
    pid: int
    started: int  # the kernel's start time of the process (clock ticks since boot)


class DaemonState(BaseModel):
    supervisor: Proc
    argv: list[str]
    gateway_url: str
    log_dir: str
    ready: bool = False
    preparing: str = ""  # the local model's first fetch or build while it runs ("fetching the model: 0.4 of 1.1 GB")
    since: float = Field(default_factory=time.time)
    children: dict[str, Proc] = Field(default_factory=dict)  # role -> its current process
    rolled: int = 0  # rolling restarts finished (`pincer restart --rolling` waits for it to move)
    rolling: str = ""  # where the rolling restart under way stands, or why the last one stopped


class AlreadyRunning(PincerError):
    """Another `pincer up` owns this data dir; the message says which and how to stop it."""


def alive(proc: Proc) -> bool:
    return start_time(proc.pid) == proc.started


def this_process() -> Proc:
    pid = os.getpid()
    return Proc(pid=pid, started=start_time(pid) or 0)


@dataclass
class StateFile:
    data_dir: Path

    @property
    def path(self) -> Path:
        return self.data_dir / STATE_FILE

    def read(self) -> DaemonState | None:
        try:
            return DaemonState.model_validate_json(self.path.read_text())
        except (OSError, ValueError):
            return None

    def write(self, state: DaemonState) -> None:
        """Replace the file whole, so a reader never sees half of it."""
        write_private(self.path, state.model_dump_json(indent=2))

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def running(self) -> DaemonState | None:
        """The state of a supervisor that is still alive; a stale file (dead or reused pid) is removed."""
        state = self.read()
        if state is None:
            return None
        if not alive(state.supervisor):
            self.remove()
            return None
        return state


class DataDirLock:
    """The one `pincer up` of a data dir: an exclusive lock held for the life of the process."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Held open while we run; never through a link someone planted at its name.
        file = os.fdopen(open_private(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_APPEND), "a+")
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.close()
            state = StateFile(self.data_dir).read()
            what = f" (pid {state.supervisor.pid}, Gateway on {state.gateway_url})" if state else ""
            raise AlreadyRunning(f"pincer is already running on {self.data_dir}{what}; "
                                 "stop it with `pincer stop`, or give this one another PINCER_DATA_DIR") from None
        self._file = file

    def fileno(self) -> int:
        """The held lock's descriptor (the watcher inherits it across the exec, and the lock with it)."""
        assert self._file is not None, "acquire() first"
        return self._file.fileno()

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def detach(argv: list[str], *, data_dir: Path, log_dir: Path, env: dict[str, str],
           timeout_s: float = 120) -> int:
    """Start ``pincer up`` (``argv``) in the background; return once it is ready, or say why not."""
    state_file = StateFile(data_dir)
    running = state_file.running()
    if running is not None:
        print(f"pincer: error: already running on {data_dir} (pid {running.supervisor.pid}, Gateway on "
              f"{running.gateway_url}); `pincer stop` first", file=sys.stderr)
        return 1
    out = append_private(private_dir(log_dir) / "supervisor.log", binary=True)
    child = subprocess.Popen([sys.executable, "-m", "gateway", *argv], stdin=subprocess.DEVNULL, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True, env=env)
    out.close()
    deadline, said = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        if child.poll() is not None:
            print(f"pincer: error: pincer up exited with code {child.returncode} before it was ready:\n"
                  f"{_tail(log_dir / 'supervisor.log', 15)}", file=sys.stderr)
            return child.returncode or 1
        state = state_file.read()
        if state is not None and state.supervisor.pid == child.pid and state.preparing not in ("", said):
            said = state.preparing  # the local model's first start: a line each time its short form changes
            print(f"pincer: starting: {said}", flush=True)
        if state is not None and state.supervisor.pid == child.pid and state.ready:
            print(f"pincer is running in the background (pid {child.pid}): Gateway on {state.gateway_url}\n"
                  f"  logs: `pincer logs -f` ({log_dir})   stop: `pincer stop`")
            return 0
        time.sleep(0.2)
    print(f"pincer: error: not ready within {timeout_s:g}s; it goes on starting (pid {child.pid}): see "
          f"`pincer logs` or stop it with `pincer stop`", file=sys.stderr)
    return 1


def stop(data_dir: Path, *, timeout_s: float) -> int:
    """Stop the data dir's daemon: SIGTERM (it drains), then, past ``timeout_s``, SIGKILL what is left."""
    state_file = StateFile(data_dir)
    stale = state_file.read()
    state = state_file.running()
    if state is None:
        print("pincer is not running here" + (" (a stale state file was removed)" if stale else ""),
              file=sys.stderr)
        return 0
    print(f"stopping pincer (pid {state.supervisor.pid})…", file=sys.stderr)
    _signal(state.supervisor, signal.SIGTERM, group=False)
    everyone = [state.supervisor, *state.children.values()]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in everyone):
        time.sleep(0.1)
    left = [p for p in everyone if alive(p)]
    for proc in left:  # each child leads its own process group: take its descendants too
        _signal(proc, signal.SIGKILL, group=True)
    if left:
        print(f"killed {len(left)} process(es) still running after {timeout_s:g}s", file=sys.stderr)
    state_file.remove()
    print("stopped", file=sys.stderr)
    return 0


def _signal(proc: Proc, sig: signal.Signals, *, group: bool) -> None:
    if not alive(proc):  # never signal a pid that is no longer ours
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def describe(state: DaemonState) -> list[dict[str, Any]]:
    """Each local process of the daemon: role, pid, alive, uptime, resident memory."""
    rows = []
    for role, proc in [("supervisor", state.supervisor), *state.children.items()]:
        rows.append({"role": role, "pid": proc.pid, "alive": alive(proc), "rss_mb": resident_mb(proc.pid)})
    return rows
