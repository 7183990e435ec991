"""The OpenAI-compatible dialect: ``GET /v1/models`` and ``POST /v1/chat/completions``.

Any OpenAI client (the SDKs, Open WebUI, LibreChat) talks to the agent with
no glue. A model is an agent (``pincer`` is ``main``, ``pincer/<agent>`` the
others). Clients resend the whole conversation each turn: with a session
(a header, or the ``user`` field when configured) Pincer's transcript is the
record and only the last user message runs; without one, the messages are
the context of a fresh session that expires. Tool activity shows as one
line per call in the content and, for programs, in a ``pincer`` field of the
chunk. What Pincer cannot honour is refused with a 400, never ignored.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bus.protocol import (
    ApprovalRequest,
    ChatDelta,
    ChatError,
    ChatMessage,
    ChatReply,
    ChatTool,
    ErrorCode,
    QuestionRequest,
    new_id,
)
from gateway.server.errors import TURN_STATUS, error_body, error_response
from gateway.server.handling import caller, collect_or_cancel, credential, read_json
from gateway.turns.refusal import Refused, not_found
from gateway.turns.session_names import qualify, shown_to
from memory.sessions import TranscriptEntry, stored_bytes

if TYPE_CHECKING:
    from gateway.config import OpenAISettings
    from gateway.server.connections import Connections
    from gateway.turns.runner import Turn, TurnRunner

MODEL = "pincer"
SESSION_HEADERS = ("x-pincer-session", "x-openwebui-chat-id", "x-conversation-id")


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class InMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class CompletionRequest(BaseModel):
    # Sampling options (temperature, max_tokens, ...) are the agent's to choose; clients send them anyway.
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=200)
    messages: list[InMessage] = Field(min_length=1, max_length=10_000)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=256)
    n: int | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None


def agent_of(model: str) -> str | None:
    """``pincer`` -> ``main``, ``pincer/coder`` -> ``coder``; None for a model that is not ours."""
    if model == MODEL:
        return "main"
    prefix, _, agent = model.partition("/")
    return agent if prefix == MODEL and agent else None


def model_of(agent_id: str) -> str:
    return MODEL if agent_id == "main" else f"{MODEL}/{agent_id}"


def text_of(message: InMessage, index: int) -> str:
    """A message's text; parts that are not text cannot be honoured."""
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    texts = []
    for part in message.content:
        if part.type != "text" or part.text is None:
            raise Refused(ErrorCode.UNSUPPORTED, f"messages[{index}] has a {part.type!r} part; "
                          "Pincer's agents read text only (send text parts)")
        texts.append(part.text)
    return "\n".join(texts)


class OpenAIRoutes:
    def __init__(self, settings: OpenAISettings, turns: TurnRunner, connections: Connections) -> None:
        self.settings, self.turns, self.connections = settings, turns, connections

    def routes(self) -> list[Route]:
        return [
            Route("/v1/models", self.list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", self.get_model, methods=["GET"]),
            Route("/v1/chat/completions", self.complete, methods=["POST"]),
        ]

    async def list_models(self, request: Request) -> Response:
        agents = await self.turns.agents_for(caller(request))
        return JSONResponse({"object": "list", "data": sorted((_model(a) for a in agents), key=lambda m: m["id"])})

    async def get_model(self, request: Request) -> Response:
        model = request.path_params["model"]
        if agent_of(model) not in await self.turns.agents_for(caller(request)):
            raise _unknown_model(model)
        return JSONResponse(_model(agent_of(model) or "main"))

    async def complete(self, request: Request) -> Response:
        identity = caller(request)
        body = await read_json(request, CompletionRequest, example='{"model": "pincer", "messages": [...]}')
        _refuse_unsupported(body)
        agent_id = agent_of(body.model)
        if agent_id is None or not identity.may_use(agent_id):
            raise _unknown_model(body.model)
        system = "\n\n".join(text_of(m, i) for i, m in enumerate(body.messages) if m.role in ("system", "developer"))
        turns = [(i, m) for i, m in enumerate(body.messages) if m.role not in ("system", "developer")]
        if not turns or turns[-1][1].role != "user":
            raise Refused(ErrorCode.INVALID_ARGUMENTS, "the last message must be the user's (role \"user\")")
        text = text_of(turns[-1][1], turns[-1][0])
        if not text.strip():
            raise Refused(ErrorCode.INVALID_ARGUMENTS, "the last user message has no text")
        name = self._session_of(request, body)
        ephemeral = name is None
        session_id = qualify(identity, name or f"oai-{new_id()}", request.query_params.get("owner"))
        context = [_entry(m, i) for i, m in turns[:-1]]
        ttl = self.settings.ephemeral_ttl_s if ephemeral else 0
        sessions = self.turns.sessions
        new = ephemeral or not await sessions.exists(session_id)

        async def history(_message: ChatMessage) -> None:
            if new and context:  # the client's earlier messages are the new session's history
                await sessions.append(session_id, *context)
                if ephemeral:
                    await sessions.expire(session_id, ttl)

        written = stored_bytes(context) if new else 0
        options: dict[str, Any] = {"agent_id": agent_id, "text": text, "instructions": system or None, "ttl_s": ttl,
                                   "traceparent": request.headers.get("traceparent"), "prepare": history,
                                   "history_bytes": written}
        shown = shown_to(identity, session_id)
        headers = {"X-Pincer-Session": shown}
        if body.stream:  # the turn is closed after the stream, even one the client left before it began
            turn = await self.turns.start(identity, session_id, stream=True, **options)
            chunks = _Turn(self, turn, body, ttl=ttl, shown=shown).stream()
            return EventSourceResponse(self.connections.stream(credential(request), chunks, _farewell), ping=15,
                                       headers=headers, background=BackgroundTask(turn.close))
        async with self.turns.started(identity, session_id, **options) as turn:
            response = await collect_or_cancel(request, _Turn(self, turn, body, ttl=ttl, shown=shown).collect())
        response.headers.update(headers)
        return response

    def _session_of(self, request: Request, body: CompletionRequest) -> str | None:
        for header in SESSION_HEADERS:
            value = request.headers.get(header, "").strip()
            if value:
                return value
        if self.settings.session_from_user and body.user:
            # Any text may be a user name; the session id is its digest (stable, and always a valid id).
            return "user-" + hashlib.sha256(body.user.encode()).hexdigest()[:32]
        return None


def _farewell(code: ErrorCode, message: str) -> dict[str, str]:
    """The last chunk of a stream whose connection ended: an error as OpenAI streams send one."""
    return _data(error_body(401 if code is ErrorCode.UNAUTHENTICATED else 504, code, message))


class _Turn:
    """One completion: the turn's events in OpenAI's shapes."""

    def __init__(self, routes: OpenAIRoutes, turn: Turn, body: CompletionRequest, *, ttl: int, shown: str) -> None:
        self.routes, self.turn, self.message, self.body, self.ttl = routes, turn, turn.message, body, ttl
        self.shown = shown  # the session as the client names it
        self.id = f"chatcmpl-{turn.message.message_id}"
        self.created = int(time.time())
        self.inline = routes.settings.show_tools == "inline"
        self.started: dict[str, str] = {}  # call id -> what the call was about
        self.line_open = False  # the content shown so far does not end a line

    async def collect(self) -> Response:
        content: list[str] = []
        tools: list[dict[str, Any]] = []
        try:
            async for event in self.turn.events():
                if isinstance(event, (ChatTool, ApprovalRequest, QuestionRequest)):
                    line, extension = self._tool(event)
                    content.append(line)
                    if isinstance(event, ChatTool) and event.status == "finished":
                        tools.append(extension["tool"])
                elif isinstance(event, ChatReply):
                    content.append(event.text)
                    return JSONResponse({
                        "id": self.id, "object": "chat.completion", "created": self.created,
                        "model": self.body.model,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(content)},
                                     "logprobs": None, "finish_reason": "stop"}],
                        "usage": _usage(event.usage),
                        "pincer": {"session_id": self.shown, "message_id": self.message.message_id,
                                   "tool_calls": tools},
                    })
                elif isinstance(event, ChatError):
                    return error_response(TURN_STATUS.get(event.code, 502), event.code, event.message)
        finally:
            await self._expire()
        raise AssertionError("the event stream always ends with a reply or an error")

    async def stream(self) -> AsyncIterator[dict[str, str]]:
        include_usage = bool(self.body.stream_options and self.body.stream_options.include_usage)
        try:
            yield self._chunk({"role": "assistant", "content": ""}, include_usage=include_usage)
            async for event in self.turn.events():
                if isinstance(event, ChatDelta) and event.text:
                    self.line_open = not event.text.endswith("\n")
                    yield self._chunk({"content": event.text}, include_usage=include_usage)
                elif isinstance(event, (ChatTool, ApprovalRequest, QuestionRequest)):
                    line, extension = self._tool(event)
                    yield self._chunk({"content": line} if line else {}, include_usage=include_usage,
                                      pincer=extension)
                elif isinstance(event, ChatReply):
                    yield self._chunk({}, finish="stop", include_usage=include_usage)
                    if include_usage:
                        yield _data({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                     "model": self.body.model, "choices": [], "usage": _usage(event.usage)})
                elif isinstance(event, ChatError):
                    yield _data(error_body(TURN_STATUS.get(event.code, 502), event.code, event.message))
            yield {"data": "[DONE]"}
        finally:
            await self.turn.close()
            await self._expire()

    def _tool(self, event: ChatTool | ApprovalRequest | QuestionRequest) -> tuple[str, dict[str, Any]]:
        """The readable line (maybe empty) and the machine-readable extension for a tool event."""
        if isinstance(event, QuestionRequest):
            extension = {"question": {"question_id": event.question_id, "expires_at": event.expires_at,
                                      "questions": [q.model_dump() for q in event.questions]}}
            asked = " / ".join(_one_line(q.text) + (f" [{', '.join(q.choices)}]" if q.choices else "")
                               for q in event.questions)
            return self._line(f"❓ {asked} (POST /v1/questions/{event.question_id})"), extension
        if isinstance(event, ApprovalRequest):
            extension = {"approval": {"approval_id": event.approval_id, "tool": event.tool,
                                      "summary": event.summary, "expires_at": event.expires_at}}
            return self._line(f"⏸ {event.tool} waits for approval: {_one_line(event.summary)} "
                              f"(POST /v1/approvals/{event.approval_id})"), extension
        extension = {"tool": {"call_id": event.call_id, "tool": event.tool, "status": event.status,
                              "summary": event.summary,
                              **({"parent_call_id": event.parent_call_id} if event.parent_call_id else {})}}
        if event.status == "started":
            self.started[event.call_id] = event.summary
        if event.status != "finished":
            return "", extension
        about = _one_line(self.started.pop(event.call_id, "")) or event.tool  # e.g. read_file({"path": "a.txt"})
        outcome = "ok" if event.summary == "ok" else f"failed: {_one_line(event.summary)}"
        nested = "↳ " if event.parent_call_id else ""  # a sub-agent's call, under its delegate line
        return self._line(f"{nested}🔧 {about} → {outcome}"), extension

    def _line(self, text: str) -> str:
        if not self.inline:
            return ""
        line = ("\n" if self.line_open else "") + text + "\n\n"
        self.line_open = False
        return line

    def _chunk(self, delta: dict[str, Any], *, finish: str | None = None, include_usage: bool = False,
               pincer: dict[str, Any] | None = None) -> dict[str, str]:
        chunk: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                 "model": self.body.model,
                                 "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            chunk["usage"] = None
        if pincer:
            chunk["pincer"] = pincer
        return _data(chunk)

    async def _expire(self) -> None:
        if self.ttl:  # the session the client did not name lapses ttl after its last turn
            await self.routes.turns.sessions.expire(self.message.session_id, self.ttl)


def _refuse_unsupported(body: CompletionRequest) -> None:
    if body.tools or body.functions:
        raise Refused(ErrorCode.UNSUPPORTED, "client-side tools are not supported: Pincer's agent runs its "
                      "own tools (see GET /v1/models and `pincer tools`); send the request without `tools`")
    if body.n not in (None, 1):
        raise Refused(ErrorCode.UNSUPPORTED, f"n={body.n}: Pincer runs one turn per request (n must be 1)")
    for index, message in enumerate(body.messages):
        if message.role in ("tool", "function"):
            raise Refused(ErrorCode.UNSUPPORTED, f"messages[{index}] has role {message.role!r}: "
                          "client-side tool results are not supported")


def _entry(message: InMessage, index: int) -> TranscriptEntry:
    role: Literal["user", "assistant"] = "user" if message.role == "user" else "assistant"
    return TranscriptEntry(role=role, content=text_of(message, index), metadata={"from_client": True})


def _model(agent_id: str) -> dict[str, Any]:
    return {"id": model_of(agent_id), "object": "model", "created": 0, "owned_by": "pincer"}


def _unknown_model(model: str) -> Refused:
    refusal = not_found(f"the model {model!r} does not exist: models are `pincer` and `pincer/<agent>` "
                        "(GET /v1/models lists the ones this token may use)")
    return refusal


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": int(usage.get("total_tokens") or prompt + completion)}


def _one_line(text: str, limit: int = 120) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _data(payload: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(payload, ensure_ascii=False)}
