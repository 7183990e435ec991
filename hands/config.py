"""The ``hands`` section of the configuration."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from bus.config import Section


class ConcurrencySettings(Section):
    global_: int = Field(default=10, ge=1, le=1000, alias="global")
    file: int = Field(default=5, ge=1)
    network: int = Field(default=3, ge=1)
    code: int = Field(default=2, ge=1)
    memory: int = Field(default=8, ge=1)


class HandsSettings(Section):
    workspace: Path = Path("~/.pincer/workspace")
    concurrency: ConcurrencySettings = Field(default_factory=ConcurrencySettings)
    max_result_bytes: int = Field(default=50_000, ge=1_000)
    max_file_bytes: int = Field(default=10 * 1024 * 1024, ge=1)
    default_timeout_s: float = Field(default=30.0, ge=1, le=120)
