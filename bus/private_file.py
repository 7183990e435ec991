"""Writing a file only its owner may read, whatever was at its path before (a link, a wider mode)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import IO, Any


def write_private(path: Path, text: str, *, durable: bool = False) -> None:
    """Replace ``path`` whole with ``text``, mode 0600: written aside (``O_EXCL | O_NOFOLLOW``, so a link
    planted there is not followed), then renamed over it (a link at ``path`` is replaced, not written
    through); a reader sees the old file or the new one, never half of one. ``durable``: the file and
    its directory are fsynced before this returns (what is removed elsewhere next must be on disk)."""
    aside = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(aside, path)
        if durable:
            directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
    except BaseException:
        aside.unlink(missing_ok=True)
        raise


def open_private(path: Path, flags: int) -> int:
    """A descriptor of ``path`` that only its owner can read: created 0600, a link planted there never
    followed (``O_NOFOLLOW``: the open fails), a wider mode left by someone narrowed to 0600."""
    fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def append_private(path: Path, *, binary: bool = False, encoding: str | None = "utf-8") -> IO[Any]:
    """``path`` opened to append, as ``open_private`` makes it (logs: what a process wrote is its user's)."""
    fd = open_private(path, os.O_WRONLY | os.O_APPEND)
    return os.fdopen(fd, "ab") if binary else os.fdopen(fd, "a", encoding=encoding, buffering=1)
