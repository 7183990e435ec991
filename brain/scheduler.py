"""The jobs' scheduler: it runs in every Brain, and the one holding a fenced lease fires what is due.

Each due instant is claimed in one Lua script that first checks the lease is still ours and the job is
still due at that very instant: it writes the instant's record, sends the turn (a ``chat:message`` as
the job's owner) and moves the job to its next instant, all at once. So an instant is never fired
twice (a holder paused past its lease cannot write after the next holder has), and never dropped
silently: one the scheduler was away for is decided by the job's catch-up policy and recorded as
fired, skipped (why) or missed (why). The turn's outcome is added to its record when the turn ends.

A fire is a turn its owner starts, so it passes the owner's limits as the Gateway's doors do (bus/admission.py:
the identity's message rate, the Brains' backlog), and a job whose owner is gone (a token revoked, a hook
removed, a user unpaired) is not fired at all and leaves the due set; each refused instant is recorded
skipped with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from brain.config import HeartbeatSettings, SchedulerSettings
from bus.admission import Admission, RateLimits
from bus.codec import encode
from bus.consumer import GroupConsumer
from bus.lease import HOLDS, Lease
from bus.log import kv
from bus.metrics import Meter
from bus.presence import alive
from bus.protocol import ANY_AGENT, ChannelSend, ChatError, ChatReply, Message
from bus.reaper import Reaper
from bus.redis_client import RedisAway
from bus.scripts import lua
from bus.streams import Bus
from memory.jobs import SILENT, TURN_KEEP_S, Job, JobStore, Run, due_field
from memory.schedule import Schedule, parse_duration

log = logging.getLogger("brain.scheduler")

GROUP = "scheduler"
BATCH = 1000  # due instants of one job decided in one claim (a long outage is worked through in steps)
# KEYS: lease, due set, the job's records, jobs, brain inbox, then one turn key per message.
# ARGV: holder, job id, due (ms), next due (ms, '' for none), record count, (field, json)...,
#       message count, then per message: its field count, its fields..., its turn value.
# -1: the lease is not ours; 0: the instant was already taken (or the job is gone); 1: done.
FIRE = lua("brain.scheduler.fire", HOLDS + """
local score = redis.call('ZSCORE', KEYS[2], ARGV[2])
if not score or tonumber(score) ~= tonumber(ARGV[3]) then return 0 end
if redis.call('HEXISTS', KEYS[4], ARGV[2]) == 0 then redis.call('ZREM', KEYS[2], ARGV[2]) return 0 end
if ARGV[4] == '' then redis.call('ZREM', KEYS[2], ARGV[2]) else redis.call('ZADD', KEYS[2], ARGV[4], ARGV[2]) end
local a = 6
for r = 1, tonumber(ARGV[5]) do redis.call('HSET', KEYS[3], ARGV[a], ARGV[a + 1]) a = a + 2 end
local m = tonumber(ARGV[a])
a = a + 1
for k = 1, m do
  local n = tonumber(ARGV[a])
  redis.call('XADD', KEYS[5], '*', unpack(ARGV, a + 1, a + n))
  a = a + n + 1
  redis.call('SET', KEYS[5 + k], ARGV[a], 'EX', ARGV[#ARGV])
  a = a + 1
end
return 1
""")
TAKE_OVER = lua("brain.scheduler.take_over", """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end
return 0
""")


@dataclass
class Plan:
    """What to do with a job's due instants up to now."""

    records: list[Run] = field(default_factory=list)
    fire: list[float] = field(default_factory=list)
    next_due: float | None = None


def plan(job: Job, due: float, now: float, *, grace_s: float) -> Plan:
    """Decide each of the job's instants from ``due`` to ``now``: one on time fires; those the scheduler was
    away for follow the job's catch-up policy (a long outage is decided in batches of BATCH)."""
    instants = [due, *job.schedule.instants(due, now, limit=BATCH - 1)]
    result = Plan(next_due=job.schedule.next_after(instants[-1]))
    more = result.next_due is not None and result.next_due <= now  # another batch follows this one
    grace = min(grace_s, job.schedule.period_s(due) / 2)
    late = [t for t in instants if now - t > grace]
    on_time = [t for t in instants if now - t <= grace]
    away = f"the scheduler was away (due {_ago(now - instants[0])} before it ran)"
    if job.catch_up == "all":
        result.fire = [t for t in instants if now - t <= max(job.window_s, grace)]
        result.records = [Run(job=job.id, due=t, status="missed",
                              reason=f"{away}; older than its catch-up window ({job.window_s:g}s)")
                          for t in instants if t not in result.fire]
        return result
    if on_time:
        result.fire = on_time[-1:]
    elif job.catch_up == "run_once" and not more:
        result.fire = late[-1:]
    why = ("catch-up run_once: one run stands for the instants missed" if job.catch_up == "run_once"
           else "catch-up skip: instants missed are not run")
    result.records = [Run(job=job.id, due=t, status="skipped", reason=f"{away}; {why}")
                      for t in instants if t not in result.fire]
    return result


def _refuse(job: Job, decided: Plan, instants: list[float], reason: str) -> None:
    """These instants of the plan are not fired: each is recorded skipped, saying why."""
    decided.records += [Run(job=job.id, due=t, status="skipped", reason=reason) for t in instants]
    decided.fire = [t for t in decided.fire if t not in instants]


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f}m" if seconds < 7200 else f"{seconds / 3600:.1f}h"


HEARTBEAT_PROMPT = (
    "[Heartbeat: a scheduled check-in, nobody is waiting for you.] Read {checklist} in the workspace and do what "
    "it asks. If there is nothing worth telling the person, answer exactly " + SILENT + " and nothing else; "
    "otherwise answer with what they should know, briefly.")
SYNC_EVERY_S = 60.0  # how often the holder brings the heartbeat jobs in step with the config
TRIM_EVERY = 20  # claims between trims of a job's records (a record a claim, RUNS_KEPT kept: no hurry)


def heartbeat_jobs(heartbeats: dict[str, HeartbeatSettings], *, now: float) -> list[Job]:
    """The jobs the configured heartbeats are: one per agent, named heartbeat-<agent>, in a session of its own."""
    return [Job(name=f"heartbeat-{agent}".lower()[:64], owner=beat.owner, agent=agent, heartbeat=True,
                agents=[ANY_AGENT],  # the operator's own configuration
                message=HEARTBEAT_PROMPT.format(checklist=beat.checklist), deliver=beat.deliver,
                daily_usd=beat.daily_usd, catch_up="skip", session=f"heartbeat-{agent}",
                idle_after_s=parse_duration(beat.idle_after) if beat.idle_after else None,
                schedule=Schedule(kind="every", every_s=parse_duration(beat.every), anchor=now))
            for agent, beat in sorted(heartbeats.items())]


class Scheduler:
    def __init__(self, bus: Bus, settings: SchedulerSettings, *, instance_id: str, meter: Meter,
                 clock: Any = time.time, heartbeats: dict[str, HeartbeatSettings] | None = None,
                 rate: RateLimits | None = None) -> None:
        self.bus, self.settings, self.instance_id, self.meter, self.clock = bus, settings, instance_id, meter, clock
        self.admission = Admission(bus, rate or RateLimits())
        self.heartbeats = heartbeats or {}
        self._synced = 0.0
        self._claims = 0
        self.store = JobStore(bus)
        self.lease = Lease(bus.redis, bus.keys.scheduler_lease, instance_id, ttl_ms=round(settings.lease_s * 1000))
        self._fire = bus.redis.register_script(FIRE)
        self._take_over = bus.redis.register_script(TAKE_OVER)
        self.results = GroupConsumer(bus, streams=[bus.keys.jobs_results], group=GROUP, consumer=instance_id,
                                     handler=self._ended, concurrency=8, block_ms=1000)

    async def run(self, stop: asyncio.Event) -> None:
        results = asyncio.create_task(self.results.run(stop), name="scheduler:results")
        reaper = Reaper(self.bus, self.results, self.bus.settings)  # outcomes a killed Brain had taken
        await reaper.start()
        try:
            while not stop.is_set():
                wait = self.settings.tick_s
                try:
                    if await self.lease.take() or await self._take_over_dead():
                        wait = await self.tick()
                except RedisAway as exc:
                    log.warning("scheduler: Redis away (%s)", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
        finally:
            with contextlib.suppress(RedisAway):
                await self.lease.release()
            await reaper.close()
            await results

    async def _take_over_dead(self) -> bool:
        """The lease of a Brain whose heartbeat stopped (killed): ours at once, not after its ttl."""
        holder: bytes | None = await self.bus.redis.get(self.lease.key)  # type: ignore[assignment]  # bytes
        if holder is None or holder.decode() in await alive(self.bus, "brain"):
            return False
        self.lease.held = bool(await self._take_over(keys=[self.lease.key],
                                                     args=[holder, self.instance_id, self.lease.ttl_ms]))
        if self.lease.held:
            log.info("scheduler taken over from %s (no heartbeat)", holder.decode())
        return self.lease.held

    async def tick(self) -> float:
        """Fire what is due; how long until the next look."""
        now = self.clock()
        await self.bus.redis.set(self.bus.keys.scheduler_tick, f"{now:.3f}")
        if now - self._synced > SYNC_EVERY_S:
            await self.sync_heartbeats(now)
        due_now = await self.store.due(now)
        backlog: int | None = None  # read once a tick, when a job is about to fire
        for (job_id, due), job in zip(due_now, await self.store.many([j for j, _ in due_now]), strict=True):
            if not self.lease.held:
                break
            if job is None:
                await self.bus.redis.zrem(self.bus.keys.jobs_due, job_id)
                continue
            decided = plan(job, due, now, grace_s=self.settings.grace_s)
            if decided.fire and (gone := await self.store.owner_gone(job)):
                log.warning("job not fired: its owner is gone %s", kv(job=job.id, owner=job.owner))
                _refuse(job, decided, decided.fire, gone)
                decided.next_due = None  # out of the due set; its record says why
            if decided.fire and (stranger := job.agent_refused()):
                _refuse(job, decided, decided.fire, stranger)
                decided.next_due = None
            if decided.fire and (idle := await self._idle_owner(job, now)):
                _refuse(job, decided, decided.fire, idle)
            if decided.fire:
                backlog = await self.admission.waiting() if backlog is None else backlog
                await self._admit(job, decided, backlog)
            await self._claim(job, due, decided, now)
        upcoming = await self.bus.redis.zrange(self.bus.keys.jobs_due, 0, 0, withscores=True)
        until = float(upcoming[0][1]) / 1000 - self.clock() if upcoming else self.settings.tick_s
        return max(0.01, min(self.settings.tick_s, until))

    async def sync_heartbeats(self, now: float) -> None:
        """The heartbeat jobs in step with brain.heartbeats: new ones made, changed ones remade (their records
        kept), ones no longer configured removed."""
        wanted = {job.id: job for job in heartbeat_jobs(self.heartbeats, now=now)}
        for job in await self.store.all():
            if job.heartbeat and job.id not in wanted:
                await self.store.remove(job.id)
                log.info("heartbeat removed %s", kv(job=job.id))
        for job_id, job in wanted.items():
            found = await self.store.get(job_id)
            kept = {"created_at", "schedule", "paused"}  # a heartbeat paused by hand stays paused
            same = found is not None and found.model_dump(exclude=kept) == job.model_dump(exclude=kept) \
                and found.schedule.every_s == job.schedule.every_s
            if not same:
                await self.store.replace(job.model_copy(update={"paused": bool(found and found.paused)}), now=now)
                log.info("heartbeat set %s", kv(job=job_id, every=job.schedule.describe()))
        self._synced = now

    async def _admit(self, job: Job, decided: Plan, backlog: int) -> None:
        """The owner's limits, charged for each instant about to fire; those refused are recorded skipped."""
        limits = self.admission.limits
        if backlog >= limits.max_inbox_backlog:
            _refuse(job, decided, decided.fire, f"{backlog} messages were waiting for a Brain (gateway.limits."
                    "max_inbox_backlog): a job's run is not queued behind them")
            return
        size = len(job.message.encode())
        said = [(t, await self.admission.take_message(job.owner, size=size)) for t in decided.fire]
        if refused := [t for t, short in said if short is not None and short.short == "messages"]:
            _refuse(job, decided, refused, f"its owner {job.owner} sent more than {limits.messages_per_minute} "
                    "messages a minute (gateway.limits.messages_per_minute): a job's runs count in its owner's rate")
        if refused := [t for t, short in said if short is not None and short.short == "text"]:
            _refuse(job, decided, refused, f"its owner {job.owner} stored more than "
                    f"{limits.text_bytes_per_day / 2**20:g} MB of text today (gateway.limits.text_mb_per_day): "
                    "a job's runs count in its owner's text")

    async def _idle_owner(self, job: Job, now: float) -> str:
        """Why a heartbeat does not run now: its owner has not talked to the agent for idle_after_s ("": it runs)."""
        if not job.heartbeat or job.idle_after_s is None:
            return ""
        seen: bytes | None = await self.bus.redis.get(self.bus.keys.identity_seen(job.owner))  # type: ignore[assignment]
        if seen is not None and now - float(seen) <= job.idle_after_s:
            return ""
        since = "ever" if seen is None else f"{_ago(now - float(seen))}"
        return (f"its owner {job.owner} has not talked to the agent for {since} (more than idle_after, "
                f"{job.idle_after_s:g}s): a heartbeat does not run for an idle owner")

    async def _claim(self, job: Job, due: float, decided: Plan, now: float) -> None:
        fired = []
        for instant in decided.fire:
            message = job.turn(reply_to=self.bus.keys.jobs_results)
            fired.append((instant, message))
            decided.records.append(Run(job=job.id, due=instant, status="fired", fired_at=now,
                                       turn=message.message_id))
        args: list[Any] = [self.instance_id, job.id, round(due * 1000),
                           "" if decided.next_due is None else round(decided.next_due * 1000), len(decided.records)]
        for record in decided.records:
            args.extend((due_field(record.due), record.model_dump_json()))
        args.append(len(fired))
        for instant, message in fired:
            fields = encode(message)
            args.append(len(fields) * 2)
            for key, value in fields.items():
                args.extend((key, value))
            args.append(f"{job.id}|{due_field(instant)}")
        args.append(TURN_KEEP_S)
        keys = [self.lease.key, self.bus.keys.jobs_due, self.bus.keys.job_runs(job.id), self.bus.keys.jobs,
                self.bus.keys.brain_inbox, *(self.bus.keys.job_turn(m.message_id) for _, m in fired)]
        done = await self._fire(keys=keys, args=args)
        if done == -1:
            self.lease.held = False
            log.warning("scheduler lease lost before %s was claimed; its holder fires it", job.id)
            return
        if done == 1:
            for record in decided.records:
                self.meter.count("pincer_job_runs", record.status)
                if record.status == "fired":
                    self.meter.observe("pincer_job_fire_lag_seconds", max(0.0, now - record.due))
            log.info("job due %s", kv(job=job.id, fired=len(fired), recorded=len(decided.records),
                                      lag_s=round(now - due, 3)))
            self._claims += 1
            if self._claims % TRIM_EVERY == 0 or len(decided.records) > 1:
                await self.store.trim(job.id)

    async def _ended(self, message: Message, _stream: str) -> list[Any]:
        """A job's turn ended: its outcome recorded (and, later, delivered)."""
        if not isinstance(message, (ChatReply, ChatError)):
            return []
        key = self.bus.keys.job_turn(message.message_id)
        found: bytes | None = await self.bus.redis.get(key)  # type: ignore[assignment]  # bytes
        if found is None:
            return []
        job_id, _, due_ms = found.decode().rpartition("|")
        outcome = "ok" if isinstance(message, ChatReply) else message.code.value
        answer = message.text if isinstance(message, ChatReply) else message.message
        await self.store.ended(job_id, int(due_ms) / 1000, outcome, answer)
        job = await self.store.get(job_id)
        silent = job is not None and job.heartbeat and outcome == "ok" and answer.strip().startswith(SILENT)
        if job is not None and job.deliver and not silent:  # a heartbeat with nothing to report says nothing
            text = answer if outcome == "ok" else f"The job {job.name} did not finish ({outcome}): {answer}"
            for target in job.deliver:  # each chat's channel sends it once (the key), whoever redelivers this
                channel, _, chat = target.partition(":")
                await self.bus.publish(self.bus.keys.channel_outbox(channel), ChannelSend(
                    channel=channel, chat=chat, text=text[:64_000] or "(no answer)",
                    key=f"{message.message_id}:{target}"))
        await self.bus.redis.delete(key)
        return []
