"""The Gateway's HTTP API: send a chat message, read a transcript, decide approvals, check health.

Every route but ``/healthz`` runs behind ``gateway.server.guard.Guard`` (Host,
Origin, body size, token) and knows who is asking from
``request.state.identity``. A ``chat`` token sees only the sessions it
started; an ``operator`` token sees all. The OpenAI-compatible routes live in
``gateway.server.openai_api`` and run turns the same way (``gateway.turns.runner``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from bus import pool as ops
from bus.log import kv
from bus.metrics import Meter
from bus.presence import Presence, alive
from bus.protocol import (
    ApprovalRequest,
    ChatDelta,
    ChatError,
    ChatReply,
    ChatTool,
    ErrorCode,
    QuestionRequest,
)
from bus.replies import ReplyInbox
from bus.settings import RetentionSettings
from bus.streams import Bus
from gateway.config import GatewaySettings
from gateway.server.admin_api import AdminRoutes
from gateway.server.channels_api import ChannelRoutes
from gateway.server.connections import Connections
from gateway.server.errors import REDIS_AWAY, TURN_STATUS, error_response, refusal_response
from gateway.server.fanout import Fanout
from gateway.server.guard import Guard
from gateway.server.handling import caller, collect_or_cancel, credential, read_json, session_id_of
from gateway.server.hooks import Hooks, HookStore
from gateway.server.jobs_api import JobRoutes
from gateway.server.live import LiveSocket
from gateway.server.memory_api import MemoryRoutes, PoolRecall
from gateway.server.observe import metrics_text, readiness
from gateway.server.openai_api import OpenAIRoutes
from gateway.server.page import page_routes
from gateway.server.sessions_api import SessionRoutes
from gateway.server.spend_api import SpendRoutes
from gateway.tokens import TokenStore, WebSessions
from gateway.turns.events import parse_after
from gateway.turns.limits import CallerLimits, Hold
from gateway.turns.refusal import Refused, redis_away
from gateway.turns.runner import SendMessage, Turn, TurnRunner
from gateway.turns.session_names import path_of, shown_to
from memory.archive import SessionArchive
from memory.jobs import JobStore
from memory.longterm import LongTermMemory
from memory.retention import Archiver, RetentionLoop
from memory.session_index import catch_up_logged
from memory.sessions import SessionStore
from memory.spend import SpendView

log = logging.getLogger("gateway.http")
class Decide(BaseModel):
    model_config = ConfigDict(extra="forbid")

    decision: Literal["allow-once", "allow-always", "deny"]


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    answers: list[str | None]  # one per question, in order; null for one not answered yet


def _farewell(code: ErrorCode, message: str) -> dict[str, str]:
    """The last event of a stream whose connection ended (its token revoked, its lifetime over)."""
    return {"event": "error", "data": json.dumps({"code": code.value, "message": message})}


class Gateway:
    def __init__(self, bus: Bus, settings: GatewaySettings, *, instance_id: str, heartbeat_s: float = 3.0,
                 tokens: TokenStore | None = None, spend: SpendView | None = None,
                 channels: list[str] | None = None, archive: SessionArchive | None = None,
                 retention: RetentionSettings | None = None) -> None:
        self.bus, self.settings, self.instance_id = bus, settings, instance_id
        # Idle sessions archived to the data dir (memory/retention.py): still listed and readable here.
        self.archiver = Archiver(bus, archive) if archive is not None else None
        self.retention = RetentionLoop(self.archiver, retention, holder=instance_id) \
            if self.archiver is not None and retention is not None else None
        self.spend = spend or SpendView()  # the brain section's budgets, which /v1/spend reads against
        self.channels = channels or []  # the channels the config enables (/v1/channels lists them)
        self.inbox = ReplyInbox(bus, instance_id)
        self.sessions = SessionStore(bus.redis, bus.keys, batcher=bus.batcher)
        self.tokens = tokens or TokenStore(bus.redis, bus.keys, static=settings.static_token())
        self.web = WebSessions(bus.redis, bus.keys, self.tokens)
        self.limits = CallerLimits(bus, settings.limits)
        self.connections = Connections(self.tokens, self.web, max_life_s=settings.limits.max_connection_s)
        self.turns = TurnRunner(bus, self.inbox, self.sessions, self.limits, settings)
        self.hooks = Hooks(HookStore(bus.redis, bus.keys), self.turns, bus.redis, bus.keys)
        self.fanout = Fanout(bus, self.turns.log, instance_id=instance_id,
                             block_ms=int(settings.events.heartbeat_s * 1000))
        self.meter = Meter()
        self.presence = Presence(bus, "gateway", instance_id, interval_s=heartbeat_s,
                                 details=lambda: {"metrics": self.meter.snapshot()})

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        await self.inbox.start()
        await self.presence.start()
        await self.connections.start()
        if self.retention is not None:
            await self.retention.start()
        # In the background: with many sessions it takes a while, and lists read the pool's list meanwhile.
        indexing = asyncio.create_task(catch_up_logged(self.sessions.catch_up), name="session-index")
        try:
            yield
        finally:
            indexing.cancel()
            await asyncio.gather(indexing, return_exceptions=True)
            if self.retention is not None:
                await self.retention.close()
            await self.connections.close()
            await self.fanout.close()
            await self.hooks.close()
            await self.turns.close()
            await self.presence.stop()
            await self.inbox.close()

    def app(self) -> Starlette:
        middleware = [Middleware(Guard, settings=self.settings, tokens=self.tokens, meter=self.meter, web=self.web)]
        if self.settings.cors and self.settings.allowed_origins:
            # Outermost, so a browser's preflight (which carries no token) is answered before the guard.
            middleware.insert(0, Middleware(
                CORSMiddleware, allow_origins=self.settings.allowed_origins,
                allow_methods=["GET", "POST", "PATCH", "DELETE"],
                allow_headers=["Authorization", "Content-Type", "X-Pincer-Session", "X-OpenWebUI-Chat-Id",
                               "X-Conversation-Id", "Last-Event-ID"], max_age=600))
        return Starlette(
            routes=[
                Route("/v1/sessions/{session_id}/messages", self.post_message, methods=["POST"]),
                Route("/v1/sessions/{session_id}/cancel", self.cancel, methods=["POST"]),
                Route("/v1/sessions/{session_id}/events", self.session_events, methods=["GET"]),
                *SessionRoutes(self.bus, self.sessions, self.turns, self.archiver).routes(),
                Route("/v1/approvals/{approval_id}", self.decide, methods=["POST"]),
                Route("/v1/questions/{question_id}", self.answer, methods=["POST"]),
                Route("/v1/hooks/{name}", self.hook, methods=["POST"]),
                *OpenAIRoutes(self.settings.openai, self.turns, self.connections).routes(),
                *JobRoutes(JobStore(self.bus), self.turns, self.settings.limits.jobs).routes(),
                *MemoryRoutes(LongTermMemory(self.bus.redis, self.bus.keys),
                             PoolRecall(self.bus, self.inbox), limits=self.limits).routes(),
                *SpendRoutes(self.bus, self.spend).routes(),
                *ChannelRoutes(self.bus, self.channels).routes(),
                *AdminRoutes(self.bus, self.tokens, static_token=bool(self.settings.static_token())).routes(),
                WebSocketRoute("/v1/ws", self.live),
                Route("/v1/me", self.me, methods=["GET"]),
                Route("/v1/status", self.pool_status, methods=["GET"]),
                Route("/v1/login-links", self.login_link, methods=["POST"]),
                *page_routes(self.web),
                Route("/metrics", self.metrics, methods=["GET"]),
                Route("/readyz", self.readyz, methods=["GET"]),
                Route("/healthz", self.healthz, methods=["GET"]),
            ],
            middleware=middleware,
            exception_handlers={Refused: self._refused,  # type: ignore[dict-item]  # Starlette types handlers loosely
                                **dict.fromkeys(REDIS_AWAY, self._redis_away)},
            lifespan=self.lifespan,
        )

    async def post_message(self, request: Request) -> Response:
        session_id = session_id_of(request)
        identity = caller(request)
        body = await read_json(request, SendMessage, example='{"text": "hello"}')
        wants_stream = not body.detach and ("text/event-stream" in request.headers.get("accept", "") or
                                            request.query_params.get("stream") in ("1", "true"))
        options: dict[str, Any] = {"agent_id": body.agent_id, "text": body.text,
                                   "traceparent": request.headers.get("traceparent")}
        if body.detach:
            turn = await self.turns.start(identity, session_id, cancel_if_abandoned=False, **options)
            self.turns.follow(turn)
            return JSONResponse({"session_id": shown_to(identity, session_id), "message_id": turn.message.message_id,
                                 "seq": turn.message.seq, "events": path_of(identity, session_id, "/events")},
                                status_code=202)
        if wants_stream:  # the turn is closed after the stream, even one the client left before it began
            turn = await self.turns.start(identity, session_id, stream=True, **options)
            return EventSourceResponse(self.connections.stream(credential(request), self._sse(turn), _farewell),
                                       ping=15, background=BackgroundTask(turn.close))
        async with self.turns.started(identity, session_id, **options) as turn:
            return await collect_or_cancel(request, self._collect(turn))

    async def _collect(self, turn: Turn) -> Response:
        tools: list[dict[str, Any]] = []
        async for event in turn.events():
            if isinstance(event, ChatTool) and event.status == "finished":
                tools.append({"call_id": event.call_id, "tool": event.tool, "summary": event.summary,
                              **({"parent_call_id": event.parent_call_id} if event.parent_call_id else {})})
            elif isinstance(event, ChatReply):
                return JSONResponse({**event.model_dump(mode="json", exclude={"type"}), "tool_calls": tools})
            elif isinstance(event, ChatError):
                return error_response(TURN_STATUS.get(event.code, 502), event.code, event.message,
                                      session_id=turn.message.session_id, message_id=turn.message.message_id,
                                      tool_calls=tools)
        raise AssertionError("the event stream always ends with a reply or an error")

    async def _sse(self, turn: Turn) -> AsyncIterator[dict[str, str]]:
        names = {ChatDelta: "delta", ChatTool: "tool", ChatReply: "reply", ChatError: "error",
                 ApprovalRequest: "approval", QuestionRequest: "question"}
        try:
            async for event in turn.events():
                name = names.get(type(event))
                if name:
                    yield {"event": name, "data": json.dumps(event.model_dump(mode="json", exclude={"type"}))}
        finally:
            await turn.close()

    async def session_events(self, request: Request) -> Response:
        """The session's events over SSE, from ``Last-Event-ID`` (or ``?after=``; ``0``: all kept) or from now."""
        session_id = session_id_of(request)
        identity = caller(request)
        await self.turns.own_session(identity, session_id)
        raw = request.headers.get("last-event-id") or request.query_params.get("after")
        after = parse_after(raw)
        if raw and after is None:
            raise Refused(ErrorCode.INVALID_ARGUMENTS, f"Last-Event-ID {raw[:40]!r} is not an event id: send "
                          "the id of the last event you saw, or 0 for every event kept")
        hold = self.limits.hold_stream(identity.name)
        start = after or await self.turns.log.last_id(session_id)
        return EventSourceResponse(self.connections.stream(credential(request),
                                                           self._follow_log(session_id, start, hold), _farewell),
                                   ping=int(self.settings.events.heartbeat_s))

    async def _follow_log(self, session_id: str, after: str, hold: Hold) -> AsyncIterator[dict[str, str]]:
        try:
            async for item in self.fanout.subscribe(session_id, after).events():
                yield item.sse()
        finally:
            hold.release()

    async def cancel(self, request: Request) -> Response:
        """Stop the session's running turn (the Brain running it answers the turn with CANCELLED)."""
        session_id = session_id_of(request)
        identity = caller(request)
        await self.turns.own_session(identity, session_id)
        await self.turns.cancel(session_id, by=identity.name)
        return JSONResponse({"session_id": shown_to(identity, session_id), "cancel": "sent"}, status_code=202)

    async def hook(self, request: Request) -> Response:
        """A signed webhook: its turn started (202), its outcome delivered where the hook says."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.scope["headers"]}
        started = await self.hooks.receive(request.path_params["name"], headers, await request.body())
        return JSONResponse(started, status_code=202)

    async def decide(self, request: Request) -> Response:
        """Answer a pending exec approval of a session the caller owns (or any, for an operator)."""
        body = await read_json(request, Decide, example='{"decision": "allow-once"}')
        return JSONResponse(await self.turns.decide_approval(caller(request), request.path_params["approval_id"],
                                                       body.decision))

    async def answer(self, request: Request) -> Response:
        """Answer a pending ask_user question of a session the caller owns (or any, for an operator)."""
        body = await read_json(request, Answer, example='{"answers": ["yes"]}')
        return JSONResponse(await self.turns.answer_question(caller(request), request.path_params["question_id"],
                                                             body.answers))

    async def live(self, websocket: WebSocket) -> None:
        await LiveSocket(websocket, turns=self.turns, tokens=self.tokens, limits=self.limits,
                         connections=self.connections, fanout=self.fanout).serve()

    async def me(self, request: Request) -> Response:
        """Who the caller is and which agents it may use (the page's agent picker)."""
        identity = caller(request)
        return JSONResponse({"name": identity.name, "scope": identity.scope, "operator": identity.operator,
                             "agents": await self.turns.agents_for(identity)})

    async def pool_status(self, request: Request) -> Response:
        """What `pincer status --json` shows of the pool: workers, load, queues, dead letters (operators)."""
        if not caller(request).operator:
            raise Refused(ErrorCode.FORBIDDEN, "the pool's status needs an operator token")
        return JSONResponse(await ops.status(self.bus))

    async def login_link(self, request: Request) -> Response:
        """A one-time sign-in link for the browser, for the token this request carries (`pincer open`)."""
        _, _, token = request.headers.get("authorization", "").partition(" ")
        code = await self.web.link(token.strip())
        if code is None:
            raise Refused(ErrorCode.UNAUTHENTICATED, "a sign-in link is made with a bearer token; the browser "
                          "session itself cannot make one")
        return JSONResponse({"path": f"/login#code={code}", "expires_in": self.web.link_s})

    async def metrics(self, request: Request) -> Response:
        """The pool in Prometheus' text format; an operator's business unless gateway.metrics_public."""
        if not self.settings.metrics_public and not caller(request).operator:
            raise Refused(ErrorCode.FORBIDDEN, "/metrics needs an operator token "
                          "(`pincer token create NAME --scope operator`), or gateway.metrics_public: true")
        body, kind = await metrics_text(self.bus)
        return Response(body, media_type=kind)

    async def readyz(self, _request: Request) -> Response:
        """200 while this pool can take a turn: for load balancers and orchestrators (/healthz: alive)."""
        ready, body = await readiness(self.bus, max_backlog=self.settings.limits.max_inbox_backlog)
        return JSONResponse(body, status_code=200 if ready else 503)

    async def _refused(self, _request: Request, exc: Refused) -> Response:
        self.meter.count("pincer_gateway_refusals", exc.code.value)
        return refusal_response(exc)

    async def _redis_away(self, request: Request, exc: Exception) -> Response:
        log.warning("Redis did not answer %s: %s", kv(path=request.url.path), exc)
        return await self._refused(request, redis_away(exc))

    async def healthz(self, _request: Request) -> Response:
        try:
            await self.bus.redis.ping()
            brains, hands = await alive(self.bus, "brain"), await alive(self.bus, "hands")
        except Exception as exc:  # any Redis failure means "not healthy"; its text (an address) only in the log
            log.debug("healthz: Redis failed: %s", exc)  # probes come every few seconds: the roles log the outage
            return JSONResponse({"status": "down", "redis": f"error: {type(exc).__name__}"}, status_code=503)
        ok = bool(brains and hands)
        return JSONResponse(
            {"status": "ok" if ok else "degraded", "redis": "ok", "brains": len(brains), "hands": len(hands),
             "gateway": self.instance_id},
            status_code=200 if ok else 503,
        )
