"""Cgroups per command where the machine offers them: a kill switch and caps for the whole tree.

Used only as root. On cgroup2 (unified or hybrid), ``cgroup.kill`` ends the
whole tree at once and ``memory.max``/``pids.max`` cap it where those
controllers are handed down. Where the pids controller lives only on a v1
hierarchy (hybrid machines), the command joins a v1 pids cgroup too. The
command's first process writes itself into its cgroups and only then execs
the launcher chain (prlimit, setpriv, bwrap), so every descendant is born
inside. Elsewhere this is a no-op: the process group and pid namespace do
the killing and RLIMIT_NPROC alone caps processes.
"""

from __future__ import annotations

import asyncio
import contextlib
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
        path.mkdir(parents=True)
    except OSError:
        return False
    return True


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
    except OSError:
        return False
    return True


class RunCgroup:
    def __init__(self, kill_dir: Path | None, pids_dir: Path | None, *, caps_processes: bool) -> None:
        self.kill_dir, self.pids_dir = kill_dir, pids_dir
        self.caps_processes = caps_processes  # the tree's process count is capped here, not by RLIMIT_NPROC alone

    @property
    def dirs(self) -> list[Path]:
        return [d for d in (self.kill_dir, self.pids_dir) if d is not None]

    @classmethod
    def create(cls, *, memory_mb: int | None = None, pids_max: int | None = None) -> RunCgroup | None:
        """New cgroups for one command: cgroup2 with ``cgroup.kill`` (and ``memory_mb``/``pids_max`` caps
        where those controllers reach it), plus a v1 pids cgroup when only v1 offers that controller.
        rlimits cap each process alone; these cap the tree (a forking job could hold many times as much)."""
        if os.geteuid() != 0:
            return None
        name = uuid.uuid4().hex[:12]
        mounts = _mounts()
        kill_dir = cls._unified(mounts, name, memory_mb=memory_mb, pids_max=pids_max)
        capped = kill_dir is not None and pids_max is not None and (kill_dir / "pids.max").exists()
        pids_dir = None
        if pids_max is not None and not capped:
            pids_dir = cls._v1_pids(mounts, name, pids_max)
            capped = pids_dir is not None
        if kill_dir is None and pids_dir is None:
            return None
        return cls(kill_dir, pids_dir, caps_processes=capped)

    @staticmethod
    def _unified(mounts: list[tuple[str, Path, set[str]]], name: str, *, memory_mb: int | None,
                 pids_max: int | None) -> Path | None:
        mount = next((point for kind, point, _ in mounts if kind == "cgroup2"), None)
        if mount is None or not _mkdir(path := mount / BASE / name):
            return None
        if not (path / "cgroup.kill").exists():  # kernels before 5.14
            RunCgroup._rmdir(path)
            return None
        for controller, file, value in (("memory", "memory.max", memory_mb and memory_mb * 1024 * 1024),
                                        ("pids", "pids.max", pids_max)):
            if not value:
                continue
            _write(path.parent / "cgroup.subtree_control", f"+{controller}")  # reaches us only if handed down
            if (path / file).exists() and not _write(path / file, str(value)):
                RunCgroup._rmdir(path)
                return None
        return path

    @staticmethod
    def _v1_pids(mounts: list[tuple[str, Path, set[str]]], name: str, pids_max: int) -> Path | None:
        mount = next((point for kind, point, options in mounts if kind == "cgroup" and "pids" in options), None)
        if mount is None or not _mkdir(path := mount / BASE / name):
            return None
        if not _write(path / "pids.max", str(pids_max)):
            RunCgroup._rmdir(path)
            return None
        return path

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
            self._rmdir(directory)

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

    @staticmethod
    def _rmdir(path: Path) -> None:
        with contextlib.suppress(OSError):
            path.rmdir()
