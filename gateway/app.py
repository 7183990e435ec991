"""The Gateway's HTTP API: send a chat message, read a transcript, check health."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bus.log import kv
from bus.presence import Presence, alive
from bus.protocol import (
    ApprovalDecision,
    ApprovalRequest,
    ChatCancel,
    ChatDelta,
    ChatError,
    ChatMessage,
    ChatReply,
    ChatTool,
    ErrorCode,
    Message,
)
from bus.replies import ReplyInbox
from bus.streams import Bus
from gateway.config import GatewaySettings
from memory.sessions import SessionStore

log = logging.getLogger("gateway.http")

SESSION_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
ERROR_STATUS = {
    ErrorCode.MODEL_NOT_CONFIGURED: 503,
    ErrorCode.SERVICE_UNAVAILABLE: 503,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.TIMEOUT: 504,
}


class SendMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=200_000)
    agent_id: str = Field(default="main", pattern=r"^[A-Za-z0-9_-]{1,64}$")


class Decide(BaseModel):
    model_config = ConfigDict(extra="forbid")

    decision: Literal["allow-once", "allow-always", "deny"]
    by: str = Field(default="", max_length=200)


class _Session(BaseModel):
    session_id: str = Field(pattern=SESSION_ID)


class Gateway:
    def __init__(self, bus: Bus, settings: GatewaySettings, *, instance_id: str, heartbeat_s: float = 3.0) -> None:
        self.bus, self.settings, self.instance_id = bus, settings, instance_id
        self.inbox = ReplyInbox(bus, instance_id)
        self.sessions = SessionStore(bus.redis, bus.keys)
        self.presence = Presence(bus, "gateway", instance_id, interval_s=heartbeat_s)

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        await self.inbox.start()
        await self.presence.start()
        try:
            yield
        finally:
            await self.presence.stop()
            await self.inbox.close()

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/sessions/{session_id}/messages", self.post_message, methods=["POST"]),
                Route("/v1/sessions/{session_id}/cancel", self.cancel, methods=["POST"]),
                Route("/v1/sessions/{session_id}", self.get_session, methods=["GET"]),
                Route("/v1/sessions/{session_id}", self.delete_session, methods=["DELETE"]),
                Route("/v1/sessions", self.list_sessions, methods=["GET"]),
                Route("/v1/approvals/{approval_id}", self.decide, methods=["POST"]),
                Route("/healthz", self.healthz, methods=["GET"]),
            ],
            lifespan=self.lifespan,
        )

    async def post_message(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        problem = _check_session(session_id)
        if problem:
            return problem
        try:
            body = SendMessage.model_validate_json(await request.body())
        except ValidationError as exc:
            return _bad_request(exc)
        brains = await alive(self.bus, "brain")
        if not brains:
            return _error(503, ErrorCode.SERVICE_UNAVAILABLE,
                          "no Brain is running to answer; start one with `pincer brain` (or `pincer up`)")
        message = ChatMessage(session_id=session_id, agent_id=body.agent_id, text=body.text,
                              reply_to=self.inbox.stream, seq=await self.sessions.next_seq(session_id))
        log.info("message in %s", kv(session=session_id, message=message.message_id))
        wants_stream = "text/event-stream" in request.headers.get("accept", "") or \
            request.query_params.get("stream") in ("1", "true")
        if wants_stream:
            return EventSourceResponse(self._sse(message), ping=15)
        return await self._collect(message)

    async def _events(self, message: ChatMessage) -> AsyncIterator[Message]:
        """Every event of one turn, ending with its reply or error (or a Gateway-side timeout)."""
        async with self.inbox.expect(message.message_id) as queue:
            await self.bus.publish(self.bus.keys.brain_inbox, message)
            try:
                async with asyncio.timeout(self.settings.turn_timeout_s):
                    while True:
                        event = await queue.get()
                        yield event
                        if isinstance(event, (ChatReply, ChatError)):
                            return
            except TimeoutError:
                yield ChatError(session_id=message.session_id, message_id=message.message_id,
                                code=ErrorCode.TIMEOUT,
                                message=f"no answer from the Brain within {self.settings.turn_timeout_s:g}s "
                                        "(gateway.turn_timeout_s)")

    async def _collect(self, message: ChatMessage) -> Response:
        tools: list[dict[str, Any]] = []
        async for event in self._events(message):
            if isinstance(event, ChatTool) and event.status == "finished":
                tools.append({"call_id": event.call_id, "tool": event.tool, "summary": event.summary})
            elif isinstance(event, ChatReply):
                return JSONResponse({**event.model_dump(mode="json", exclude={"type"}), "tool_calls": tools})
            elif isinstance(event, ChatError):
                status = ERROR_STATUS.get(event.code, 502)
                return _error(status, event.code, event.message, session_id=message.session_id,
                              message_id=message.message_id, tool_calls=tools)
        raise AssertionError("the event stream always ends with a reply or an error")

    async def _sse(self, message: ChatMessage) -> AsyncIterator[dict[str, str]]:
        names = {ChatDelta: "delta", ChatTool: "tool", ChatReply: "reply", ChatError: "error",
                 ApprovalRequest: "approval"}
        async for event in self._events(message):
            name = names.get(type(event))
            if name:
                yield {"event": name, "data": json.dumps(event.model_dump(mode="json", exclude={"type"}))}

    async def cancel(self, request: Request) -> Response:
        """Stop the session's running turn (the Brain running it answers the turn with CANCELLED)."""
        session_id = request.path_params["session_id"]
        problem = _check_session(session_id)
        if problem:
            return problem
        await self.bus.publish(self.bus.keys.brain_control, ChatCancel(session_id=session_id, by="the person"))
        log.info("cancel asked %s", kv(session=session_id))
        return JSONResponse({"session_id": session_id, "cancel": "sent"}, status_code=202)

    async def decide(self, request: Request) -> Response:
        """Answer a pending exec approval; the first answer wins."""
        approval_id = request.path_params["approval_id"]
        try:
            body = Decide.model_validate_json(await request.body())
        except ValidationError as exc:
            return _bad_request(exc)
        key = self.bus.keys.approval(approval_id)
        async with self.bus.redis.pipeline(transaction=True) as pipe:
            pipe.hget(key, "reply_to")
            pipe.delete(key)
            reply_to, deleted = await pipe.execute()
        if not deleted or not reply_to:
            return _error(404, "NOT_FOUND", f"no pending approval {approval_id!r}: it was answered, or it expired")
        await self.bus.publish(reply_to.decode(), ApprovalDecision(approval_id=approval_id, decision=body.decision,
                                                                   by=body.by or "gateway"))
        log.info("approval decided %s", kv(approval=approval_id, decision=body.decision))
        return JSONResponse({"approval_id": approval_id, "decision": body.decision})

    async def get_session(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        missing = await self._missing_session(session_id)
        if missing:
            return missing
        entries = await self.sessions.load(session_id)
        return JSONResponse({"session_id": session_id,
                             "entries": [e.model_dump(mode="json", exclude_none=True) for e in entries]})

    async def _missing_session(self, session_id: str) -> Response | None:
        """A 400 or 404 answer when the id is bad or the session does not exist; None when it does."""
        problem = _check_session(session_id)
        if problem:
            return problem
        if not await self.sessions.exists(session_id):
            return _error(404, "NOT_FOUND", f"no session {session_id!r}")
        return None

    async def delete_session(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        missing = await self._missing_session(session_id)
        if missing:
            return missing
        await self.sessions.delete(session_id)
        log.info("session deleted %s", kv(session=session_id))
        return JSONResponse({"session_id": session_id, "deleted": True})

    async def list_sessions(self, _request: Request) -> Response:
        return JSONResponse({"sessions": await self.sessions.list_sessions()})

    async def healthz(self, _request: Request) -> Response:
        try:
            await self.bus.redis.ping()
            brains, hands = await alive(self.bus, "brain"), await alive(self.bus, "hands")
        except Exception as exc:  # any Redis failure means "not healthy", with the reason
            return JSONResponse({"status": "down", "redis": f"error: {exc}"}, status_code=503)
        ok = bool(brains and hands)
        return JSONResponse(
            {"status": "ok" if ok else "degraded", "redis": "ok", "brains": len(brains), "hands": len(hands),
             "gateway": self.instance_id},
            status_code=200 if ok else 503,
        )


def _check_session(session_id: str) -> Response | None:
    try:
        _Session(session_id=session_id)
    except ValidationError:
        return _error(400, "BAD_REQUEST", "session ids are 1-128 characters: letters, digits and _ . : - "
                                 "(starting with a letter or digit)")
    return None


def _bad_request(exc: ValidationError) -> Response:
    lines = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()]
    return _error(400, ErrorCode.INVALID_ARGUMENTS,
                  "bad request body (expected JSON like {\"text\": \"hello\"}): " + "; ".join(lines))


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    body = {"error": {"code": str(code), "message": message}, **extra}
    return JSONResponse(body, status_code=status)
