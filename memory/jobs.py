"""Scheduled jobs: what each job is, when it is next due, and a record of every due instant, in Redis.

A job belongs to the identity that made it (its id is ``<owner>/<name>``, as a session's is) and runs
as that identity, in a session of its own unless it names one. Its schedule is a fixed interval
(``every``), a cron expression in a time zone (``cron``, read by cronsim, which follows cron's own
rules across daylight-saving changes) or one instant (``at``). The due set is a sorted set of job ids
scored by their next due instant (whole milliseconds, so a claim compares it exactly); the Brains'
scheduler (brain/scheduler.py) claims each instant once and ends it recorded here as fired, skipped,
missed or failed, never silently.
"""

from __future__ import annotations

import json
import math
import re
import time
from datetime import datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError
from pydantic import BaseModel, Field, field_validator, model_validator

from bus.codec import encode
from bus.config import time_zone
from bus.protocol import ChatMessage
from bus.streams import Bus

JOB_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
MIN_EVERY_S = 1.0
RUNS_KEPT = 500  # records kept per job (the oldest dropped)
SILENT = "HEARTBEAT_OK"  # a heartbeat's answer that means "nothing to report": recorded, not delivered
# What a non-operator identity may schedule (through /v1/cron, or the agent's schedule tool for a sender
# who is not an owner): this many jobs, none more often than this.
GUEST_MAX_JOBS = 20
GUEST_MIN_EVERY_S = 60.0
TURN_KEEP_S = 7 * 86_400
# KEYS: jobs, due set. ARGV: job id, definition, first due (ms; '' when paused). The job and its first due
# instant at once (0: a job of that id exists).
ADD = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
if ARGV[3] ~= '' then redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1]) end
return 1
"""  # how long a job's turn waits for its outcome to be recorded
CatchUp = Literal["run_once", "skip", "all"]
Status = Literal["fired", "skipped", "missed", "failed"]


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


class Job(BaseModel):
    name: str
    owner: str
    agent: str = Field(default="main", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    schedule: Schedule
    message: str = Field(min_length=1, max_length=32_000)
    session: str = ""  # the session's name under the owner; "": cron-<name>
    deliver: list[str] = Field(default_factory=list)  # channel:chat targets the answer is sent to
    catch_up: CatchUp = "run_once"
    window_s: float = Field(default=3600.0, gt=0)  # catch_up "all": missed instants this recent are run
    paused: bool = False
    created_at: float = Field(default_factory=time.time)
    daily_usd: float | None = Field(default=None, ge=0)  # its own spend limit per day (brain.budget's governor)
    # A heartbeat (brain.heartbeats): kept in step with the config by the scheduler, silent when its
    # answer is HEARTBEAT_OK, and skipped while its owner has not talked to the agent for idle_after_s.
    heartbeat: bool = False
    idle_after_s: float | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not JOB_NAME.match(value):
            raise ValueError(f"a job's name is lowercase letters, digits, _ and - (at most 64), got {value!r}")
        return value

    @field_validator("deliver")
    @classmethod
    def _deliver(cls, value: list[str]) -> list[str]:
        for target in value:
            channel, _, chat = target.partition(":")
            if not channel or not chat:
                raise ValueError(f"--deliver is CHANNEL:CHAT, such as telegram:123456789, got {target!r}")
        return value

    @property
    def id(self) -> str:
        return f"{self.owner}/{self.name}"

    @property
    def session_id(self) -> str:
        return f"{self.owner}/{self.session or 'cron-' + self.name}"

    def turn(self, *, reply_to: str = "") -> ChatMessage:
        """The chat message one run of the job sends (answered on ``reply_to``, the jobs' results stream)."""
        return ChatMessage(session_id=self.session_id, agent_id=self.agent, sender=self.owner, text=self.message,
                           reply_to=reply_to, job=self.id)


class Run(BaseModel):
    """One due instant of a job, as it ended."""

    job: str
    due: float
    status: Status
    reason: str = ""
    fired_at: float | None = None
    turn: str = ""  # the chat message id of the turn it started
    outcome: str = ""  # "ok", or the turn's error code, once it has ended
    answer: str = ""  # the start of the turn's answer (or its error message)
    ended_at: float | None = None


class JobExists(Exception):
    pass


def guest_refusal(job: Job, existing: int) -> str | None:
    """Why an identity that is not an operator may not keep this job (None: it may)."""
    if existing >= GUEST_MAX_JOBS:
        return f"this identity already has {GUEST_MAX_JOBS} jobs, the most it may keep; remove one first"
    if job.schedule.period_s(time.time()) < GUEST_MIN_EVERY_S:
        return f"a job may run every {GUEST_MIN_EVERY_S:g}s at most often for this identity (an operator may go below)"
    foreign = [target for target in job.deliver if target != job.owner]
    if foreign:
        return (f"only an operator may deliver to {foreign[0]}: an identity may deliver only to its own chat "
                f"({job.owner})")
    return None


class JobStore:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.keys = bus.keys
        self._add = bus.redis.register_script(ADD)

    async def add(self, job: Job, *, now: float | None = None) -> float | None:
        """Store a new job and its first due instant (None: an ``at`` already past, not stored)."""
        first = job.schedule.next_after((now or time.time()) - 0.001)
        if first is None:
            raise ValueError(f"{job.schedule.describe()} is in the past: nothing would ever run")
        due = "" if job.paused else round(first * 1000)
        if not await self._add(keys=[self.keys.jobs, self.keys.jobs_due], args=[job.id, job.model_dump_json(), due]):
            raise JobExists(f"a job named {job.name!r} already exists; remove it first (pincer cron rm {job.name})")
        return first

    async def replace(self, job: Job, *, now: float | None = None) -> None:
        """Store ``job`` in place of the one with its id (its records kept), due from now on."""
        first = job.schedule.next_after(now or time.time())
        async with self.bus.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.jobs, job.id, job.model_dump_json())
            if first is None or job.paused:
                pipe.zrem(self.keys.jobs_due, job.id)
            else:
                pipe.zadd(self.keys.jobs_due, {job.id: round(first * 1000)})
            await pipe.execute()

    async def get(self, job_id: str) -> Job | None:
        raw = await self.bus.redis.hget(self.keys.jobs, job_id)
        return Job.model_validate_json(raw) if raw else None

    async def many(self, job_ids: list[str]) -> list[Job | None]:
        """Several jobs in one round trip (None where one is gone)."""
        if not job_ids:
            return []
        raw: list[bytes | None] = await self.bus.redis.hmget(self.keys.jobs, job_ids)  # type: ignore[assignment]
        return [Job.model_validate_json(value) if value else None for value in raw]

    async def all(self, owner: str | None = None) -> list[Job]:
        raw: dict[bytes, bytes] = await self.bus.redis.hgetall(self.keys.jobs)  # type: ignore[assignment]
        jobs = [Job.model_validate_json(value) for value in raw.values()]
        return sorted((j for j in jobs if owner is None or j.owner == owner), key=lambda j: j.id)

    async def next_due(self, job_id: str) -> float | None:
        score = await self.bus.redis.zscore(self.keys.jobs_due, job_id)
        return float(score) / 1000 if score is not None else None

    async def set_paused(self, job: Job, paused: bool, *, now: float | None = None) -> Job:
        """Pause (its due instant dropped: nothing is recorded while paused) or resume (due from now on)."""
        job = job.model_copy(update={"paused": paused})
        await self.bus.redis.hset(self.keys.jobs, job.id, job.model_dump_json())
        if paused:
            await self.bus.redis.zrem(self.keys.jobs_due, job.id)
        elif (upcoming := job.schedule.next_after(now or time.time())) is not None:
            await self.bus.redis.zadd(self.keys.jobs_due, {job.id: round(upcoming * 1000)})
        return job

    async def remove(self, job_id: str) -> bool:
        async with self.bus.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.jobs, job_id)
            pipe.zrem(self.keys.jobs_due, job_id)
            pipe.delete(self.keys.job_runs(job_id))
            removed, _, _ = await pipe.execute()
        return bool(removed)

    async def due(self, now: float, *, limit: int = 100) -> list[tuple[str, float]]:
        found: list[tuple[bytes, float]] = await self.bus.redis.zrangebyscore(  # type: ignore[assignment]  # bytes
            self.keys.jobs_due, "-inf", round(now * 1000), start=0, num=limit, withscores=True)
        return [(job_id.decode(), float(score) / 1000) for job_id, score in found]

    async def runs(self, job_id: str, *, limit: int = 50) -> list[Run]:
        """The job's latest records, oldest first."""
        raw: dict[bytes, bytes] = await self.bus.redis.hgetall(self.keys.job_runs(job_id))  # type: ignore[assignment]
        runs = sorted((Run.model_validate_json(v) for v in raw.values()), key=lambda r: r.due)
        return runs[-limit:]

    async def ended(self, job_id: str, due: float, outcome: str, answer: str) -> Run | None:
        """The turn a due instant started has ended: its outcome added to the record."""
        key, field_name = self.keys.job_runs(job_id), due_field(due)
        raw = await self.bus.redis.hget(key, field_name)
        if raw is None:
            return None
        run = Run.model_validate_json(raw).model_copy(update={
            "outcome": outcome, "answer": answer[:500], "ended_at": time.time(),
            "status": "fired" if outcome == "ok" else "failed"})
        await self.bus.redis.hset(key, field_name, run.model_dump_json())
        return run

    async def run_now(self, job: Job, *, now: float | None = None) -> Run:
        """Fire the job once, now, by hand (its schedule unchanged): recorded like a due instant."""
        now = now or time.time()
        message = job.turn(reply_to=self.keys.jobs_results)
        run = Run(job=job.id, due=now, status="fired", reason="run by hand", fired_at=now, turn=message.message_id)
        async with self.bus.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.job_runs(job.id), due_field(now), run.model_dump_json())
            pipe.set(self.keys.job_turn(message.message_id), f"{job.id}|{due_field(now)}", ex=TURN_KEEP_S)
            pipe.xadd(self.keys.brain_inbox, encode(message))  # type: ignore[arg-type]  # bytes fields
            await pipe.execute()
        return run

    async def trim(self, job_id: str) -> None:
        key = self.keys.job_runs(job_id)
        if await self.bus.redis.hlen(key) > RUNS_KEPT + 50:
            names: list[bytes] = await self.bus.redis.hkeys(key)  # type: ignore[assignment]  # bytes
            fields = sorted(k.decode() for k in names)
            await self.bus.redis.hdel(key, *fields[:-RUNS_KEPT])


def due_field(due: float) -> str:
    """A due instant as a record's field: milliseconds, zero-padded so fields sort in time order."""
    return f"{round(due * 1000):015d}"


def as_json(job: Job, *, next_due: float | None) -> dict[str, Any]:
    shown: dict[str, Any] = json.loads(job.model_dump_json())
    return {"id": job.id, **shown, "schedule": job.schedule.describe(), "next_due": next_due,
            "session_id": job.session_id}
