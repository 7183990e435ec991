"""The sections every process reads: Redis (where the pool meets), and the runtime (its data, its logs,
heartbeats, traces, scheduled backups and retention), with ``Section``, the base of every package's own
section model. Reading them from the file and the environment is bus/config.py's."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from bus.keys import DEFAULT_PREFIX


def time_zone(value: str, key: str) -> str:
    """``value`` if it names an IANA time zone; else a ValueError saying what ``key`` takes."""
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{key} must be an IANA time zone such as Europe/Berlin or UTC, got {value!r}") from None
    return value


class Section(BaseModel):
    """Base for every section model: unknown keys are typos, so they are errors."""

    model_config = ConfigDict(extra="forbid")


class RedisSettings(Section):
    url: str | None = None  # redis://, rediss:// (TLS: ?ssl_ca_certs=PATH) or unix://
    # Sentinel instead of a URL: the sentinels ("host:port") and the master they watch. Every process
    # asks them where the master is and follows a failover on its own.
    sentinels: list[str] = Field(default_factory=list)
    sentinel_master: str = "mymaster"
    sentinel_password: SecretStr | None = None  # the sentinels' own (their requirepass)
    password: SecretStr | None = None  # the master's, when no URL carries it
    # Every write (a request, a reply, an ack) counts as sent only once this many replicas have it
    # (WAIT after each flush): what a failover promotes then holds every acknowledged call. Short of
    # it, the write fails as if Redis were away and is sent again (calls are deduplicated by id).
    min_replicas: int = Field(default=0, ge=0, le=16)
    replica_timeout_ms: int = Field(default=1000, ge=1, le=60_000)
    prefix: str = DEFAULT_PREFIX
    embedded_port: int = Field(default=0, ge=0, le=65535)
    # The embedded Redis also on this address, for workers on other hosts (`pincer up --listen ADDR`):
    # TLS only, with this certificate and key, and a password kept in <data_dir>/redis.password.
    listen: str | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # Connections one process opens at most; past it, commands wait for one to come free.
    max_connections: int = Field(default=128, ge=4, le=10_000)
    # Request streams are never capped by length (an undelivered request must not be dropped):
    # the reaper trims them below what every group still needs (MINID). These cap the others.
    reply_maxlen: int = Field(default=10_000, ge=100)
    # A reply stream (reply:<instance>, what a turn's events and a tool's results travel on) keeps nothing
    # older than this: entries past it go at the next write, and a stream with no write for this long lapses.
    reply_max_age_s: float = Field(default=3600.0, ge=1)
    dead_maxlen: int = Field(default=10_000, ge=100)
    alerts_maxlen: int = Field(default=1000, ge=10)  # the alerts stream (budget and job alerts)
    # How much memory Redis may use, for the warning in `pincer status`, /readyz and /metrics; None: Redis's
    # own maxmemory (when set). Warned from memory_warn_ratio of it (docs/operations.md, "Redis's memory").
    memory_bound_mb: float | None = Field(default=None, gt=0)
    memory_warn_ratio: float = Field(default=0.8, gt=0, le=1)
    # Taking over work from consumers that died (see bus/reaper.py).
    claim_idle_s: float = Field(default=30.0, gt=0)
    reap_interval_s: float = Field(default=5.0, gt=0)
    max_deliveries: int = Field(default=3, ge=1)
    # On SIGTERM a consumer stops reading and waits this long for what it runs; the rest it
    # hands back (marked idle, so another consumer's reaper takes it at its next pass).
    drain_timeout_s: float = Field(default=30.0, ge=0)


    @field_validator("sentinels")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for address in value:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"sentinel {address!r}: write host:port, e.g. 10.0.0.5:26379")
        return value


class BackupSchedule(Section):
    """``runtime.backup``: `pincer up` takes a `pincer backup` at each instant of ``cron`` (local time)."""

    cron: str = ""  # e.g. "0 3 * * *"; empty: no scheduled backup
    keep: int = Field(default=7, ge=1, le=1000)  # the newest archives kept in ``dir``
    dir: Path | None = None  # None: <data_dir>/backups
    secrets: bool = False  # keep secrets too (--with-secrets)

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        if value:
            from cronsim import CronSim, CronSimError

            try:
                CronSim(value, datetime.now())
            except CronSimError as exc:
                raise ValueError(f"not a cron expression ({exc}); e.g. '0 3 * * *' for 03:00 every day") from None
        return value


class RetentionSettings(Section):
    """``runtime.retention``: how long what Pincer keeps in Redis lives (docs/operations.md, "Retention").
    One Gateway of the pool (a lease) enforces it every ``interval_s``; None: kept for ever."""

    transcript_days: float | None = Field(default=90.0, gt=0)  # idle this long: archived to the data dir
    dead_letter_days: float | None = Field(default=30.0, gt=0)  # dead letters older than this are trimmed
    alert_days: float | None = Field(default=30.0, gt=0)  # alerts older than this are trimmed
    interval_s: float = Field(default=3600.0, ge=1)
    batch: int = Field(default=100, ge=1, le=10_000)  # sessions archived at most per pass


class RuntimeSettings(Section):
    data_dir: Path = Path("~/.pincer")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # text: one readable line per event; json: one JSON object per line, for log shippers.
    log_format: Literal["text", "json"] = "text"
    # Where `pincer up` keeps each role's log (None: <data_dir>/logs), rotated past log_max_mb.
    log_dir: Path | None = None
    log_max_mb: float = Field(default=10.0, gt=0)
    log_backups: int = Field(default=3, ge=0, le=100)
    heartbeat_s: float = Field(default=3.0, gt=0)
    # OpenTelemetry spans (needs the [otel] extra): none, otlp (to otel_endpoint, or the
    # OTEL_EXPORTER_OTLP_* variables) or console (JSON lines to <otel_file>.<role>.<pid>.jsonl).
    otel_exporter: Literal["none", "otlp", "console"] = "none"
    otel_endpoint: str | None = None
    otel_file: str | None = None
    backup: BackupSchedule = Field(default_factory=BackupSchedule)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()

    @property
    def archive_path(self) -> Path:
        """Where idle sessions are archived (memory/archive.py)."""
        return self.data_path / "archive"

    @property
    def logs_path(self) -> Path:
        return Path(self.log_dir).expanduser() if self.log_dir else self.data_path / "logs"
