"""What /proc says of a process: when it started and what it holds. Standard library only, so the
watcher of `pincer up` can use it and stay small."""

from __future__ import annotations

from pathlib import Path


def start_time(pid: int) -> int | None:
    """When the process started (kernel ticks since boot), or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie has finished
        return None
    return int(fields[19])


def resident_mb(pid: int) -> float | None:
    return _mb_field(f"/proc/{pid}/status", "VmRSS:")


def proportional_mb(pid: int) -> float | None:
    """The process's share of the memory it maps (PSS): a page shared by N processes counts 1/N in each, so
    the sum over a tree is what the tree takes from the machine, where RSS counts libpython once per process."""
    return _mb_field(f"/proc/{pid}/smaps_rollup", "Pss:")


def _mb_field(path: str, name: str) -> float | None:
    """A /proc file's ``name`` line (in kB) as MB; None when the process or the line is not there."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(name):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None
