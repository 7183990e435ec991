"""The local model as an OpenAI-compatible server on loopback, which the Brain uses like any provider.

``POST /v1/chat/completions`` (streamed or not) and ``GET /v1/models``. The
prompt is the model's own chat template (``localmodel/chat.py``); the model
runs one generation at a time in a thread, so the event loop stays free. A
reply the handler finds wrong (``chat.review``: only tools that were not
offered, arguments that do not fit, the call just answered made again, a tool
named instead of called) is generated once more with a note saying what was
wrong; calls to tools that were not offered never reach the caller (twice
over, the answer is text saying so), the rest goes out as the second try
gives it.

Only the Brain that `pincer up` started may use it: every request carries
the key made for this start (``Authorization: Bearer``; it reaches the server
and the Brain through their environments, never a command line), names
this server in ``Host`` (a DNS-rebinding page names its own), and sends JSON
of at most ``MAX_BODY`` bytes; ``max_tokens`` is held to ``MAX_TOKENS_CAP``.
So no web page or other local user can hold the model, read its answers or
change the prompt prefix it keeps warm.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bus.private_file import write_private
from localmodel import KEY_VARIABLE
from localmodel.chat import Reply, TemplateFailed, parse, prompt_prefix, render, review

MAX_TOKENS = 1024
MAX_TOKENS_CAP = 4096  # what one answer may ask for at most: a caller cannot hold the model for long
MAX_BODY = 4 << 20  # a whole conversation in the context window is far less
HOSTS = frozenset({"127.0.0.1", "localhost"})
log = logging.getLogger("localmodel")


@dataclass(frozen=True)
class Generated:
    text: str
    prompt_tokens: int
    completion_tokens: int


class Generator(Protocol):
    """What runs the model: llama.cpp in the server, a script in the tests."""

    name: str
    template: str
    stop: list[str]

    def generate(self, prompt: str, *, max_tokens: int, temperature: float) -> Generated: ...

    def warm(self, prompt: str) -> None:
        """Read ``prompt`` into the model's cache, for a later prompt that starts with it."""


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI's other knobs are accepted and not used

    model: str = ""
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1, le=8192)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=8192)
    temperature: float = Field(default=0.0, ge=0, le=2)  # greedy unless asked: steadier tool calls


class LocalModelServer:
    """``warm_file``: where the last prompt's prefix (system message and tools, no conversation) is kept,
    to be read into the model's cache when the server starts again: the first reply after a restart then
    skips reading it (~40 s for Pincer's built-ins on 2 cores)."""

    def __init__(self, generator: Generator, *, key: str, warm_file: Path | None = None) -> None:
        if len(key) < 16:
            raise ValueError(f"the local model's server needs a key of 16 characters or more (${KEY_VARIABLE})")
        self.generator, self.warm_file, self.key = generator, warm_file, key
        self._one_at_a_time = asyncio.Lock()
        self._kept_prefix: str | None = None

    def app(self) -> Starlette:
        @contextlib.asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            warming = asyncio.create_task(self._warm_up())  # in the background: /v1/models answers meanwhile
            yield
            warming.cancel()

        return Starlette(routes=[Route("/v1/chat/completions", self.completions, methods=["POST"]),
                                 Route("/v1/models", self.models, methods=["GET"])], lifespan=lifespan)

    async def _warm_up(self) -> None:
        try:
            prefix = self.warm_file.read_text() if self.warm_file and self.warm_file.is_file() else ""
            if prefix:
                self._kept_prefix = prefix
                async with self._one_at_a_time:  # a request arriving meanwhile waits, then finds it read
                    started = time.monotonic()
                    await asyncio.to_thread(self.generator.warm, prefix)
                log.info("read last run's prompt prefix ahead (%d chars, %.1f s)", len(prefix),
                         time.monotonic() - started)
        except Exception as exc:  # best effort: the first request reads it then
            log.warning("prompt prefix not read ahead: %s", exc)

    async def _keep_prefix(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
        if self.warm_file is None:
            return
        prefix = prompt_prefix(self.generator.template, messages, tools)
        if prefix and prefix != self._kept_prefix:
            self._kept_prefix = prefix
            try:  # private: the system message may hold the agent's notes
                await asyncio.to_thread(write_private, self.warm_file, prefix)
            except OSError as exc:
                log.warning("prompt prefix not kept in %s: %s", self.warm_file, exc)

    def _refusal(self, request: Request) -> Response | None:
        """Why this request is not the Brain's (None: it is)."""
        host = request.headers.get("host", "").rsplit(":", 1)[0].lower()
        if host not in HOSTS:
            return _error(403, f"this server answers only for 127.0.0.1 and localhost, not {host[:64]!r}")
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), self.key.encode()):
            return _error(401, "this is Pincer's local model: only the Brain that `pincer up` started may use it")
        return None

    async def _body(self, request: Request) -> bytes | Response:
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind != "application/json":
            return _error(415, f"send JSON (Content-Type: application/json), not {kind or 'nothing'!r}")
        declared = request.headers.get("content-length", "")
        if declared and (not declared.isdigit() or int(declared) > MAX_BODY):
            return _error(413, f"a request may hold at most {MAX_BODY:,} bytes")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                return _error(413, f"a request may hold at most {MAX_BODY:,} bytes")
        return bytes(body)

    async def models(self, request: Request) -> Response:
        if (refused := self._refusal(request)) is not None:
            return refused
        return JSONResponse({"object": "list", "data": [{"id": self.generator.name, "object": "model",
                                                         "owned_by": "local"}]})

    async def completions(self, request: Request) -> Response:
        if (refused := self._refusal(request)) is not None:
            return refused
        raw = await self._body(request)
        if isinstance(raw, Response):
            return raw
        try:
            body = CompletionRequest.model_validate(json.loads(raw))
        except (ValueError, ValidationError) as exc:
            return _error(400, f"not a chat completion request: {exc}")
        tools = body.tools if body.tool_choice != "none" else None
        offered = {t.get("function", {}).get("name") for t in tools or []} - {None}
        limit = min(body.max_completion_tokens or body.max_tokens or MAX_TOKENS, MAX_TOKENS_CAP)
        try:
            reply, usage = await self._reply(body.messages, tools, offered, limit, body.temperature)
            await self._keep_prefix(body.messages, tools)
        except TemplateFailed as exc:
            return _error(400, str(exc))
        answer_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        finish = "tool_calls" if reply.tool_calls else "stop"
        if body.stream:
            return EventSourceResponse(self._chunks(answer_id, created, reply, finish, usage))
        message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        return JSONResponse({"id": answer_id, "object": "chat.completion", "created": created,
                             "model": self.generator.name, "usage": usage,
                             "choices": [{"index": 0, "message": message, "finish_reason": finish}]})

    async def _reply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, offered: set[str],
                     limit: int, temperature: float) -> tuple[Reply, dict[str, int]]:
        used = {"prompt_tokens": 0, "completion_tokens": 0}
        asked = messages
        for attempt in range(2):
            prompt = render(self.generator.template, asked, tools)
            async with self._one_at_a_time:
                generated = await asyncio.to_thread(self.generator.generate, prompt, max_tokens=limit,
                                                    temperature=temperature)
            used["prompt_tokens"] += generated.prompt_tokens
            used["completion_tokens"] += generated.completion_tokens
            reply = parse(generated.text, offered)
            note = review(reply, messages, tools)
            if note is None:
                break
            log.info("asking again (attempt %d): %s", attempt + 1, note)
            if attempt == 0:  # once more, told what was wrong
                asked = [*messages, {"role": "system", "content": note}]
            elif reply.refused and not reply.tool_calls:  # only invented tools, twice: said in words, never passed on
                reply = Reply(content="I could not use the tools I meant to: " + "; ".join(reply.refused) + ".")
        return reply, {**used, "total_tokens": used["prompt_tokens"] + used["completion_tokens"]}

    async def _chunks(self, answer_id: str, created: int, reply: Reply, finish: str,
                      usage: dict[str, int]) -> AsyncIterator[str]:
        def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> str:
            return json.dumps({"id": answer_id, "object": "chat.completion.chunk", "created": created,
                               "model": self.generator.name, **extra,
                               "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})

        yield chunk({"role": "assistant", "content": ""})
        if reply.content:
            yield chunk({"content": reply.content})
        for index, call in enumerate(reply.tool_calls):
            yield chunk({"tool_calls": [{"index": index, **call}]})
        yield chunk({}, finish, usage=usage)
        yield "[DONE]"


def _error(status: int, message: str) -> Response:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": None}},
                        status_code=status)
