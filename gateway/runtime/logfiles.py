"""Each role's log file under ``runtime.log_dir``: written by `pincer up`, rotated by size, read by `pincer logs`."""

from __future__ import annotations

import io
import logging
import re
import sys
import time
from logging.handlers import RotatingFileHandler
from pathlib import Path

from bus.private_file import append_private

ROLE = re.compile(r"^[a-z]+(-\d+)?$")


class PrivateRotatingFile(RotatingFileHandler):
    """A rotated log only its user can read (what a chat said, what a tool printed), never through a link."""

    def _open(self) -> io.TextIOWrapper:
        opened = append_private(Path(self.baseFilename), encoding=self.encoding)
        assert isinstance(opened, io.TextIOWrapper)
        return opened


def private_dir(path: Path) -> Path:
    """A folder for logs: made 0700 (an existing one is left as its owner set it)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


class RoleLog:
    """The lines one child prints, kept in ``<log_dir>/<role>.log`` (rotated past ``max_bytes``)."""

    def __init__(self, log_dir: Path, role: str, *, max_bytes: int, backups: int) -> None:
        private_dir(log_dir)
        self.handler = PrivateRotatingFile(log_dir / f"{role}.log", maxBytes=max_bytes, backupCount=backups,
                                           encoding="utf-8")
        self.handler.setFormatter(logging.Formatter("%(message)s"))

    def write(self, line: str) -> None:
        self.handler.emit(logging.makeLogRecord({"msg": line, "levelno": logging.INFO}))

    def close(self) -> None:
        self.handler.close()


def role_files(log_dir: Path, role: str | None) -> dict[str, Path]:
    """``role -> file`` for the roles asked for (all when None), only those that have written."""
    if role is not None and not ROLE.match(role):
        raise ValueError(f"{role!r} is not a role (gateway, brain, hands-1, supervisor, ...)")
    files = sorted(log_dir.glob("*.log")) if log_dir.is_dir() else []
    found = {f.stem: f for f in files if ROLE.match(f.stem)}
    return {r: f for r, f in found.items() if role is None or r == role}


def show_logs(log_dir: Path, *, role: str | None, lines: int, follow: bool) -> int:
    try:
        files = role_files(log_dir, role)
    except ValueError as exc:
        print(f"pincer: error: {exc}", file=sys.stderr)
        return 2
    if not files:
        print(f"pincer: no logs in {log_dir}" + (f" for {role}" if role else "") + "; has `pincer up` run here?",
              file=sys.stderr)
        return 1
    width = max(len(r) for r in files)
    for name, path in files.items():
        for line in path.read_text(errors="replace").splitlines()[-lines:]:
            print(f"{name:>{width}} | {line}" if len(files) > 1 else line)
    if not follow:
        return 0
    offsets = {name: path.stat().st_size for name, path in files.items()}
    try:
        while True:
            for name, path in role_files(log_dir, role).items():
                offsets.setdefault(name, 0)
                size = path.stat().st_size
                if size < offsets[name]:  # rotated: the file starts again
                    offsets[name] = 0
                if size > offsets[name]:
                    with path.open("rb") as file:
                        file.seek(offsets[name])
                        chunk = file.read()
                    offsets[name] += len(chunk)
                    for line in chunk.decode(errors="replace").splitlines():
                        print(f"{name:>{width}} | {line}" if role is None else line, flush=True)
            time.sleep(0.25)
    except KeyboardInterrupt:
        return 0
