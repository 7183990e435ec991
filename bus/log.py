"""Logging: one line per event, naming the role and instance, with key=value context."""

from __future__ import annotations

import logging
import sys

_FORMAT = "%(asctime)s %(levelname)-5s %(role)s/%(instance)s %(name)s: %(message)s"


class _Identity(logging.Filter):
    def __init__(self, role: str, instance: str) -> None:
        super().__init__()
        self.role, self.instance = role, instance

    def filter(self, record: logging.LogRecord) -> bool:
        record.role, record.instance = self.role, self.instance
        return True


def setup_logging(role: str, instance: str, level: str = "INFO") -> None:
    """Send every log line to stderr, stamped with who wrote it."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_Identity(role, instance))
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Third-party chatter stays out unless something is wrong.
    for noisy in ("httpx", "httpcore", "LiteLLM", "litellm", "uvicorn.access", "openai", "redis", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def kv(**fields: object) -> str:
    """Context fields for a log line: ``call=ab12 tool=read_file``."""
    return " ".join(f"{k}={v}" for k, v in fields.items() if v not in (None, ""))
