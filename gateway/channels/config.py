"""The ``channels`` section: one block per chat platform the agent is reached on."""

from __future__ import annotations

import hashlib
import os
import re
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from bus.config import Section

REFERENCE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def from_environment(value: str, *, key: str) -> str:
    """``${NAME}`` read from the environment (a secret kept out of the file); anything else as written."""
    found = REFERENCE.match(value.strip())
    if found is None:
        return value
    name = found.group(1)
    if name not in os.environ:
        raise ValueError(f"{key} is ${{{name}}}, but {name} is not set in the environment: export it, "
                         "or write the value itself")
    return os.environ[name]


class TelegramSettings(Section):
    enabled: bool = False
    # From @BotFather; `${NAME}` reads it from the environment variable NAME.
    bot_token: SecretStr = SecretStr("")
    # The Bot API server's root: methods are called at {api_url}/bot{token}/{method}.
    api_url: str = "https://api.telegram.org"
    # Who may talk to the agent: Telegram user ids ("12345") or @usernames. Anyone else gets a
    # one-time pairing code and nothing more, until `pincer channels pair CODE` lets them in.
    allow_from: list[str] = Field(default_factory=list)
    agent: str = Field(default="main", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # In a group, answer only messages that mention the bot or reply to it.
    require_mention: bool = True
    # Seconds a getUpdates long poll waits for news; the connection's own timeout is this plus 15.
    poll_timeout_s: int = Field(default=25, ge=0, le=50)
    # A poll with no answer this long past poll_timeout_s counts as hung: its connection is dropped,
    # and after twice this long the poll is abandoned and the platform's connections made afresh.
    poll_grace_s: float = Field(default=15.0, ge=1, le=120)
    # The answer is streamed by editing one message at most this often (Telegram allows about one a second).
    edit_interval_s: float = Field(default=1.0, ge=0.05, le=30)
    # Files people send are saved in the workspace up to this size (the Bot API serves at most 20 MB).
    max_file_bytes: int = Field(default=20 << 20, ge=1024)
    # No successful poll for this long: the poller is restarted and the channel reported unhealthy.
    stall_s: float = Field(default=90.0, ge=5)
    # How long a stranger's pairing code stays valid.
    pairing_ttl_s: int = Field(default=3600, ge=60)
    # Webhooks instead of polling: the public https URL Telegram posts updates to (a reverse proxy in
    # front of webhook_listen); empty: long polling. Each request must carry the secret token Pincer
    # registers with the webhook (derived from bot_token, the same on every replica).
    webhook_url: str = ""
    webhook_listen: str = Field(default="127.0.0.1:8781", pattern=r"^[^\s:]+:\d{1,5}$")

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, value: str) -> str:
        if value and not re.match(r"^https?://[^/\s]+(/\S*)?$", value):
            raise ValueError(f"webhook_url must be the http(s) URL Telegram posts to, got {value!r}")
        return value

    def webhook_secret(self) -> str:
        """The secret token Telegram sends with each webhook request: derived from the bot's token."""
        seed = ("pincer-telegram-webhook:" + self.bot_token.get_secret_value()).encode()
        return hashlib.sha256(seed).hexdigest()[:48]

    def webhook_path(self) -> str:
        return urlsplit(self.webhook_url).path or "/"

    @field_validator("bot_token", mode="before")
    @classmethod
    def _token_from_environment(cls, value: object) -> object:
        return from_environment(value, key="channels.telegram.bot_token") if isinstance(value, str) else value

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"api_url must be an http(s) URL such as https://api.telegram.org, got {value!r}")
        return value.rstrip("/")

    @field_validator("allow_from")
    @classmethod
    def _allow_from(cls, value: list[str]) -> list[str]:
        for entry in value:
            if not re.match(r"^(\d{1,20}|@[A-Za-z0-9_]{3,64})$", str(entry)):
                raise ValueError(f"allow_from entries are user ids (digits) or @usernames, got {entry!r}")
        return [str(v) for v in value]


class ChannelSettings(Section):
    telegram: TelegramSettings = Field(default_factory=TelegramSettings)

    def enabled(self) -> list[str]:
        """The channels `pincer up` starts."""
        return ["telegram"] if self.telegram.enabled else []
