"""The LLM seam: stream one completion with tools; litellm is the real implementation.

litellm errors are translated here, at the edge, into ``LLMError`` with a code
from the wire's enum and a message a person can act on. Each request sent is an
``Attempt`` the caller is told of as it streams (retries are made here, never
inside litellm or the SDK, so that each one is counted and priced).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import re
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from brain.prompt import cache_marked, takes_cache_marks
from bus.errors import PincerError
from bus.identity import ByIdentity
from bus.protocol import ErrorCode, ToolSpec

if TYPE_CHECKING:
    from brain.openai_wire import OpenAIWire

# Keep litellm from fetching its price table from the internet at import time.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# When no model is configured, the first provider key found picks a sensible default.
PROVIDER_DEFAULTS = (
    ("OPENAI_API_KEY", "openai/gpt-4o-mini"),
    ("ANTHROPIC_API_KEY", "anthropic/claude-3-5-haiku-latest"),
    ("GEMINI_API_KEY", "gemini/gemini-2.0-flash"),
    ("GROQ_API_KEY", "groq/llama-3.3-70b-versatile"),
)

NOT_CONFIGURED = (
    "No LLM model is configured. Either set PINCER_MODEL to any litellm model string (e.g. openai/gpt-4o-mini) "
    "and the provider's key (e.g. OPENAI_API_KEY), or brain.model in config.yaml; or, for a local "
    "OpenAI-compatible server, also set PINCER_LLM_API_BASE (e.g. http://127.0.0.1:11434/v1); or run "
    "`pincer up --local-model` for a small model on this machine with no key (its first start fetches "
    "about 1.1 GB and builds llama.cpp's bindings, about 5 minutes; brain.model: local is served by `pincer up`)."
)
LOCAL = "local"  # brain.model: the local model, which only `pincer up` serves (it gives the Brain its address)


class LLMError(PincerError):
    def __init__(self, code: ErrorCode, message: str, *, overflow: bool = False) -> None:
        super().__init__(message)
        self.code, self.message = code, message
        self.overflow = overflow  # the provider said the conversation is longer than the model's window


log = logging.getLogger("brain.llm")

@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Attempt:
    """One request of a call to a provider (a retry or a fallback is another), kept up to date as it streams:
    what settles its cost when the provider's own usage never comes (a cancel, a deadline, a broken stream)."""

    model: str
    usage: dict[str, Any] = field(default_factory=dict)  # the provider's counts, once they came
    streamed: list[str] = field(default_factory=list)  # the text, tool names and arguments received so far
    unsent: bool = False  # provably never reached the provider: no connection to it was ever made
    first_at: float = 0.0  # monotonic time of the first piece received (the flight record's time to first token)

    def received(self, piece: str | None) -> None:
        if piece:
            self.first_at = self.first_at or time.monotonic()
            self.streamed.append(piece)


@dataclass
class Completion:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    model: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    tried: list[str] = field(default_factory=list)  # models that failed before this one answered
    finish_reason: str = ""  # the provider's: stop, tool_calls, length, content_filter


OnText = Callable[[str], Awaitable[None]]


class LLMClient(Protocol):
    async def complete(self, messages: list[dict[str, Any]], tools: list[ToolSpec], on_text: OnText, *,
                       max_output_tokens: int | None = None, attempts: list[Attempt] | None = None) -> Completion:
        """One completion; ``max_output_tokens`` (sent as max_tokens) bounds what it may write. Each request
        it sends is appended to ``attempts`` before it is sent, and kept up to date, whatever happens next."""
        ...


def resolve_model(configured: str, env: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    if configured == LOCAL:
        return None  # not served here: `pincer up` hands the Brain the local server's address instead
    if configured:
        return configured
    return next((model for key, model in PROVIDER_DEFAULTS if env.get(key)), None)


FALLBACK_ON = frozenset({ErrorCode.RATE_LIMITED, ErrorCode.SERVICE_UNAVAILABLE, ErrorCode.TIMEOUT})
RETRY_PAUSE_S, RETRY_PAUSE_MAX_S = 0.5, 8.0  # before a model's next try: doubling, as the openai SDK waits


def retry_pause(tried: int) -> float:
    """The pause before a model's try number ``tried + 1`` (the first retry waits RETRY_PAUSE_S)."""
    return float(min(RETRY_PAUSE_S * 2**tried, RETRY_PAUSE_MAX_S))


class LiteLLMClient:
    """Any provider through litellm; ``openai/`` models, with ``openai_direct``, as the same request straight
    over aiohttp (brain.openai_wire): litellm's wrapper cost ~8 ms of CPU a call, the openai SDK ~24 MB."""

    def __init__(self, *, model: str, api_base: str | None, api_key: str | None, timeout_s: float,
                 retries: int, fallbacks: list[str] | None = None, openai_direct: bool = False,
                 connect_patience_s: float = 0.0, prompt_cache: bool = True, connections: int = 256) -> None:
        self.model, self.api_base, self.api_key = model, api_base, api_key
        # Requests it may have open at once (brain.max_turns): its connection pool's size, not the SDK's choice.
        self.connections = connections
        self.prompt_cache = prompt_cache  # mark the stable head for the providers that cache only where marked
        self.timeout_s, self.retries, self.connect_patience_s = timeout_s, retries, connect_patience_s
        self.fallbacks = fallbacks or []
        self.openai_direct = openai_direct
        self._wire: OpenAIWire | None = None  # one pool for every direct call

    async def close(self) -> None:
        """Its connections closed (the direct road's pool; litellm keeps its own)."""
        if self._wire is not None:
            await self._wire.close()

    async def complete(self, messages: list[dict[str, Any]], tools: list[ToolSpec], on_text: OnText, *,
                       max_output_tokens: int | None = None, attempts: list[Attempt] | None = None) -> Completion:
        """The first model (then each fallback) that answers, each tried ``retries`` more times after an outage
        (and, while a try never reached it, again for up to ``connect_patience_s`` first); other errors do not
        move on."""
        attempts = [] if attempts is None else attempts
        failures: list[str] = []
        for model in [self.model, *self.fallbacks]:
            failure, tried, refused, patient_until = "", 0, 0, time.monotonic() + self.connect_patience_s
            while tried <= self.retries:
                attempt = Attempt(model=model)
                attempts.append(attempt)
                try:
                    done = await self._complete(model, messages, tools, on_text, max_output_tokens, attempt)
                except LLMError as exc:
                    if exc.code not in FALLBACK_ON or attempt.streamed:
                        raise  # a bad request or key is not fixed by another try; half an answer cannot be redone
                    failure = f"{model}: {exc.message}"
                    pause = retry_pause(refused if attempt.unsent else tried)
                    if attempt.unsent and time.monotonic() + pause < patient_until:
                        refused += 1  # free (never sent): not one of the retries
                        log.info("model not reachable, trying again in %.1fs (never sent, so free): %s", pause,
                                 failure)
                    else:
                        tried += 1
                        pause = retry_pause(tried - 1)
                    if tried <= self.retries:
                        await asyncio.sleep(pause)
                    continue
                done.model = done.model or model
                done.tried = failures
                return done
            failures.append(failure)
        raise LLMError(ErrorCode.SERVICE_UNAVAILABLE, "every model failed: " + " | ".join(failures))

    async def _complete(self, model: str, messages: list[dict[str, Any]], tools: list[ToolSpec],
                        on_text: OnText, max_output_tokens: int | None, attempt: Attempt) -> Completion:
        kwargs = self.request(model, messages, tools, max_output_tokens)
        try:
            if takes_litellm(model, openai_direct=self.openai_direct):
                import litellm  # ~150 MB and seconds: only for a model that takes its road

                if "tools" in kwargs:  # its own copy: a provider's transform may edit them, and ours are shared
                    kwargs["tools"] = copy.deepcopy(kwargs["tools"])
                return await _assemble(await litellm.acompletion(**kwargs), on_text, attempt)
            async with contextlib.aclosing(self._direct(model, kwargs)) as chunks:  # its connection back at once
                return await _assemble(chunks, on_text, attempt)
        except LLMError:
            raise
        except Exception as exc:
            attempt.unsent = not attempt.streamed and never_connected(exc)
            raise translate_error(exc) from exc


    def request(self, model: str, messages: list[dict[str, Any]], tools: list[ToolSpec],
                max_output_tokens: int | None = None) -> dict[str, Any]:
        """What one request to ``model`` is sent with: litellm's arguments (the direct road takes a part)."""
        wire = wire_tools(tools)
        if self.prompt_cache and takes_cache_marks(model):  # a fallback of another provider is sent none
            messages, wire = cache_marked(messages, wire)
        # No retries inside litellm (num_retries, and max_retries for the SDK under it): each is made above.
        kwargs: dict[str, Any] = {
            "model": model, "messages": messages, "stream": True, "timeout": self.timeout_s,
            "num_retries": 0, "max_retries": 0, "stream_options": {"include_usage": True},
        }
        if max_output_tokens is not None:
            kwargs["max_tokens"] = max_output_tokens
        if wire:
            kwargs["tools"] = wire
        if self.api_base:
            kwargs["api_base"] = self.api_base
        if self.api_key:
            kwargs["api_key"] = self.api_key
        return kwargs

    def _direct(self, model: str, kwargs: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        """The same request as litellm's openai provider sends, straight over aiohttp (brain.openai_wire)."""
        from brain.openai_wire import MissingKey, OpenAIWire  # aiohttp only in a Brain that calls a model this way

        if self._wire is None:
            try:
                self._wire = OpenAIWire(api_key=self.api_key, base_url=self.api_base, timeout_s=self.timeout_s,
                                          connections=self.connections)
            except MissingKey as exc:
                raise LLMError(ErrorCode.MODEL_NOT_CONFIGURED, f"no API key for the model: {exc}. {NOT_CONFIGURED}") \
                    from None
        sent = ("messages", "stream", "stream_options", "tools", "max_tokens")
        body: dict[str, Any] = {"model": model.removeprefix("openai/"), **{k: kwargs[k] for k in sent if k in kwargs}}
        return self._wire.chunks(body)


async def _assemble(stream: Any, on_text: OnText, attempt: Attempt) -> Completion:
    """One completion from streamed chunks: text as it comes, tool calls pieced together by index (and all of
    it told to ``attempt`` as it comes, the provider's usage too). A chunk is litellm's object or the direct
    road's dict."""
    done = Completion()
    parts: dict[int, dict[str, str]] = {}
    async for chunk in stream:
        done.model = _field(chunk, "model") or done.model
        usage = _field(chunk, "usage")
        if usage:
            done.usage = attempt.usage = _usage(usage)
        choices = _field(chunk, "choices")
        if not choices:
            continue
        done.finish_reason = _field(choices[0], "finish_reason") or done.finish_reason
        delta = _field(choices[0], "delta")
        content = _field(delta, "content")
        if content:
            attempt.received(content)
            done.text += content
            await on_text(content)
        for piece in _field(delta, "tool_calls") or []:
            slot = parts.setdefault(_field(piece, "index") or 0, {"id": "", "name": "", "arguments": ""})
            slot["id"] = _field(piece, "id") or slot["id"]
            function = _field(piece, "function")
            if function is not None:
                name, arguments = _field(function, "name"), _field(function, "arguments")
                attempt.received(name)
                attempt.received(arguments)
                slot["name"] += name or ""
                slot["arguments"] += arguments or ""
    done.tool_calls = [
        ToolCall(id=p["id"] or f"call_{i}", name=p["name"], arguments=p["arguments"] or "{}")
        for i, p in sorted(parts.items())
    ]
    return done


def _field(value: Any, name: str) -> Any:
    """A field of a chunk's part, whether the part is a dict (the direct road) or an object (litellm's)."""
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


def takes_litellm(model: str, *, openai_direct: bool) -> bool:
    """Whether calls to ``model`` go through litellm (all but ``openai/`` ones on the direct road)."""
    return not (openai_direct and model.startswith("openai/"))


def warm_up() -> None:
    """Import litellm now (seconds of work, ~150 MB); call it from a thread, never on the event loop."""
    import litellm  # noqa: F401


def _usage(usage: Any) -> dict[str, Any]:
    fields = ("prompt_tokens", "completion_tokens", "total_tokens")
    counted = {f: _field(usage, f) for f in fields if _field(usage, f) is not None}
    cached = _field(_field(usage, "prompt_tokens_details"), "cached_tokens")
    if isinstance(cached, int):  # of the prompt tokens, those the provider read from its cache
        counted["cached_tokens"] = cached
    return counted


def _wired(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [tool_param(spec) for spec in tools]


# The tool list as the model is sent it: made once per list (the catalog hands every turn the same one
# until Hands' tools change), so each turn's request and record share one object. Treat it as read-only.
wire_tools: ByIdentity[list[ToolSpec], list[dict[str, Any]]] = ByIdentity(_wired, size=64)


def tool_param(spec: ToolSpec) -> dict[str, Any]:
    return {"type": "function", "function": {"name": spec.name, "description": spec.description,
                                             "parameters": spec.parameters}}


# How providers that send no code say a request is too long for the model (OpenAI, Anthropic, vLLM, llama.cpp).
OVERFLOW = re.compile(r"context[_ ]length|context window|maximum context|prompt is too long|too many tokens|"
                      r"exceeds? the (?:available )?context", re.IGNORECASE)


# The errors that mean a connection to the provider was never made: httpx's (and httpx2, the copy the openai
# SDK under litellm vendors), httpcore's under them, aiohttp's (the direct road's, and litellm's transport's;
# its ConnectionTimeoutError is a pool wait or a connect that timed out), and the OS's own refusal.
NOT_CONNECTED = frozenset({("httpx", "ConnectError"), ("httpx", "ConnectTimeout"), ("httpcore", "ConnectError"),
                           ("httpcore", "ConnectTimeout"), ("aiohttp", "ClientConnectorError"),
                           ("aiohttp", "ConnectionTimeoutError"), ("builtins", "ConnectionRefusedError"),
                           ("socket", "gaierror")})


def never_connected(exc: BaseException) -> bool:
    """Whether a failed request provably never reached the provider: no connection to it was made (refused,
    unresolvable, or the connect or TLS handshake failed or timed out), so no byte of the request was sent.
    Anything later (a reset, a read timeout, an error status) may have been read, and billed."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:  # litellm and the SDK wrap the transport's error, chained
        for kind in type(cause).__mro__:
            package = kind.__module__.partition(".")[0].removesuffix("2")  # httpx2, httpcore2: vendored copies
            if (package, kind.__name__) in NOT_CONNECTED:
                return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def translate_error(exc: Exception) -> LLMError:
    """litellm's errors, and the direct road's (aiohttp's, and brain.openai_wire's ProviderError), as ``LLMError``."""
    litellm = sys.modules.get("litellm") or _NoLitellm  # not imported: the error cannot be one of its own
    transport = sys.modules.get("aiohttp")  # the direct road's own errors are aiohttp's

    status = getattr(exc, "status_code", None)
    detail = str(getattr(exc, "message", None) or exc)[:500]
    if never_connected(exc):  # litellm calls a refused connection an InternalServerError
        return LLMError(ErrorCode.SERVICE_UNAVAILABLE, f"cannot reach the model provider: {detail}")
    if isinstance(exc, litellm.exceptions.RateLimitError) or status == 429:
        return LLMError(ErrorCode.RATE_LIMITED, f"the model provider is rate-limiting requests: {detail}")
    if isinstance(exc, litellm.exceptions.AuthenticationError) or status in (401, 403):
        return LLMError(ErrorCode.MODEL_ERROR, f"the model provider refused the API key: {detail}. "
                        "Check PINCER_LLM_API_KEY or the provider's key variable.")
    if isinstance(exc, (litellm.exceptions.Timeout, TimeoutError)):  # aiohttp's timeouts are TimeoutErrors
        return LLMError(ErrorCode.TIMEOUT, f"the model did not answer in time: {detail or type(exc).__name__}")
    if isinstance(exc, (litellm.exceptions.APIConnectionError, litellm.exceptions.ServiceUnavailableError)) \
            or (transport and isinstance(exc, transport.ClientError)) or status in (502, 503, 504):
        return LLMError(ErrorCode.SERVICE_UNAVAILABLE, f"cannot reach the model provider: {detail}")
    if "Missing credentials" in detail or (type(exc).__name__ == "OpenAIError" and "api_key" in detail):  # no key
        return LLMError(ErrorCode.MODEL_NOT_CONFIGURED, f"no API key for the model: {detail}. {NOT_CONFIGURED}")
    if isinstance(exc, litellm.exceptions.ContextWindowExceededError) or getattr(exc, "code", None) == \
            "context_length_exceeded" or OVERFLOW.search(detail):
        return LLMError(ErrorCode.MODEL_ERROR, f"the conversation is longer than the model's context window: {detail}",
                        overflow=True)
    if isinstance(exc, litellm.exceptions.BadRequestError) and "LLM Provider NOT provided" in detail:
        return LLMError(ErrorCode.MODEL_NOT_CONFIGURED, f"unknown model name: {detail}. {NOT_CONFIGURED}")
    return LLMError(ErrorCode.MODEL_ERROR, f"the model call failed ({type(exc).__name__}): {detail}")


class _NoLitellm:
    """Stands in for litellm's exception classes when litellm was never imported."""

    class exceptions:  # noqa: N801 - mirrors litellm.exceptions
        RateLimitError = AuthenticationError = Timeout = APIConnectionError = ServiceUnavailableError = \
            BadRequestError = ContextWindowExceededError = type("NeverRaised", (Exception,), {})
