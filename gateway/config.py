"""The ``gateway`` section of the configuration."""

from __future__ import annotations

from pydantic import Field

from bus.config import Section


class GatewaySettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8780, ge=1, le=65535)
    turn_timeout_s: float = Field(default=600.0, gt=0)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"
