"""Logging: one line per event, naming the role and instance, with key=value context."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Mapping

_FORMAT = "%(asctime)s %(levelname)-5s %(role)s/%(instance)s %(name)s: %(message)s"


class _Identity(logging.Filter):
    def __init__(self, role: str, instance: str) -> None:
        super().__init__()
        self.role, self.instance = role, instance

    def filter(self, record: logging.LogRecord) -> bool:
        record.role, record.instance = self.role, self.instance
        return True


# Environment variables whose values are credentials (TELEGRAM_BOT_TOKEN, OPENAI_API_KEY, PINCER_..._PASSWORD).
_SECRET_NAME = re.compile(r"(TOKEN|KEY|SECRET|PASSWORD|PASSPHRASE)(_FILE)?$|_(TOKEN|KEY|SECRET|PASSWORD)_")
REDACTED = "[redacted]"


def secrets_in(env: Mapping[str, str]) -> list[str]:
    """The credential values of ``env`` long enough to be told apart from ordinary words, longest first."""
    found = {value for name, value in env.items() if _SECRET_NAME.search(name.upper()) and len(value) >= 8
             and not name.upper().endswith("_FILE")}
    return sorted(found, key=len, reverse=True)


class _Redact(logging.Filter):
    """A credential never reaches a log line: a library that logs a URL with a bot token in its path (as
    python-telegram-bot does at DEBUG) has the token replaced."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(secret in message for secret in self.secrets):
            for secret in self.secrets:
                message = message.replace(secret, REDACTED)
            record.msg, record.args = message, ()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: what log shippers (Vector, Fluent Bit, Loki) read without a parser."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": round(record.created, 3), "level": record.levelname, "role": getattr(record, "role", ""),
                "instance": getattr(record, "instance", ""), "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def setup_logging(role: str, instance: str, level: str = "INFO", *, fmt: str = "text") -> None:
    """Send every log line to stderr, stamped with who wrote it."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_Identity(role, instance))
    handler.addFilter(_Redact(secrets_in(os.environ)))
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Third-party chatter stays out unless something is wrong.
    for noisy in ("httpx", "httpcore", "LiteLLM", "litellm", "uvicorn.access", "openai", "redis", "asyncio",
                  "peewee"):  # peewee: every SQL statement of matrix-nio's key store
        logging.getLogger(noisy).setLevel(logging.WARNING)


def kv(**fields: object) -> str:
    """Context fields for a log line: ``call=ab12 tool=read_file``."""
    return " ".join(f"{k}={v}" for k, v in fields.items() if v not in (None, ""))
