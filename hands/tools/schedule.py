"""The schedule tool: the agent makes, lists and cancels its sender's own jobs (memory/jobs.py), which the
Brains' scheduler then runs as that sender. A sender who is a chat user gets the answers in their chat.

A job the model makes runs unattended for as long as it exists, so it is never made quietly: each is capped
(per identity, counted and stored in one step), no more often than ``hands.tools.schedule.min_every`` for
any sender, the owner included, and announced outside the conversation (the model cannot word it or hide
it): to the maker's own chat where their id is one, and to ``hands.tools.schedule.announce``."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from pydantic import ValidationError

from bus.protocol import ChannelSend, ErrorCode
from hands.errors import ToolFailure
from hands.registry import Category, ToolContext, ToolDefinition
from memory.jobs import Job, JobCapReached, JobExists, JobStore, OwnerKind, as_json, refusal
from memory.schedule import Schedule, parse_duration

# Platforms where a user's id is also their direct chat (Discord and Matrix need a DM channel or room made
# first): a job made by such a user answers there.
CHANNELS = ("telegram", "slack")


async def schedule(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    store, call = ctx.schedules, ctx.call
    if store is None or call is None:
        raise ToolFailure(ErrorCode.SERVICE_UNAVAILABLE, "scheduling is not available on this worker", retryable=False)
    owner = call.sender
    if not owner:
        raise ToolFailure(ErrorCode.PERMISSION_DENIED, "this call has no sender: a job needs someone to run as")
    action = args["action"]
    if action == "list":
        jobs = await store.all(owner=owner)
        return {"jobs": [as_json(job, next_due=await store.next_due(job.id)) for job in jobs]}
    name = args.get("name")
    if not name:
        raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, f"action {action} needs the job's name")
    if action == "cancel":
        if not await store.remove(f"{owner}/{name}"):
            known = [job.name for job in await store.all(owner=owner)]
            raise ToolFailure(ErrorCode.FILE_NOT_FOUND, f"no job named {name!r}; jobs: {', '.join(known) or '(none)'}")
        return {"cancelled": name}
    limits, is_owner = ctx.settings.tools.schedule, owner in ctx.settings.tools.owners
    job = _job(owner, name, args, ctx).model_copy(update={"owner_kind": await owner_kind(store, owner)})
    if why := refusal(job, operator=is_owner, min_every=limits.min_every):
        raise ToolFailure(ErrorCode.PERMISSION_DENIED, f"{why} (hands.tools.schedule.min_every)")
    try:
        first = await store.add(job, cap=limits.cap(operator=is_owner))
    except JobExists as exc:
        raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, str(exc),
                          suggestions=["cancel it first, or pick another name"]) from None
    except JobCapReached as exc:
        raise ToolFailure(ErrorCode.PERMISSION_DENIED, f"{exc} (hands.tools.schedule)") from None
    except ValueError as exc:
        raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, str(exc)) from None
    told = await announce(store, job, [*job.deliver, *limits.announce])
    return {**as_json(job, next_due=first), "announced_to": told}


async def owner_kind(store: JobStore, owner: str) -> OwnerKind:
    """Where the sender's identity lives, so the scheduler stops the job once it is gone."""
    redis, keys = store.bus.redis, store.keys
    channel, _, user = owner.partition(":")
    if channel == "hook" and user:
        return "hook"
    if user:
        return "paired" if await redis.hexists(keys.channel_paired(channel), user) else ""
    return "token" if await redis.hexists(keys.token_names, owner) else ""


async def announce(store: JobStore, job: Job, targets: list[str]) -> list[str]:
    """Tell the owner, in words the model did not choose, that the agent made this job (each chat once)."""
    text = (f"Pincer: the agent scheduled a job as {job.owner}: {job.name!r}, {job.schedule.describe()}, asking "
            f"{job.message[:300]!r}. It runs unattended until cancelled (`pincer cron rm {job.name}`, or ask "
            "the agent to cancel it).")
    told = sorted(set(targets))
    for target in told:  # the channel sends it once (the key), whoever tells it again
        channel, _, chat = target.partition(":")
        await store.bus.publish(store.keys.channel_outbox(channel), ChannelSend(
            channel=channel, chat=chat, text=text, key=f"job-made:{job.id}:{job.created_at:.3f}:{target}"))
    await store.bus.redis.xadd(store.keys.alerts, {"kind": "job", "job": job.id, "text": text, "at": time.time()},
                               maxlen=store.bus.settings.alerts_maxlen, approximate=True)
    return told


def _job(owner: str, name: str, args: dict[str, Any], ctx: ToolContext) -> Job:
    given = [kind for kind in ("every", "cron", "at") if args.get(kind)]
    if len(given) != 1:
        raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, "give exactly one of every (10m, 2h), cron ('0 8 * * 1-5') "
                          "or at (2026-12-24T18:00)")
    if not args.get("message"):
        raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, "create needs message: what to ask each time it runs")
    tz = args.get("tz") or "UTC"
    channel = owner.partition(":")[0]
    try:
        at = None
        if args.get("at"):
            moment = datetime.fromisoformat(args["at"])
            at = (moment if moment.tzinfo else moment.replace(tzinfo=ZoneInfo(tz))).timestamp()
        schedule = Schedule(kind=given[0], tz=tz, anchor=time.time(), cron=args.get("cron"), at=at,  # type: ignore[arg-type]
                            every_s=parse_duration(args["every"]) if args.get("every") else None)
        return Job(name=name, owner=owner, agent=ctx.agent_id, agents=ctx.call.agents if ctx.call else None,
                   schedule=schedule, message=args["message"],
                   made_by="model",  # a chat user hears back in their chat
                   deliver=[owner] if channel in CHANNELS else [])
    except ValidationError as exc:
        raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, "; ".join(
            str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()[:5])) from None
    except ValueError as exc:
        raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, str(exc)) from None


SCHEDULE_TOOLS = [
    ToolDefinition(
        name="schedule",
        description=("Schedule a message to yourself, run later as the person you are talking to: create (name, "
                     "message, and one of every like '30m', cron like '0 8 * * 1-5' with tz, or at like "
                     "'2026-12-24T18:00'), list their jobs, or cancel one by name. A chat user gets the answers "
                     "in their chat."),
        parameters={"type": "object", "properties": {
            "action": {"type": "string", "enum": ["create", "list", "cancel"]},
            "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,63}$"},
            "message": {"type": "string", "maxLength": 32_000},
            "every": {"type": "string", "pattern": "^[0-9.]+[smhd]$"},
            "cron": {"type": "string", "maxLength": 100},
            "at": {"type": "string", "maxLength": 40},
            "tz": {"type": "string", "maxLength": 64},
        }, "required": ["action"], "additionalProperties": False},
        handler=schedule, category=Category.MEMORY, idempotent=False,
    ),
]
