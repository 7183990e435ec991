"""Cgroups per session and per command where the machine offers them: a kill switch and caps for each tree.

Each command gets a cgroup of its own inside one of its session's
(``pincer-sandbox/<session>/<command>``): ``pids.max`` on the session's caps
every process that session's commands hold at once, so one session's fork
storm never leaves another session unable to fork (RLIMIT_NPROC, which counts
every process of the sandbox uid on the machine, is only a backstop); the
command's own cgroup caps its tree and, on cgroup2, ``cgroup.kill`` ends it
at once. Where the pids controller lives only on a v1 hierarchy (hybrid
machines), the command joins a v1 pids cgroup too. The command's first
process writes itself into its cgroups and only then execs the launcher chain
(prlimit, setpriv, bwrap), so every descendant is born inside.

As root the cgroups live at each hierarchy's root. Not as root, they live
under ``hands.sandbox.cgroup_dir``: a folder of a cgroup hierarchy with the
pids controller that Pincer's user may write, delegated to it (systemd's
``Delegate=yes``, or an operator's ``chown``). Where neither can be had,
there is no per-session cap: the sandbox says so (``Sandbox.check_allowed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import uuid
from pathlib import Path

BASE = "pincer-sandbox"


def _mounts() -> list[tuple[str, Path, set[str]]]:
    """(type, mount point, options) of every cgroup mount."""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) > 3 and fields[2] in ("cgroup", "cgroup2"):
            found.append((fields[2], Path(fields[1]), set(fields[3].split(","))))
    return found


def _mkdir(path: Path) -> bool:
    try:
        path.mkdir(parents=True)  # the command's own name: one already there is never shared
    except OSError:
        return False
    return True


def _rmdir(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
    except OSError:
        return False
    return True


def session_key(session_id: str) -> str:
    """A cgroup name for a session: any session id, made a short safe name."""
    return "s-" + hashlib.sha256(session_id.encode()).hexdigest()[:16]


class _Caps:
    def __init__(self, *, memory_mb: int | None, pids_max: int | None, session_pids_max: int | None) -> None:
        self.memory_bytes = memory_mb * 1024 * 1024 if memory_mb else None
        self.pids_max, self.session_pids_max = pids_max, session_pids_max


def _nest(base: Path, group: str, name: str, caps: _Caps, *, unified: bool) -> Path | None:
    """``base/group/name`` with the session's cap on ``group`` and the command's on ``name``; None when the
    command's cgroup cannot be made (or, on cgroup2, has no ``cgroup.kill``: kernels before 5.14)."""
    session, path = base / group, base / group / name
    if not _mkdir(path):  # first: the session's folder cannot be removed under us while this one is in it
        return None
    if unified and not (path / "cgroup.kill").exists():
        _rmdir(path)
        return None
    wanted = [("pids", "pids.max", caps.session_pids_max, caps.pids_max)]
    if unified:
        wanted.append(("memory", "memory.max", None, caps.memory_bytes))
    for controller, file, on_session, on_command in wanted:
        if on_command is None:
            continue
        if unified:  # handed down only if every level above allows it
            for level in (base.parent, base, session):
                _write(level / "cgroup.subtree_control", f"+{controller}")
        for where, value in ((session, on_session), (path, on_command)):
            if value is not None and (where / file).exists() and not _write(where / file, str(value)):
                _rmdir(path)
                return None
    return path


class RunCgroup:
    def __init__(self, kill_dir: Path | None, pids_dir: Path | None, *, caps_processes: bool) -> None:
        self.kill_dir, self.pids_dir = kill_dir, pids_dir
        # The session's and the command's process counts are capped here, not by RLIMIT_NPROC alone.
        self.caps_processes = caps_processes

    @property
    def dirs(self) -> list[Path]:
        return [d for d in (self.kill_dir, self.pids_dir) if d is not None]

    @classmethod
    def create(cls, *, session: str = "", memory_mb: int | None = None, pids_max: int | None = None,
               session_pids_max: int | None = None, delegated: Path | None = None) -> RunCgroup | None:
        """New cgroups for one command of ``session``: cgroup2 with ``cgroup.kill`` (and the memory and pids
        caps where those controllers reach it), plus a v1 pids cgroup when only v1 offers that controller.
        rlimits cap each process alone; these cap the tree and the session (a forking command could hold many
        times as much). Not as root, only under ``delegated``."""
        name, group = uuid.uuid4().hex[:12], session_key(session)
        caps = _Caps(memory_mb=memory_mb, pids_max=pids_max, session_pids_max=session_pids_max or pids_max)
        if os.geteuid() != 0:
            return cls._delegated(delegated, group, name, caps) if delegated is not None else None
        mounts = _mounts()
        unified = next((point for kind, point, _ in mounts if kind == "cgroup2"), None)
        kill_dir = _nest(unified / BASE, group, name, caps, unified=True) if unified is not None else None
        capped = kill_dir is not None and pids_max is not None and (kill_dir / "pids.max").exists()
        pids_dir = None
        if pids_max is not None and not capped:
            v1 = next((point for kind, point, options in mounts if kind == "cgroup" and "pids" in options), None)
            pids_dir = _nest(v1 / BASE, group, name, caps, unified=False) if v1 is not None else None
            capped = pids_dir is not None
        if kill_dir is None and pids_dir is None:
            return None
        return cls(kill_dir, pids_dir, caps_processes=capped)

    @classmethod
    def _delegated(cls, base: Path, group: str, name: str, caps: _Caps) -> RunCgroup | None:
        unified = (base / "cgroup.controllers").exists()
        path = _nest(base, group, name, caps, unified=unified)
        if path is None or caps.pids_max is None or not (path / "pids.max").exists():
            return None
        return cls(path if unified else None, None if unified else path, caps_processes=True)

    @staticmethod
    def usable(delegated: Path | None) -> bool:
        """Whether commands here get a session's pids cap (as root: a pids controller; else ``delegated``)."""
        probe = RunCgroup.create(session="probe", pids_max=8, delegated=delegated)
        if probe is None:
            return False
        probe.remove()
        return probe.caps_processes

    def wrap(self, command: list[str]) -> list[str]:
        """The command, made to enter these cgroups itself before it execs anything (so nothing is born outside)."""
        joins = " && ".join(f'echo $$ > "${index}"' for index in range(len(self.dirs)))
        procs = [str(d / "cgroup.procs") for d in self.dirs]
        return ["/bin/sh", "-c", f'{joins} && shift {len(procs) - 1} && exec "$@"', *procs, *command]

    def kill(self) -> None:
        if self.kill_dir is not None:
            _write(self.kill_dir / "cgroup.kill", "1")

    def remove(self) -> None:
        for directory in self.dirs:
            _rmdir(directory)
            _rmdir(directory.parent)  # the session's, once its last command is gone (busy: kept)

    async def remove_when_empty(self, timeout_s: float = 2.0) -> None:
        """rmdir once the killed processes are really gone (cgroup.kill is asynchronous)."""
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + timeout_s, 0.001
        while loop.time() < deadline:
            try:
                if not any((d / "cgroup.procs").read_text().strip() for d in self.dirs):
                    break
            except OSError:
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)  # usually gone within a millisecond or two
        self.remove()
