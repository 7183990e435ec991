"""Writing a file only its owner may read, whatever was at its path before (a link, a wider mode)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` whole with ``text``, mode 0600: written aside (``O_EXCL | O_NOFOLLOW``, so a link
    planted there is not followed), then renamed over it (a link at ``path`` is replaced, not written
    through); a reader sees the old file or the new one, never half of one."""
    aside = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(aside, path)
    except BaseException:
        aside.unlink(missing_ok=True)
        raise
