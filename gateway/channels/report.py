"""What a channel replica reports of itself in its heartbeat (``pincer channels`` shows it)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Progress:
    """What a replica reports of itself in its heartbeat: whether it takes updates, when it last did, counts."""

    counts: dict[str, int] = field(default_factory=lambda: {"in": 0, "out": 0, "errors": 0})
    polling: bool = False
    last: float = 0.0  # wall clock of the last successful poll (or webhook check)
    last_error: str = ""

    def failed(self, exc: BaseException) -> None:
        self.counts["errors"] += 1
        self.last_error = f"{time.strftime('%H:%M:%S')} {exc}"
