"""``/v1/cron``: an identity's scheduled jobs, made, listed, paused, run and read back (what `pincer cron`
calls). A job belongs to the caller's identity and runs as it; only an operator may deliver answers to
chats other than the caller's own. An operator also lists, pauses, resumes, runs and removes another
identity's jobs by naming it (``?owner=NAME``; ``?owner=*`` lists every one's), as with sessions; a chat token
naming another owner is refused outright.

Running a job by hand is a turn like any other door's: ``TurnRunner.start`` charges it to the caller (an
operator running another's job too, as when it writes in another's session: an open-turn place while it runs,
the message rate, the Brains' backlog), and its end is passed on to the jobs' results stream, where the
scheduler records and delivers it as it does a scheduled run's."""

from __future__ import annotations

import re
import time
from datetime import datetime
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bus.protocol import ChatError, ChatMessage, ChatReply, ErrorCode, Message
from gateway.server.handling import caller, listed_owner, read_json
from gateway.tokens import OWNER, Identity
from gateway.turns.refusal import Refused, not_found
from gateway.turns.runner import TurnRunner
from gateway.turns.session_names import owner_meant
from memory.jobs import (
    CatchUp,
    Job,
    JobCapReached,
    JobExists,
    JobLimits,
    JobStore,
    Run,
    as_json,
    refusal,
)
from memory.schedule import Schedule, parse_duration

SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
EXAMPLE = '{"name": "morning", "cron": "0 8 * * 1-5", "tz": "Europe/Berlin", "message": "What is on today?"}'


class NewJob(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    message: str
    every: str | None = None  # a duration: 10s, 30m, 2h
    cron: str | None = None
    tz: str = "UTC"
    at: str | None = None  # ISO 8601; without an offset, in ``tz``
    agent: str = "main"
    session: str = ""
    deliver: list[str] = []
    catch_up: CatchUp = "run_once"
    window: str = "1h"
    daily_usd: float | None = None  # the job's own spend limit per day


class JobRoutes:
    def __init__(self, store: JobStore, turns: TurnRunner, limits: JobLimits) -> None:
        self.store, self.turns, self.limits = store, turns, limits

    def routes(self) -> list[Route]:
        return [Route("/v1/cron", self.list_jobs, methods=["GET"]),
                Route("/v1/cron", self.add, methods=["POST"]),
                Route("/v1/cron/{name}", self.show, methods=["GET"]),
                Route("/v1/cron/{name}", self.remove, methods=["DELETE"]),
                Route("/v1/cron/{name}/runs", self.runs, methods=["GET"]),
                Route("/v1/cron/{name}/{action}", self.act, methods=["POST"])]

    async def list_jobs(self, request: Request) -> Response:
        """The caller's jobs; an operator's ``?owner=NAME`` lists that identity's, ``?owner=*`` every one's."""
        jobs = await self.store.all(owner=listed_owner(request, "jobs"))
        return JSONResponse({"jobs": [as_json(job, next_due=await self.store.next_due(job.id)) for job in jobs]})

    async def add(self, request: Request) -> Response:
        identity = caller(request)
        body = await read_json(request, NewJob, example=EXAMPLE)
        job = self._job(identity, body)
        if body.agent not in await self.turns.agents_for(identity):
            raise Refused(ErrorCode.FORBIDDEN, f"this token may not use agent {body.agent!r}")
        if why := refusal(job, operator=identity.operator, min_every=self.limits.min_every):
            raise Refused(ErrorCode.FORBIDDEN, why)
        try:
            first = await self.store.add(job, cap=self.limits.cap(operator=identity.operator))
        except JobExists as exc:
            raise Refused(ErrorCode.CONFLICT, str(exc)) from None
        except JobCapReached as exc:
            raise Refused(ErrorCode.FORBIDDEN, f"{exc} (gateway.limits.jobs)") from None
        except ValueError as exc:
            raise Refused(ErrorCode.INVALID_ARGUMENTS, str(exc)) from None
        return JSONResponse(as_json(job, next_due=first), status_code=201)

    def _job(self, identity: Identity, body: NewJob) -> Job:
        given = [kind for kind in ("every", "cron", "at") if getattr(body, kind) is not None]
        if len(given) != 1:
            raise Refused(ErrorCode.INVALID_ARGUMENTS, "give exactly one of every (10s, 30m, 2h), cron "
                          "(\"0 8 * * 1-5\") or at (2026-12-24T18:00)")
        if body.session and not SESSION_NAME.match(body.session):
            raise Refused(ErrorCode.INVALID_ARGUMENTS, "session is a session's name: letters, digits, _ . -")
        try:
            schedule = Schedule(kind=given[0], tz=body.tz, anchor=time.time(), cron=body.cron,  # type: ignore[arg-type]
                                every_s=parse_duration(body.every) if body.every else None,
                                at=_instant(body.at, body.tz) if body.at else None)
            return Job(name=body.name, owner=identity.name, agent=body.agent, agents=identity.agents_stamp(),
                       schedule=schedule,
                       owner_kind="" if identity.name == OWNER else "token",
                       message=body.message, session=body.session, deliver=body.deliver, catch_up=body.catch_up,
                       window_s=parse_duration(body.window), daily_usd=body.daily_usd)
        except ValidationError as exc:
            raise Refused(ErrorCode.INVALID_ARGUMENTS,
                          "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()[:5])) from None
        except ValueError as exc:
            raise Refused(ErrorCode.INVALID_ARGUMENTS, str(exc)) from None

    async def _own(self, request: Request) -> Job:
        """The job the request names: the caller's own, or (an operator's ``?owner=``) another identity's."""
        identity, name = caller(request), request.path_params["name"]
        owner = owner_meant(identity, request.query_params.get("owner"), "act on another identity's job")
        job = await self.store.get(f"{owner}/{name}")
        if job is None:
            where = " (pincer cron list shows yours)" if owner == identity.name else f" of {owner}'s"
            raise not_found(f"no job named {name!r}{where}")
        return job

    async def show(self, request: Request) -> Response:
        job = await self._own(request)
        return JSONResponse(as_json(job, next_due=await self.store.next_due(job.id)))

    async def remove(self, request: Request) -> Response:
        job = await self._own(request)
        await self.store.remove(job.id)
        return JSONResponse({"removed": job.id})

    async def runs(self, request: Request) -> Response:
        job = await self._own(request)
        try:
            limit = max(1, min(500, int(request.query_params.get("limit", "50"))))
        except ValueError:
            raise Refused(ErrorCode.INVALID_ARGUMENTS, "limit is a number of records (1 to 500)") from None
        found = await self.store.runs(job.id, limit=limit)
        return JSONResponse({"job": job.id, "runs": [run.model_dump() for run in found]})

    async def act(self, request: Request) -> Response:
        action = request.path_params["action"]
        if action not in ("pause", "resume", "run"):
            raise not_found(f"no action {action!r} on a job: pause, resume or run")
        job = await self._own(request)
        if action == "run":
            run = await self.run(caller(request), job)
            return JSONResponse(run.model_dump(), status_code=202)
        changed = await self.store.set_paused(job, action == "pause")
        return JSONResponse(as_json(changed, next_due=await self.store.next_due(job.id)))

    async def run(self, identity: Identity, job: Job) -> Run:
        """Start one run of the job now, admitted as any turn of the caller's is (``Refused`` if not)."""
        recorded: list[Run] = []

        async def record(message: ChatMessage) -> None:
            recorded.append(await self.store.record_hand_run(job, message))

        turn = await self.turns.start(identity, job.session_id, agent_id=job.agent, text=job.message,
                                      cancel_if_abandoned=False, job=job.id, prepare=record)
        self.turns.follow(turn, ended=self._pass_on)
        return recorded[0]

    async def _pass_on(self, end: Message) -> None:
        """A run's end, to the stream the scheduler records (and delivers) every job's outcome from."""
        if isinstance(end, (ChatReply, ChatError)):
            await self.turns.bus.publish(self.turns.bus.keys.jobs_results, end)


def _instant(text: str, tz: str) -> float:
    """An ISO 8601 moment; one without an offset is read in ``tz``."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"at is an ISO 8601 date and time such as 2026-12-24T18:00, got {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=ZoneInfo(tz))
    return moment.timestamp()
