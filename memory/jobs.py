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
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bus.errors import PincerError
from bus.protocol import ChatMessage, stamp_allows
from bus.scripts import lua
from memory.schedule import Schedule, parse_duration

if TYPE_CHECKING:  # only named: the roles' settings import this module's limits, `pincer up` among them
    from bus.streams import Bus

JOB_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
RUNS_KEPT = 500  # records kept per job (the oldest dropped)
SILENT = "HEARTBEAT_OK"  # a heartbeat's answer that means "nothing to report": recorded, not delivered
TURN_KEEP_S = 7 * 86_400  # how long a job's turn waits for its outcome to be recorded
# An identity's jobs are the ids that begin "<owner>/" (an owner's name never holds a "/"): counted and
# removed by the scripts below in one step each, so parallel requests cannot pass a cap or outlive a purge.
# KEYS: jobs, due set. ARGV: job id, definition, first due (ms; '' when paused), cap ('' for none), "<owner>/".
# 1: stored; 0: a job of that id exists; -1: the owner has cap jobs already.
ADD = lua("memory.jobs.add", """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
if ARGV[4] ~= '' then
  local n, prefix = 0, ARGV[5]
  for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(id, 1, #prefix) == prefix then n = n + 1 end
  end
  if n >= tonumber(ARGV[4]) then return -1 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] ~= '' then redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1]) end
return 1
""")
# KEYS: jobs, due set, then the records of each job the caller saw was the owner's. ARGV: "<owner>/".
# The ids removed (one made since the caller looked has its records deleted after).
PURGE = lua("memory.jobs.purge", """
local removed = {}
for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(id, 1, #ARGV[1]) == ARGV[1] then
    redis.call('HDEL', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    removed[#removed + 1] = id
  end
end
for k = 3, #KEYS do redis.call('DEL', KEYS[k]) end
return removed
""")
CatchUp = Literal["run_once", "skip", "all"]
Status = Literal["fired", "skipped", "missed", "failed"]
# Where the owner's identity lives, so the scheduler can tell it is gone: a token (`pincer token revoke`),
# a hook (`pincer hooks rm`), a pairing (`pincer channels unpair`); "": the config (the owner, allow_from).
OwnerKind = Literal["", "token", "hook", "paired"]


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
    made_by: Literal["person", "model"] = "person"  # "model": the agent's schedule tool, announced to the owner
    owner_kind: OwnerKind = ""
    # The agents stamp of the turn or request that made the job (ChatMessage.agents), carried by its runs;
    # None (a job made before stamps): its runs use no agent but its own.
    agents: list[str] | None = None

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
                           reply_to=reply_to, job=self.id, agents=self.agents)

    def agent_refused(self) -> str:
        """Why its maker's stamp does not let it run its agent ("": it does)."""
        if self.agents is None or stamp_allows(self.agents, "", self.agent):
            return ""
        return (f"its owner {self.owner} may not use agent {self.agent!r} (it may use "
                f"{', '.join(self.agents) or 'none'}): a job runs only as what its owner may do")


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


class JobExists(PincerError):
    pass


class JobCapReached(PincerError):
    pass


class JobLimits(BaseModel):
    """How many jobs an identity may keep, and how often a chat-scoped identity's may run."""

    model_config = ConfigDict(extra="forbid")

    max_jobs: int = Field(default=20, ge=0)  # a chat-scoped identity's: a chat token, a channel user, a hook
    operator_max_jobs: int = Field(default=100, ge=0)  # an operator's (the owner's)
    min_every: str = "60s"  # the shortest period of a chat-scoped identity's job

    @field_validator("min_every")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration(value)
        return value

    def cap(self, *, operator: bool) -> int:
        return self.operator_max_jobs if operator else self.max_jobs


class ModelJobLimits(JobLimits):
    """The schedule tool's limits: the same caps (an owner's is ``operator_max_jobs``), a floor that binds every
    sender, the owner too (a prompt-injected turn must not plant "every 1s"), and the chats the owner is told
    in of every job the agent makes (besides the maker's own chat, where their id is one)."""

    announce: list[str] = Field(default_factory=list)

    @field_validator("announce")
    @classmethod
    def _targets(cls, value: list[str]) -> list[str]:
        for target in value:
            if not all(target.partition(":")[::2]):
                raise ValueError(f"announce entries are CHANNEL:CHAT, such as telegram:123456789, got {target!r}")
        return value


def refusal(job: Job, *, operator: bool, min_every: str) -> str | None:
    """Why this identity may not keep this job (None: it may). ``min_every`` binds everyone but an operator
    making a job by hand; only an operator may deliver to chats other than the owner's own."""
    floor = parse_duration(min_every)
    if job.schedule.period_s(time.time()) < floor and not (operator and job.made_by == "person"):
        who = "a job the agent makes" if job.made_by == "model" else "this identity's job"
        return f"{who} may run every {min_every} at most often; pick a longer period"
    foreign = [target for target in job.deliver if target != job.owner]
    if foreign and not operator:
        return (f"only an operator may deliver to {foreign[0]}: an identity may deliver only to its own chat "
                f"({job.owner})")
    return None


class JobStore:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.keys = bus.keys
        self._add = bus.redis.register_script(ADD)
        self._purge = bus.redis.register_script(PURGE)

    async def add(self, job: Job, *, now: float | None = None, cap: int | None = None) -> float | None:
        """Store a new job and its first due instant; ``JobCapReached`` when its owner has ``cap`` jobs already
        (counted and stored in one step)."""
        # An instant at this very moment is due (an "at" or cron one). An interval whose anchor has come (the
        # moment the job was made) runs first one interval on, however soon after the anchor it is stored; an
        # anchor still ahead is its first instant.
        moment, schedule = now or time.time(), job.schedule
        since = max(moment - 0.001, schedule.anchor) if schedule.kind == "every" and schedule.anchor <= moment \
            else moment - 0.001
        first = schedule.next_after(since)
        if first is None:
            raise ValueError(f"{job.schedule.describe()} is in the past: nothing would ever run")
        due = "" if job.paused else round(first * 1000)
        done = await self._add(keys=[self.keys.jobs, self.keys.jobs_due],
                               args=[job.id, job.model_dump_json(), due, "" if cap is None else cap, f"{job.owner}/"])
        if done == 0:
            raise JobExists(f"a job named {job.name!r} already exists; remove it first (pincer cron rm {job.name})")
        if done == -1:
            raise JobCapReached(f"{job.owner} already has {cap} jobs, the most it may keep; remove one first")
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

    async def remove_owner(self, owner: str) -> list[str]:
        """Every job of ``owner`` gone with its records, in one step (its identity was revoked or removed);
        the names of those removed."""
        prefix = f"{owner}/"
        names: list[bytes] = await self.bus.redis.hkeys(self.keys.jobs)  # type: ignore[assignment]  # bytes
        seen = [n.decode() for n in names if n.decode().startswith(prefix)]
        raw: list[bytes] = await self._purge(keys=[self.keys.jobs, self.keys.jobs_due,
                                                   *(self.keys.job_runs(j) for j in seen)], args=[prefix])
        removed = sorted(r.decode() for r in raw)
        if late := [self.keys.job_runs(j) for j in removed if j not in seen]:
            await self.bus.redis.delete(*late)
        return [job_id.removeprefix(prefix) for job_id in removed]

    async def due(self, now: float, *, limit: int = 100) -> list[tuple[str, float]]:
        # floor, not round: an instant half a millisecond ahead is not due yet (it fired early, seen in CI)
        found: list[tuple[bytes, float]] = await self.bus.redis.zrangebyscore(  # type: ignore[assignment]  # bytes
            self.keys.jobs_due, "-inf", math.floor(now * 1000), start=0, num=limit, withscores=True)
        return [(job_id.decode(), due) for job_id, score in found if (due := float(score) / 1000) <= now]

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

    async def record_hand_run(self, job: Job, message: ChatMessage, *, now: float | None = None) -> Run:
        """A run by hand (its schedule unchanged) about to send ``message``: recorded like a due instant, and
        its turn known, so its outcome is added to the record when it ends."""
        now = now or time.time()
        run = Run(job=job.id, due=now, status="fired", reason="run by hand", fired_at=now, turn=message.message_id)
        async with self.bus.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.job_runs(job.id), due_field(now), run.model_dump_json())
            pipe.set(self.keys.job_turn(message.message_id), f"{job.id}|{due_field(now)}", ex=TURN_KEEP_S)
            await pipe.execute()
        return run

    async def owner_gone(self, job: Job) -> str:
        """Why the job's owner no longer exists ("": it does, or its identity lives in the config)."""
        redis, keys = self.bus.redis, self.keys
        if job.owner_kind == "token" and not await redis.hexists(keys.token_names, job.owner):
            return f"its owner {job.owner} no longer exists (the token was revoked): a job runs only as its owner"
        if job.owner_kind == "hook" and not await redis.hexists(keys.hooks, job.owner.removeprefix("hook:")):
            return f"its owner {job.owner} no longer exists (the hook was removed): a job runs only as its owner"
        channel, _, user = job.owner.partition(":")
        if job.owner_kind == "paired" and not await redis.hexists(keys.channel_paired(channel), user):
            return f"its owner {job.owner} no longer exists (unpaired): a job runs only as its owner"
        return ""

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
