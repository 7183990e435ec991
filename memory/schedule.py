"""When a job is due: a fixed interval, a cron expression in a time zone (read by cronsim, which follows
cron's own rules across daylight-saving changes) or one instant; and the durations jobs and their limits
are written in (``10s``, ``30m``, ``2h``, ``1d``)."""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError
from pydantic import BaseModel, Field, field_validator, model_validator

from bus.settings import time_zone

DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
MIN_EVERY_S = 1.0


def parse_duration(text: str) -> float:
    """``10s``, ``30m``, ``2h``, ``1d`` in seconds."""
    found = DURATION.match(text.strip())
    if found is None:
        raise ValueError(f"a duration is a number and a unit (s, m, h or d), such as 10s, 30m or 2h; got {text!r}")
    return float(found.group(1)) * UNITS[found.group(2)]


class Schedule(BaseModel):
    """When a job is due: every ``every_s`` seconds, at each ``cron`` instant in ``tz``, or once ``at``."""

    kind: Literal["every", "cron", "at"]
    every_s: float | None = Field(default=None, ge=MIN_EVERY_S)
    cron: str | None = None
    tz: str = "UTC"
    at: float | None = None  # Unix seconds
    anchor: float = 0.0  # an interval counts from here (the job's creation)

    @field_validator("tz")
    @classmethod
    def _tz(cls, value: str) -> str:
        return time_zone(value, "--tz")

    @model_validator(mode="after")
    def _complete(self) -> Schedule:
        needed = {"every": self.every_s, "cron": self.cron, "at": self.at}[self.kind]
        if needed is None:
            raise ValueError(f"a schedule of kind {self.kind} needs its {self.kind} value")
        if self.kind == "cron":
            assert self.cron is not None
            try:
                CronSim(self.cron, datetime.now(ZoneInfo(self.tz)))
            except CronSimError as exc:
                raise ValueError(f"--cron {self.cron!r} is not a cron expression ({exc}); five fields: minute hour "
                                 "day-of-month month day-of-week, such as '0 8 * * 1-5'") from None
        return self

    def next_after(self, moment: float) -> float | None:
        """The first due instant strictly after ``moment`` (None: there is none, a one-off done). Instants are
        whole milliseconds, as the due set keeps them: an instant read back from it is never found again."""
        after = round(moment * 1000)
        if self.kind == "at":
            assert self.at is not None
            at = round(self.at * 1000)
            return at / 1000 if at > after else None
        if self.kind == "every":
            assert self.every_s is not None
            anchor, every = round(self.anchor * 1000), max(1, round(self.every_s * 1000))
            steps = (after - anchor) // every + 1 if after >= anchor else 0
            return (anchor + steps * every) / 1000
        assert self.cron is not None
        zone = ZoneInfo(self.tz)
        # cronsim works in whole minutes: start from the minute of ``moment`` and skip what is not after it.
        start = datetime.fromtimestamp(math.floor(moment), zone).replace(second=0, microsecond=0)
        for instant in CronSim(self.cron, start - timedelta(seconds=1)):
            if round(instant.timestamp() * 1000) > after:
                return instant.timestamp()
        return None  # pragma: no cover  # cronsim's iterator does not end

    def instants(self, after: float, until: float, *, limit: int = 1000) -> list[float]:
        """The due instants in (after, until], at most ``limit``."""
        found: list[float] = []
        moment = after
        while len(found) < limit:
            upcoming = self.next_after(moment)
            if upcoming is None or upcoming > until:
                break
            found.append(upcoming)
            moment = upcoming
        return found

    def period_s(self, moment: float) -> float:
        """How long between this instant's due and the next (one-offs: an hour, for stall reports)."""
        first = self.next_after(moment)
        second = self.next_after(first) if first is not None else None
        return second - first if first is not None and second is not None else 3600.0

    def describe(self) -> str:
        if self.kind == "every":
            return f"every {self.every_s:g}s"
        if self.kind == "cron":
            return f"cron '{self.cron}' ({self.tz})"
        assert self.at is not None
        return f"at {datetime.fromtimestamp(self.at).astimezone().isoformat(timespec='seconds')}"
