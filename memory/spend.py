"""The pool's spend as it is counted: the budgets' settings, which budgets a call counts in, and what was
spent, read back per scope and per day (`pincer budget` and the Gateway's ``/v1/spend`` read it here; the
Brain's governor in ``brain.spend`` writes it).

Each budget is one hash per scope (``pool``, ``agent:ID``, ``identity:NAME``, ``job:ID``) and period
(``day:YYYY-MM-DD``, ``month:YYYY-MM``), amounts in integer micro-dollars. A day's hash is kept
``DAY_KEEP_S`` after its last call, so the last ``HISTORY_DAYS`` days can always be read back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bus.settings import Section, time_zone
from memory.jobs import Job, JobStore

if TYPE_CHECKING:  # only named: the Brain's settings import BudgetSettings, `pincer up` among them
    from bus.streams import Bus

MICRO = 1_000_000  # micro-dollars per dollar
DAY_KEEP_S = 40 * 86_400
MONTH_KEEP_S = 400 * 86_400
HISTORY_DAYS = 31  # the most days ``daily`` reads back (each day's hash outlives it by DAY_KEEP_S)


class LimitSettings(Section):
    """Spend limits over a calendar day and month (None: no limit)."""

    daily_usd: float | None = Field(default=None, ge=0)
    monthly_usd: float | None = Field(default=None, ge=0)


class BudgetSettings(Section):
    """The spend governor: limits over the pool, each agent and each identity, checked before every call."""

    daily_usd: float | None = Field(default=None, ge=0)  # the whole pool's
    monthly_usd: float | None = Field(default=None, ge=0)
    agents: dict[str, LimitSettings] = Field(default_factory=dict)  # by agent id
    identities: dict[str, LimitSettings] = Field(default_factory=dict)  # by identity name
    per_identity: LimitSettings = Field(default_factory=LimitSettings)  # every identity not named above
    # Shares of a limit at which the owner is told, each once per limit and period.
    alerts: list[float] = Field(default_factory=lambda: [0.5, 0.8, 1.0])
    # Chats the alerts are also sent to, as CHANNEL:CHAT (telegram:123456789).
    notify: list[str] = Field(default_factory=list)
    # Where a day and a month begin (an IANA zone).
    timezone: str = "UTC"
    # The most one call may write when a limit applies (sent to the provider as max_tokens): with the
    # prompt's size it bounds what the call can cost before it is made.
    max_output_tokens: int = Field(default=4096, ge=16, le=1_000_000)

    @field_validator("alerts")
    @classmethod
    def _alerts(cls, value: list[float]) -> list[float]:
        if any(not 0 < share <= 1 for share in value):
            raise ValueError(f"alerts are shares of a limit between 0 and 1 (0.5 is half), got {value}")
        return sorted(set(value))

    @field_validator("notify")
    @classmethod
    def _notify(cls, value: list[str]) -> list[str]:
        for target in value:
            if not all(target.partition(":")[::2]):
                raise ValueError(f"notify entries are CHANNEL:CHAT, such as telegram:123456789, got {target!r}")
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        return time_zone(value, "timezone")

    def limited(self) -> bool:
        """Whether any limit is set (only then is a call's cost bound reserved before it is made)."""
        groups: list[BudgetSettings | LimitSettings] = [self, self.per_identity, *self.agents.values(),
                                                         *self.identities.values()]
        return any(group.daily_usd is not None or group.monthly_usd is not None for group in groups)


class SpendView(BaseModel):
    """What a reader of the spend needs of the ``brain`` section (its budgets and agents), the rest ignored:
    the Gateway reads it without the Brain's settings."""

    model_config = ConfigDict(extra="ignore")

    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    agents: dict[str, Any] = Field(default_factory=dict)

    def agent_ids(self) -> list[str]:
        return sorted({"main", *self.agents})


@dataclass(frozen=True)
class Budget:
    name: str  # as its setting: brain.budget.agents.main.daily_usd
    what: str  # as people say it: "the agent main's day"
    key: str
    limit: int  # micro-dollars; -1: none (only counted)
    keep_s: int
    scope: str = ""  # pool, agent:<id>, identity:<name>
    period: str = ""  # day:2026-12-01, month:2026-12


def budgets_of(bus: Bus, budget: BudgetSettings, now: datetime, agent: str, identity: str,
               job: Job | None = None) -> list[Budget]:
    """Every budget a call of ``agent`` for ``identity`` (and ``job``) counts in at ``now`` (in the budget's
    zone), limited or only counted, day and month."""
    day, month = f"day:{now:%Y-%m-%d}", f"month:{now:%Y-%m}"
    named = budget.identities.get(identity)
    groups: list[tuple[str, str, str, LimitSettings]] = [
        ("pool", "brain.budget", "the pool's", LimitSettings(daily_usd=budget.daily_usd,
                                                            monthly_usd=budget.monthly_usd)),
        (f"agent:{agent}", f"brain.budget.agents.{agent}", f"the agent {agent}'s",
         budget.agents.get(agent) or LimitSettings()),
        (f"identity:{identity}",
         f"brain.budget.identities.{identity}" if named else "brain.budget.per_identity",
         f"{identity}'s", named or budget.per_identity)]
    if job is not None:
        groups.append((f"job:{job.id}", f"the job {job.id}", f"the job {job.id}'s",
                       LimitSettings(daily_usd=job.daily_usd)))
    found = []
    for scope, setting, whose, limits in groups:
        for period, field_name, word, usd, keep in ((day, "daily_usd", "day", limits.daily_usd, DAY_KEEP_S),
                                                    (month, "monthly_usd", "month", limits.monthly_usd,
                                                     MONTH_KEEP_S)):
            named_as = f"{setting}.{field_name}" if job is None or scope != f"job:{job.id}" else \
                f"the daily_usd of {setting} (pincer cron add --daily-usd)"
            found.append(Budget(name=named_as, what=f"{whose} {word}", key=bus.keys.spend(period, scope),
                                limit=-1 if usd is None else round(usd * MICRO), keep_s=keep,
                                scope=scope, period=period))
    return found


def hit_rate(cached_tokens: float, prompt_tokens: float) -> float | None:
    """The share of prompt tokens the provider read from its cache (None: no prompt tokens counted)."""
    return round(cached_tokens / prompt_tokens, 4) if prompt_tokens else None


def _visible(scope: str, only: str | None) -> bool:
    return only is None or scope == only


async def report(bus: Bus, budget: BudgetSettings, agents: list[str], *, clock: Any = time.time,
                 only: str | None = None) -> dict[str, Any]:
    """What `pincer budget` shows: this day's and month's spend per scope (the pool, every agent and identity
    that spent or has a limit), what is left of each limit, and the latest alerts. ``only`` (a scope such as
    ``identity:alice``): that scope's rows and alerts alone, in the same shape."""
    zone = ZoneInfo(budget.timezone)
    scopes = {"pool", *(f"agent:{a}" for a in {"main", *agents, *budget.agents}),
              *(f"identity:{i}" for i in budget.identities)}
    if only is not None:
        scopes = {only}
    now = datetime.fromtimestamp(clock(), zone)
    for period in (f"day:{now:%Y-%m-%d}", f"month:{now:%Y-%m}"):
        prefix = bus.keys.spend(period, "")
        async for key in bus.redis.scan_iter(match=f"{prefix}*", count=500):
            scopes.add(key.decode().removeprefix(prefix))
    jobs = JobStore(bus)
    rows = []
    for scope in sorted((s for s in scopes if _visible(s, only)), key=lambda s: (s != "pool", s)):
        kind, _, name = scope.partition(":")
        job = await jobs.get(name) if kind == "job" else None
        for found in budgets_of(bus, budget, now, name if kind == "agent" else "-",
                                name if kind == "identity" else "-", job):
            if found.scope != scope:
                continue
            raw: dict[bytes, bytes] = await bus.redis.hgetall(found.key)  # type: ignore[assignment]  # bytes
            got = {k.decode(): int(v) for k, v in raw.items() if not k.startswith(b"alerted:")}
            limit = None if found.limit < 0 else found.limit / MICRO
            spent = got.get("spent", 0) / MICRO
            rows.append({"scope": scope, "period": found.period,
                         "budget": found.name, "spent_usd": round(spent, 6),
                         "held_usd": round(got.get("held", 0) / MICRO, 6), "limit_usd": limit,
                         "left_usd": None if limit is None else round(max(0.0, limit - spent), 6),
                         "calls": got.get("calls", 0), "input_tokens": got.get("input_tokens", 0),
                         "output_tokens": got.get("output_tokens", 0), "cached_tokens": got.get("cached_tokens", 0),
                         "cache_hit": hit_rate(got.get("cached_tokens", 0), got.get("input_tokens", 0)),
                         "models": {k.removeprefix("model:"): v / MICRO for k, v in got.items()
                                    if k.startswith("model:")}})
    alerts: list[tuple[bytes, dict[bytes, bytes]]] = await bus.redis.xrevrange(  # type: ignore[assignment]  # bytes
        bus.keys.alerts, count=200 if only else 20)
    told = [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in alerts]
    # An alert names its scope (older ones do not, and are shown to operators alone).
    told = [a for a in told if only is None or a.get("scope") == only][:20]
    return {"timezone": budget.timezone, "budgets": rows, "alerts": told}


async def daily(bus: Bus, budget: BudgetSettings, days: int, *, clock: Any = time.time,
                only: str | None = None) -> list[dict[str, Any]]:
    """What each scope spent on each of the last ``days`` days (today the last), oldest first, a day without
    spend at 0: ``[{"scope", "days": [{"day", "spent_usd", "calls"}]}]``, the pool first. ``only``: that
    scope's alone (listed even when it spent nothing)."""
    zone = ZoneInfo(budget.timezone)
    today = datetime.fromtimestamp(clock(), zone).date()
    dates = [f"{today - timedelta(days=back):%Y-%m-%d}" for back in range(days - 1, -1, -1)]
    scopes: set[str] = {"pool"} if only is None else {only}
    if only is None:
        for date in dates:
            prefix = bus.keys.spend(f"day:{date}", "")
            async for key in bus.redis.scan_iter(match=f"{prefix}*", count=500):
                scopes.add(key.decode().removeprefix(prefix))
    series = []
    for scope in sorted(scopes, key=lambda s: (s != "pool", s)):
        async with bus.redis.pipeline(transaction=False) as pipe:
            for date in dates:
                pipe.hmget(bus.keys.spend(f"day:{date}", scope), ["spent", "calls"])
            found: list[list[bytes | None]] = await pipe.execute()
        series.append({"scope": scope, "days": [
            {"day": date, "spent_usd": round(int(spent or 0) / MICRO, 6), "calls": int(calls or 0)}
            for date, (spent, calls) in zip(dates, found, strict=True)]})
    return series
