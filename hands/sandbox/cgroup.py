"""A cgroup v2 per command where the machine offers one: ``cgroup.kill`` ends the whole tree at once.

Only used as root with a writable cgroup2 mount (unified or hybrid). The
command's first process writes itself into its cgroup and only then execs
the launcher chain (prlimit, setpriv, bwrap), so every descendant is born
inside. Elsewhere this is a no-op and the process group and pid
namespace do the killing.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path


def _cgroup2_mount() -> Path | None:
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return Path(fields[1])
    except OSError:
        pass
    return None


class RunCgroup:
    BASE = "pincer-sandbox"

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, *, memory_mb: int | None = None) -> RunCgroup | None:
        """A new cgroup for one command; with the memory controller there, capped at ``memory_mb``
        for the whole tree (rlimits cap each process alone: a job that forks could hold many times it)."""
        mount = _cgroup2_mount() if os.geteuid() == 0 else None
        if mount is None:
            return None
        path = mount / cls.BASE / uuid.uuid4().hex[:12]
        try:
            path.mkdir(parents=True)
        except OSError:
            return None
        if memory_mb:  # the memory controller reaches our cgroups only if their parent hands it down
            with contextlib.suppress(OSError):
                (path.parent / "cgroup.subtree_control").write_text("+memory")
        if not (path / "cgroup.kill").exists():  # kernels before 5.14
            cls._rmdir(path)
            return None
        if memory_mb and (path / "memory.max").exists():
            with contextlib.suppress(OSError):
                (path / "memory.max").write_text(str(memory_mb * 1024 * 1024))
        return cls(path)

    def wrap(self, command: list[str]) -> list[str]:
        """The command, made to enter this cgroup itself before it execs anything (so nothing is born outside)."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs"), *command]

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            (self.path / "cgroup.kill").write_text("1")

    def remove(self) -> None:
        self._rmdir(self.path)

    async def remove_when_empty(self, timeout_s: float = 2.0) -> None:
        """rmdir once the killed processes are really gone (cgroup.kill is asynchronous)."""
        import asyncio

        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + timeout_s, 0.001
        while loop.time() < deadline:
            try:
                if not (self.path / "cgroup.procs").read_text().strip():
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
