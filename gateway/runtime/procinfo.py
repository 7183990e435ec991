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
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None
