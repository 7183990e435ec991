"""The ``channels`` section: one block per chat platform the agent is reached on."""

from __future__ import annotations

import hashlib
import re
from typing import ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, TypeAdapter, ValidationError, ValidationInfo, field_validator, model_validator

from bus.config import from_environment
from bus.settings import Section


def http_url(value: str, key: str, example: str) -> str:
    if not re.match(r"^https?://[^/\s]+", value):
        raise ValueError(f"{key} must be an http(s) URL such as {example}, got {value!r}")
    return value


class ChannelCommon(Section):
    """What every channel has: who may talk, to which agent, and how patiently the platform is read."""

    enabled: bool = False
    # Who may talk to the agent (each platform's own form of a user, see its page in docs/channels/). Anyone
    # else gets a one-time pairing code and nothing more, until `pincer channels pair CODE` lets them in.
    allow_from: list[str] = Field(default_factory=list)
    agent: str = Field(default="main", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # In a group, answer only messages that mention the bot or reply to it.
    require_mention: bool = True
    # Seconds one long poll waits for news; the connection's own timeout is this plus poll_grace_s.
    poll_timeout_s: int = Field(default=25, ge=0, le=50)
    # A poll with no answer this long past poll_timeout_s counts as hung: its connection is dropped,
    # and after twice this long the poll is abandoned and the platform's connections made afresh.
    poll_grace_s: float = Field(default=15.0, ge=1, le=120)
    # The answer is streamed by editing one message at most this often (platforms rate-limit edits).
    edit_interval_s: float = Field(default=1.0, ge=0.05, le=30)
    # Files people send are saved in their own workspace up to this size, and at most this many a day
    # per person (over every channel; a file past either is not fetched, and the agent is told).
    max_file_bytes: int = Field(default=20 << 20, ge=1024)
    max_files_per_day: int = Field(default=100, ge=0)
    # No successful poll for this long: the poller is restarted and the channel reported unhealthy.
    stall_s: float = Field(default=90.0, ge=5)
    # How long a stranger's pairing code stays valid.
    pairing_ttl_s: int = Field(default=3600, ge=60)

    # The form allow_from entries take on this platform, and how to say it.
    ALLOW: ClassVar[re.Pattern[str]] = re.compile(r"^\S{1,256}$")
    ALLOW_FORM: ClassVar[str] = "user ids"
    NAME: ClassVar[str] = ""
    # The module of the platform's calls (imported only by the channel that uses it: its ``platform``
    # function opens one), and where a person finds what to fill in.
    MODULE: ClassVar[str] = ""
    HINT: ClassVar[str] = ""
    # Fields that are secrets (`${NAME}` reads one from the environment variable NAME): handed to the
    # channel's process alone, as its own settings.
    SECRETS: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _secrets_from_environment(cls, data: object) -> object:
        if isinstance(data, dict):
            data = dict(data)
            for name in cls.SECRETS:
                if isinstance(data.get(name), str):
                    data[name] = from_environment(data[name], key=f"channels.{cls.NAME}.{name}",
                                                  process="the channel")
        return data

    @field_validator("allow_from")
    @classmethod
    def _allow_from(cls, value: list[str]) -> list[str]:
        for entry in value:
            if not cls.ALLOW.match(str(entry)):
                raise ValueError(f"allow_from entries are {cls.ALLOW_FORM}, got {entry!r}")
        return [str(v) for v in value]

    def missing(self) -> list[str]:
        """The settings an enabled channel cannot run without."""
        return []

    def secrets(self) -> dict[str, str]:
        """Each secret field's value (``${NAME}`` already read from the environment)."""
        found = {}
        for name in self.SECRETS:
            value = getattr(self, name)
            found[name] = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        return found


class TelegramSettings(ChannelCommon):
    NAME = "telegram"
    MODULE, HINT = "gateway.channels.telegram", "@BotFather gives a bot its token"
    ALLOW = re.compile(r"^(\d{1,20}|@[A-Za-z0-9_]{3,64})$")
    ALLOW_FORM = "user ids (digits) or @usernames"
    SECRETS = ("bot_token",)

    # From @BotFather; `${NAME}` reads it from the environment variable NAME.
    bot_token: SecretStr = SecretStr("")
    # The Bot API server's root: methods are called at {api_url}/bot{token}/{method}.
    api_url: str = "https://api.telegram.org"
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

    def missing(self) -> list[str]:
        return [] if self.bot_token.get_secret_value() else ["bot_token"]

    def webhook_secret(self) -> str:
        """The secret token Telegram sends with each webhook request: derived from the bot's token."""
        seed = ("pincer-telegram-webhook:" + self.bot_token.get_secret_value()).encode()
        return hashlib.sha256(seed).hexdigest()[:48]

    def webhook_path(self) -> str:
        return urlsplit(self.webhook_url).path or "/"

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str) -> str:
        return http_url(value, "api_url", "https://api.telegram.org").rstrip("/")


class EmailSettings(ChannelCommon):
    """A mailbox the agent reads by IMAP (IDLE) and answers from by SMTP."""

    NAME = "email"
    MODULE, HINT = "gateway.channels.mail", "see docs/channels/email.md"
    ALLOW = re.compile(r"^([^@\s]+@|@)[A-Za-z0-9.-]+\.[A-Za-z0-9-]+$")
    ALLOW_FORM = "email addresses (alice@example.com), or a whole domain written @example.com"
    SECRETS = ("password",)

    imap_host: str = ""
    imap_port: int = Field(default=993, ge=1, le=65535)
    smtp_host: str = ""
    smtp_port: int = Field(default=465, ge=1, le=65535)
    username: str = ""
    password: SecretStr = SecretStr("")
    # ssl: TLS from the first byte (IMAP 993, SMTP 465); starttls: upgraded after connecting (IMAP 143,
    # SMTP 587); none: plain text, allowed only to a server on this machine (loopback).
    tls: Literal["ssl", "starttls", "none"] = "ssl"
    address: str = ""  # the agent's own address: what its answers come from
    mailbox: str = "INBOX"
    # A mail over this size (attachments included) is answered with a refusal, not read.
    max_message_bytes: int = Field(default=25 << 20, ge=1024)
    # A PEM bundle of certificate authorities to trust besides the system's (a server with a private CA).
    ca_file: str = ""
    # A From line is easily forged, so an enabled channel needs one of these two. authserv_id: mail is read
    # only if the receiving server of this name (the first word of its Authentication-Results header, e.g.
    # mx.example.com), in the topmost header it wrote, proved the From domain: DMARC passed with
    # header.from that domain, or a DKIM signature of that domain verified. trust_from_header: true takes
    # From as written (anyone who knows an allowed address can write as them): only for a mailbox no
    # stranger's mail reaches.
    trust_from_header: bool = False
    authserv_id: str = Field(default="", validate_default=True)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if value and not re.match(r"^[^@\s<>]+@[^@\s<>]+$", value):
            raise ValueError(f"address must be the agent's own address, such as agent@example.com, got {value!r}")
        return value

    @field_validator("authserv_id")
    @classmethod
    def _from_proven(cls, value: str, info: ValidationInfo) -> str:
        value = value.strip()
        # Pairing admits an address as allow_from does: without a proof either lets a forger in.
        if info.data.get("enabled") and not value and not info.data.get("trust_from_header"):
            raise ValueError("an enabled email channel believes a From line only if a server proved it: set "
                             "authserv_id to the name your receiving server writes first in its "
                             "Authentication-Results header (e.g. mx.example.com), or set trust_from_header: true "
                             "to accept that anyone may write as an allowed address (docs/channels/email.md)")
        if value and not re.match(r"^[^\s;()\"]{1,255}$", value):
            raise ValueError(f"authserv_id is one word, the server's name (mx.example.com), got {value!r}")
        return value

    @model_validator(mode="after")
    def _plain_only_on_loopback(self) -> EmailSettings:
        if self.tls == "none":
            for host in (self.imap_host, self.smtp_host):
                if host and host not in LOOPBACK:
                    raise ValueError(f"tls: none sends the password in the clear, so it is allowed only for a "
                                     f"server on this machine (127.0.0.1, ::1, localhost), not {host!r}: use "
                                     "tls: ssl or starttls")
        return self

    def missing(self) -> list[str]:
        """The settings an enabled email channel cannot run without."""
        return [name for name in ("imap_host", "smtp_host", "username", "address")
                if not getattr(self, name)] + ([] if self.password.get_secret_value() else ["password"])


LOOPBACK = ("127.0.0.1", "::1", "localhost")


class SlackSettings(ChannelCommon):
    """A Slack app's bot, reached by Socket Mode (no public address needed)."""

    NAME = "slack"
    MODULE, HINT = "gateway.channels.slack", "see docs/channels/slack.md"
    ALLOW = re.compile(r"^[UW][A-Z0-9]{2,20}$")
    ALLOW_FORM = "Slack member ids (U0123ABCD: a profile's ⋮ menu, Copy member ID)"
    SECRETS = ("bot_token", "app_token", "signing_secret")

    # The bot's token (xoxb-...), from the app's OAuth & Permissions page.
    bot_token: SecretStr = SecretStr("")
    # An app-level token with the connections:write scope (xapp-...): Socket Mode.
    app_token: SecretStr = SecretStr("")
    # The Events API over HTTP instead of Socket Mode: the public https URL set as the app's Request URL
    # (events and interactivity both; a reverse proxy in front of events_listen), and the app's signing
    # secret, which every request must be signed with.
    events_url: str = ""
    events_listen: str = Field(default="127.0.0.1:8782", pattern=r"^[^\s:]+:\d{1,5}$")
    signing_secret: SecretStr = SecretStr("")
    # The Web API's root (a test server, or a Slack Enterprise Grid's own).
    api_url: str = "https://slack.com/api/"
    # The hosts the bot's token may be shown to when a file people sent is fetched.
    file_hosts: list[str] = Field(default_factory=lambda: ["files.slack.com"])

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str) -> str:
        return http_url(value, "api_url", "https://slack.com/api/").rstrip("/") + "/"

    @field_validator("events_url")
    @classmethod
    def _events_url(cls, value: str) -> str:
        return http_url(value, "events_url", "https://agent.example.com/slack/events") if value else value

    def missing(self) -> list[str]:
        needed = ("bot_token", "signing_secret") if self.events_url else ("bot_token", "app_token")
        return [name for name in needed if not getattr(self, name).get_secret_value()]


class MatrixSettings(ChannelCommon):
    """A Matrix account the agent uses, on any homeserver."""

    NAME = "matrix"
    MODULE, HINT = "gateway.channels.matrix", "see docs/channels/matrix.md"
    ALLOW = re.compile(r"^@[^:\s]{1,255}:[^\s]{1,255}$")
    ALLOW_FORM = "Matrix user ids (@alice:example.org)"
    SECRETS = ("access_token", "store_key")

    # The homeserver's client API root (https://matrix.example.org).
    homeserver: str = ""
    # The bot's account (@pincer:example.org) and an access token for it (see docs/channels/matrix.md).
    user_id: str = ""
    access_token: SecretStr = SecretStr("")
    # Answers longer than this are sent as several messages.
    max_message_chars: int = Field(default=16_000, ge=500, le=60_000)
    # Events one sync brings per room; what a busier room had since is read back page by page.
    sync_timeline_limit: int = Field(default=100, ge=1, le=1000)
    # Read and write end-to-end encrypted rooms. The device's keys live in store_dir, so one channel
    # process holds them: a second one with encryption on waits for it, then refuses to start.
    encryption: bool = False
    # Where the device's keys are kept (default: <runtime.data_dir>/matrix). Back it up: losing it
    # loses the history of encrypted rooms, and people see a new device.
    store_dir: str = ""
    # Encrypts the keys at rest in store_dir (`${NAME}` from the environment); empty: a random key of this
    # install's, made once and kept in <store_dir>.key (0600), beside the store, not in it.
    store_key: SecretStr = SecretStr("")

    @field_validator("homeserver")
    @classmethod
    def _homeserver(cls, value: str) -> str:
        return http_url(value, "homeserver", "https://matrix.example.org").rstrip("/") if value else value

    @field_validator("user_id")
    @classmethod
    def _user_id(cls, value: str) -> str:
        if value and not cls.ALLOW.match(value):
            raise ValueError(f"user_id must be the bot's Matrix id, such as @pincer:example.org, got {value!r}")
        return value

    def missing(self) -> list[str]:
        return [name for name in ("homeserver", "user_id") if not getattr(self, name)] + \
            ([] if self.access_token.get_secret_value() else ["access_token"])


class DiscordSettings(ChannelCommon):
    """A Discord application's bot, on the gateway connection."""

    NAME = "discord"
    MODULE, HINT = "gateway.channels.discord_bot", "see docs/channels/discord.md"
    ALLOW = re.compile(r"^(\d{15,21}|@[A-Za-z0-9_.]{2,32})$")
    ALLOW_FORM = "Discord user ids (digits: Developer Mode, Copy User ID) or @usernames"
    SECRETS = ("bot_token",)

    # The bot's token, from the application's Bot page.
    bot_token: SecretStr = SecretStr("")
    # The REST API's root (a test server's; the gateway's address is asked of it).
    api_url: str = "https://discord.com/api/v10"
    # The hosts files people post may be fetched from.
    file_hosts: list[str] = Field(default_factory=lambda: ["cdn.discordapp.com", "media.discordapp.net"])

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str) -> str:
        return http_url(value, "api_url", "https://discord.com/api/v10").rstrip("/")

    def missing(self) -> list[str]:
        return [] if self.bot_token.get_secret_value() else ["bot_token"]


class ChannelSettings(Section):
    """Every platform, one field each: a new one is its settings class here and its module of calls."""

    telegram: TelegramSettings = Field(default_factory=TelegramSettings)
    email: EmailSettings = Field(default_factory=EmailSettings)
    slack: SlackSettings = Field(default_factory=SlackSettings)
    discord: DiscordSettings = Field(default_factory=DiscordSettings)
    matrix: MatrixSettings = Field(default_factory=MatrixSettings)

    def enabled(self) -> list[str]:
        """The channels `pincer up` starts."""
        return [name for name in KNOWN if self.of(name).enabled]

    def of(self, name: str) -> ChannelCommon:
        found: ChannelCommon = getattr(self, name)
        return found


KNOWN = ("telegram", "slack", "discord", "matrix", "email")  # the order `pincer channels` lists them in


def enabled_names(raw: object) -> list[str]:
    """The channels switched on in a configuration's ``channels`` section, read without validating their
    settings: a Gateway is never handed a channel's token, so it must not resolve its ``${NAME}``."""
    section = raw if isinstance(raw, dict) else {}
    switched = TypeAdapter(bool)
    on = []
    for name in KNOWN:
        settings = section.get(name)
        if isinstance(settings, dict):
            try:
                if switched.validate_python(settings.get("enabled", False)):
                    on.append(name)
            except ValidationError:
                continue  # the channel's own process says what is wrong with it
    return on
