"""The direct road's transport: an OpenAI-compatible chat completion, streamed over aiohttp and read as
server-sent events (brain.sse), with no SDK in between.

The openai SDK did the same with ~24 MB more in every Brain and its own request building; only its
connection pool, its SSE reading and its errors were used. httpx with httpx-sse, the road's client until
2026-12, took ~1.2-1.5 ms of CPU per streamed call on the reference machine against ~0.6 ms for aiohttp
(bench/results.md): a quarter of a plain turn's Brain CPU. The pool is aiohttp's, sized by the Brain's own
bound; the errors are raised as aiohttp's (connect, timeout, transport) or ``ProviderError`` (an error status,
an error in the stream, or an answer that is not a stream), which ``brain.llm.translate_error`` reads.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import urllib.parse
import urllib.request
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp

from brain.sse import EventStream
from bus.errors import PincerError
from bus.identity import ByIdentity
from bus.loops import Background

DEFAULT_BASE_URL = "https://api.openai.com/v1"
# How long the rest of a body may take to come after its [DONE] (most often the chunked body's last line):
# read in the background so the connection goes back to the pool instead of being closed.
DRAIN_S = 5.0


class ProviderError(PincerError):
    """The provider answered with an error: its status (None for an error sent inside the stream), the
    message its body gave, and its error code (``context_length_exceeded``, say)."""

    def __init__(self, status_code: int | None, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status_code, self.message, self.code = status_code, message, code


class MissingKey(PincerError):
    """No API key was given and OPENAI_API_KEY is not set."""


class OpenAIWire:
    """One connection pool to one OpenAI-compatible server, shared by every call of a Brain."""

    def __init__(self, *, api_key: str | None, base_url: str | None, timeout_s: float, connections: int) -> None:
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            raise MissingKey("no api_key given and OPENAI_API_KEY is not set")
        base = base_url or os.environ.get("OPENAI_API_BASE") or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        self.url = f"{base.rstrip('/')}/chat/completions"
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json",
                        "Accept": "text/event-stream", "Cache-Control": "no-store"}
        self.timeout_s, self.connections = timeout_s, connections
        self.proxy = env_proxy(self.url)
        self._session: aiohttp.ClientSession | None = None
        self._draining = Background()  # bodies read to their end after [DONE]
        # A tool list's JSON: the catalog hands every turn the same list until Hands' tools change, and it is
        # most of a request's bytes (~8 KB for the built-in tools).
        self._tools_json: ByIdentity[list[Any], str] = ByIdentity(json.dumps, size=64)

    def session(self) -> aiohttp.ClientSession:
        """The pool, made on first use: an aiohttp session belongs to the loop it was made in."""
        if self._session is None or self._session.closed:
            # Every connection kept alive (aiohttp's default): a turn after a burst reuses one.
            connector = aiohttp.TCPConnector(limit=self.connections,
                                             ssl=tls_context() if self.url.startswith("https:") else True)
            # Each wait bounded as httpx bounded it: the pool and the connect, then each read (the stream's
            # whole length is not bounded: a long answer streams for as long as it writes).
            timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout_s, sock_read=self.timeout_s)
            # Not trust_env: it reads the proxy variables and ~/.netrc again in a thread for every request.
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, headers=self.headers)
        return self._session

    async def chunks(self, body: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        """The completion's chunks as the JSON's dicts, until the server's ``[DONE]``. A stream that ends
        before both ``[DONE]`` and a finish reason was cut (a reset reads as a plain end): an error, never
        half an answer passed off as a whole one."""
        finished = drained = False
        response = await self.session().post(self.url, data=self.encoded(body), proxy=self.proxy)
        try:
            if response.status >= 400:
                raise _status_error(response.status, await response.text(errors="replace"))
            if response.content_type != "text/event-stream":
                said = (await response.read())[:300].decode(errors="replace")
                raise ProviderError(None, f"the model's server answered {response.content_type or 'no content type'}"
                                          f", not a stream of events (text/event-stream): {said}")
            events = EventStream()
            async for piece in response.content.iter_any():
                for data in events.feed(piece):
                    if data == "[DONE]":
                        drained = not response.content.at_eof()
                        if drained:
                            self._drain(response)
                        return
                    if not data:
                        continue
                    chunk = json.loads(data)
                    if not isinstance(chunk, dict):
                        raise ProviderError(None, f"a chunk of the stream is not a JSON object: {data[:200]}")
                    if chunk.get("error"):
                        raise _error_in(None, chunk["error"], data)
                    finished = finished or any(isinstance(c, dict) and c.get("finish_reason")
                                               for c in chunk.get("choices") or ())
                    yield chunk
        finally:
            if not drained:  # back to the pool when its body was read to the end, else closed
                response.release()
        if not finished:
            raise ProviderError(None, "the model's stream ended before its answer did (no finish reason, no [DONE])")

    def _drain(self, response: aiohttp.ClientResponse) -> None:
        """Read the rest of ``response`` (after its [DONE]) in the background, for at most DRAIN_S."""
        self._draining.start(_read_to_end(response))

    def encoded(self, body: dict[str, Any]) -> bytes:
        """``body`` as JSON, its tool list's part made once per list."""
        tools = body.get("tools")
        if not tools:
            return json.dumps(body).encode()
        head = json.dumps({k: v for k, v in body.items() if k != "tools"})
        return f'{head[:-1]}, "tools": {self._tools_json(tools)}}}'.encode()

    async def close(self) -> None:
        await self._draining.finish()
        if self._session is not None:
            await self._session.close()


async def _read_to_end(response: aiohttp.ClientResponse) -> None:
    """The body's rest read and dropped, so ``release`` pools the connection; closed if it does not end in time."""
    try:
        async with asyncio.timeout(DRAIN_S):
            while await response.content.readany():
                pass
    except (TimeoutError, aiohttp.ClientError):
        response.close()
    except asyncio.CancelledError:
        response.close()
        raise
    else:
        response.release()


def tls_context() -> ssl.SSLContext:
    """Providers verified against the roots httpx verified them with: those SSL_CERT_FILE or SSL_CERT_DIR
    name, else certifi's. aiohttp alone would read only the system's, which a python.org build on macOS
    does not have until its certificates are installed by hand."""
    cafile, capath = os.environ.get("SSL_CERT_FILE") or None, os.environ.get("SSL_CERT_DIR") or None
    if cafile is None and capath is None:
        import certifi  # httpx's dependency, and so Pincer's

        cafile = certifi.where()
    return ssl.create_default_context(cafile=cafile, capath=capath)


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (HTTPS_PROXY and the like, NO_PROXY heeded), as httpx
    read them: read once, for the wire's one address."""
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)


def _status_error(status: int, text: str) -> ProviderError:
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    found = body.get("error") if isinstance(body, dict) else None
    return _error_in(status, found, text)


def _error_in(status: int | None, found: Any, text: str) -> ProviderError:
    """The error a provider's body describes (OpenAI's shape: ``{"error": {"message", "code"}}``)."""
    message = str(found.get("message") or text) if isinstance(found, dict) else (str(found) if found else text)
    code = found.get("code") if isinstance(found, dict) else None
    said = f"Error code: {status} - {message}" if status is not None else message
    return ProviderError(status, said[:2000], str(code) if code else None)
