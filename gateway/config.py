"""The ``gateway`` section of the configuration."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, SecretStr

from bus.admission import RateLimits
from bus.settings import Section
from memory.jobs import JobLimits

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
ANY_ADDRESS = ("0.0.0.0", "::", "")


class EventSettings(Section):
    """Each session's live event log (SSE and WebSocket clients read it from any Gateway)."""

    keep: int = Field(default=2000, ge=10, le=1_000_000)  # events kept per session; older ones are trimmed
    keep_s: float = Field(default=86_400.0, ge=60)  # a quiet session's log expires after this
    heartbeat_s: float = Field(default=15.0, gt=0, le=300)  # a comment to idle SSE clients (proxies cut silence)


class LimitSettings(Section):
    # Turns a token may have running at once (over every request kind), and of those, streamed ones.
    open_turns_per_token: int = Field(default=8, ge=1)
    open_streams_per_token: int = Field(default=8, ge=1)
    # Messages a token may send per minute, shared by every Gateway of the pool (a bucket in Redis;
    # a burst of up to `burst` messages may come at once).
    messages_per_minute: int = Field(default=120, ge=1)
    burst: int = Field(default=30, ge=1)
    # Text a token may have the pool store a day (its messages, the history an OpenAI client sends to start
    # a session, a fork's copy), all at once or spread over the day; shared by every Gateway.
    text_mb_per_day: float = Field(default=256.0, gt=0)
    # Messages waiting for a Brain past which new ones are refused (503) rather than queued for ever.
    max_inbox_backlog: int = Field(default=1000, ge=1)
    # A WebSocket or SSE stream is closed after this long (a revoked token ends it at once, whatever this is).
    max_connection_s: float = Field(default=86_400.0, ge=1)
    # Jobs an identity may keep through /v1/cron (`pincer cron`), and how often a chat token's may run.
    jobs: JobLimits = Field(default_factory=JobLimits)

    def rate(self) -> RateLimits:
        """The part every door charges an identity, the scheduler's fires of its jobs included."""
        return RateLimits(messages_per_minute=self.messages_per_minute, burst=self.burst,
                          text_bytes_per_day=max(1, int(self.text_mb_per_day * 2**20)),
                          max_inbox_backlog=self.max_inbox_backlog)


class OpenAISettings(Section):
    # Take the session from the request's `user` field when no session header is sent.
    session_from_user: bool = False
    # A request with no session runs in a fresh one that expires this many seconds after its last turn.
    ephemeral_ttl_s: int = Field(default=3600, ge=60)
    # Tool calls shown to a person reading a plain chat client: one short line each, or nothing.
    show_tools: Literal["inline", "none"] = "inline"


class GatewaySettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8780, ge=1, le=65535)
    turn_timeout_s: float = Field(default=600.0, gt=0)
    # An operator token named `owner` (also PINCER_GATEWAY_TOKEN); more tokens: `pincer token create`.
    token: SecretStr | None = None
    # Host headers answered (besides localhost, 127.0.0.1, ::1 and `host`): names or globs, "*" for any.
    allowed_hosts: list[str] = Field(default_factory=list)
    # Origins (scheme://host[:port]) whose pages may call the API, besides the Gateway's own.
    allowed_origins: list[str] = Field(default_factory=list)
    # Answer CORS preflights for allowed_origins (off: browsers refuse cross-origin calls themselves).
    cors: bool = False
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    # Serve /metrics without a token (for a scraper on a private network); off: an operator token.
    metrics_public: bool = False
    limits: LimitSettings = Field(default_factory=LimitSettings)
    events: EventSettings = Field(default_factory=EventSettings)
    openai: OpenAISettings = Field(default_factory=OpenAISettings)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ANY_ADDRESS else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def loopback_only(self) -> bool:
        """Whether the Gateway listens only where nobody but this machine can reach it."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a name that may resolve to anything

    def hosts(self) -> list[str]:
        """Host header values the Gateway answers (DNS rebinding points a foreign name at us)."""
        own = [] if self.host in ANY_ADDRESS else [self.host]
        return list(dict.fromkeys([*LOOPBACK_HOSTS, *own, *self.allowed_hosts]))

    def static_token(self) -> str | None:
        return (self.token.get_secret_value() if self.token else "") or None
