"""The direct road's transport: what an OpenAI-compatible server's stream and errors become. The server is a
real aiohttp one on loopback, answering each test's way; litellm's road and the scripted model's are in
tests/integration/test_llm_client.py."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from brain.llm import never_connected, translate_error
from brain.openai_wire import MissingKey, OpenAIWire, ProviderError
from bus.protocol import ErrorCode
from tests.redis_topology import make_certificates

Answer = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Answer], Awaitable[OpenAIWire]]]:
    """A server answering every request with ``answer``, and a wire to it (closed after the test)."""
    made: list[tuple[TestServer, OpenAIWire]] = []

    async def start(answer: Answer, *, timeout_s: float = 5) -> OpenAIWire:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        wire = OpenAIWire(api_key="sk-test", base_url=f"http://127.0.0.1:{server.port}/v1", timeout_s=timeout_s,
                          connections=4)
        made.append((server, wire))
        return wire

    yield start
    for server, wire in made:
        await wire.close()
        await server.close()


def events(*data: Any) -> Answer:
    body = "".join(f"data: {d if isinstance(d, str) else json.dumps(d)}\n\n" for d in data)

    async def answer(_request: web.Request) -> web.Response:
        return web.Response(body=body.encode(), content_type="text/event-stream")
    return answer


def status(code: int, content: str) -> Answer:
    async def answer(_request: web.Request) -> web.Response:
        return web.Response(status=code, text=content)
    return answer


def chunk(text: str = "", finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


async def read(made: OpenAIWire) -> list[dict[str, Any]]:
    return [c async for c in made.chunks({"model": "m", "messages": [], "stream": True})]


async def test_chunks_come_as_dicts_until_done_with_the_key_and_the_path_sent(serve: Any) -> None:
    seen: list[tuple[str, dict[str, str], bytes]] = []
    stream = events(chunk("he"), "", chunk("llo", "stop"), "[DONE]", chunk("never read"))

    async def answer(request: web.Request) -> web.StreamResponse:
        seen.append((request.path, dict(request.headers), await request.read()))
        return await stream(request)

    got = await read(await serve(answer))
    assert [c["choices"][0]["delta"]["content"] for c in got] == ["he", "llo"]
    path, headers, body = seen[0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer sk-test"
    assert headers["Content-Type"] == "application/json" and json.loads(body)["model"] == "m"


async def test_a_stream_written_piece_by_piece_is_read_whole(serve: Any) -> None:
    """Events split anywhere between writes (inside a line, inside a UTF-8 character, between CR and LF)."""
    text = "".join(f"data: {json.dumps(chunk(p, 'stop' if p == 'é!' else None))}\r\n\r\n" for p in ("a", "é!"))
    raw = (text + "data: [DONE]\r\n\r\n").encode()

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for at in range(0, len(raw), 7):
            await response.write(raw[at:at + 7])
            await asyncio.sleep(0)  # each piece its own write
        await response.write_eof()
        return response

    got = await read(await serve(answer))
    assert "".join(c["choices"][0]["delta"]["content"] for c in got) == "aé!"


def ends_late(ports: list[int], end: asyncio.Event) -> Answer:
    """A whole answer and its [DONE], then the chunked body's end only once ``end`` is set (a provider whose
    last bytes come a packet later); the client port of each request in ``ports``."""
    async def answer(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        ports.append(request.transport.get_extra_info("peername")[1])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(chunk('hi', 'stop'))}\n\ndata: [DONE]\n\n".encode())
        await end.wait()
        await response.write_eof()
        return response
    return answer


async def test_a_body_that_ends_after_done_is_read_in_the_background_and_its_connection_reused(
        serve: Any) -> None:
    ports: list[int] = []
    end = asyncio.Event()
    wire = await serve(ends_late(ports, end))
    assert len(await read(wire)) == 1  # the answer comes at [DONE], before the body's end
    end.set()
    await asyncio.wait_for(asyncio.gather(*wire._draining), 5)  # the drain read the end
    assert len(await read(wire)) == 1
    assert len(ports) == 2 and ports[0] == ports[1]  # the second call went over the first's connection


async def test_a_body_that_never_ends_after_done_is_closed_after_a_bound(
        serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("brain.openai_wire.DRAIN_S", 0.2)
    ports: list[int] = []
    end = asyncio.Event()
    wire = await serve(ends_late(ports, end))
    assert len(await read(wire)) == 1
    await asyncio.wait_for(asyncio.gather(*wire._draining), 5)  # given up on: closed, not pooled
    end.set()
    assert len(await read(wire)) == 1
    assert len(ports) == 2 and ports[0] != ports[1]

    never = asyncio.Event()
    held = await serve(ends_late(ports, never))  # a drain still running when its wire closes
    await read(held)
    draining = set(held._draining)
    await held.close()
    never.set()
    assert draining and all(task.cancelled() for task in draining) and not held._draining


async def test_a_stream_cut_before_its_end_is_an_error_not_half_an_answer(serve: Any) -> None:
    with pytest.raises(ProviderError, match="ended before its answer did"):
        await read(await serve(events(chunk("half an"))))
    assert len(await read(await serve(events(chunk("whole", "stop"))))) == 1  # a finish reason, no [DONE]


async def test_an_answer_that_is_not_a_stream_says_what_came_instead(serve: Any) -> None:
    async def answer(_request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"message": {"content": "all at once"}}]})

    with pytest.raises(ProviderError, match="answered application/json, not a stream") as info:
        await read(await serve(answer))
    assert "all at once" in info.value.message


async def test_an_error_status_says_the_providers_message_and_code(serve: Any) -> None:
    said = {"error": {"message": "This model's maximum context length is 8192 tokens",
                      "code": "context_length_exceeded"}}
    with pytest.raises(ProviderError) as info:
        await read(await serve(status(400, json.dumps(said))))
    assert info.value.status_code == 400 and info.value.code == "context_length_exceeded"
    assert "maximum context length" in info.value.message
    translated = translate_error(info.value)
    assert translated.overflow and translated.code is ErrorCode.MODEL_ERROR


@pytest.mark.parametrize(("code", "body", "becomes", "said"), [
    (429, {"error": {"message": "slow down"}}, ErrorCode.RATE_LIMITED, "slow down"),
    (401, {"error": {"message": "bad key"}}, ErrorCode.MODEL_ERROR, "bad key"),
    (503, "<html>upstream gone</html>", ErrorCode.SERVICE_UNAVAILABLE, "upstream gone"),  # not JSON: its text
    (500, {"error": "plain words"}, ErrorCode.MODEL_ERROR, "plain words"),
])
async def test_error_statuses_become_the_wires_codes(serve: Any, code: int, body: Any, becomes: ErrorCode,
                                                     said: str) -> None:
    content = body if isinstance(body, str) else json.dumps(body)
    with pytest.raises(ProviderError) as info:
        await read(await serve(status(code, content)))
    assert translate_error(info.value).code is becomes
    assert said in info.value.message and f"Error code: {code}" in info.value.message


async def test_an_error_inside_the_stream_and_a_chunk_that_is_not_an_object_are_errors(serve: Any) -> None:
    with pytest.raises(ProviderError, match="overloaded"):
        await read(await serve(events(chunk("a"), {"error": {"message": "overloaded"}})))
    with pytest.raises(ProviderError, match="not a JSON object"):
        await read(await serve(events("[1, 2]")))


async def test_a_read_timeout_a_dropped_stream_and_a_refused_connect_are_told_apart(serve: Any) -> None:
    release = asyncio.Event()

    async def silent(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await release.wait()  # headers sent, then nothing: the read times out
        return response

    async def dropped(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(chunk('a'))}\n\n".encode())
        assert request.transport is not None
        request.transport.abort()  # the connection reset mid-stream: the request was read, maybe billed
        return response

    with pytest.raises(aiohttp.ServerTimeoutError) as slow:
        await read(await serve(silent, timeout_s=0.3))
    release.set()
    assert translate_error(slow.value).code is ErrorCode.TIMEOUT and not never_connected(slow.value)
    with pytest.raises(aiohttp.ClientError) as cut:
        await read(await serve(dropped))
    assert translate_error(cut.value).code is ErrorCode.SERVICE_UNAVAILABLE and not never_connected(cut.value)

    with socket.socket() as closed:  # a port nothing listens on: refused before any byte was sent
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    nobody = OpenAIWire(api_key="sk-test", base_url=f"http://127.0.0.1:{port}/v1", timeout_s=5, connections=1)
    try:
        with pytest.raises(aiohttp.ClientConnectorError) as refused:
            await read(nobody)
    finally:
        await nobody.close()
    assert never_connected(refused.value) and translate_error(refused.value).code is ErrorCode.SERVICE_UNAVAILABLE


def test_no_key_anywhere_is_refused_before_any_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(MissingKey):
        OpenAIWire(api_key=None, base_url=None, timeout_s=5, connections=1)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://elsewhere.test/v1")
    made = OpenAIWire(api_key=None, base_url=None, timeout_s=5, connections=1)
    assert made.headers["Authorization"] == "Bearer sk-env"
    assert made.url == "http://elsewhere.test/v1/chat/completions"


def test_a_body_with_tools_is_the_same_json_and_a_changed_list_is_sent_as_it_is_now() -> None:
    made = OpenAIWire(api_key="sk-test", base_url=None, timeout_s=5, connections=1)
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi \u2603"}], "tools": tools, "stream": True}
    assert json.loads(made.encoded(body)) == body
    assert json.loads(made.encoded({**body, "messages": []})) == {**body, "messages": []}  # the list's JSON again
    other = [*tools, {"type": "function", "function": {"name": "write_file", "parameters": {}}}]
    assert json.loads(made.encoded({**body, "tools": other}))["tools"] == other
    assert json.loads(made.encoded({"model": "m", "messages": []})) == {"model": "m", "messages": []}


async def test_a_proxy_the_environment_names_carries_the_calls_unless_no_proxy_names_the_host(
        serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    hosts: list[str] = []
    stream = events(chunk("via the proxy", "stop"))

    async def proxy(request: web.Request) -> web.StreamResponse:
        hosts.append(request.host)  # a proxy is sent the whole address: the provider's host, not its own
        return await stream(request)

    through = await serve(proxy)
    monkeypatch.setenv("HTTP_PROXY", through.url.removesuffix("/v1/chat/completions"))
    made = OpenAIWire(api_key="sk-test", base_url="http://provider.test/v1", timeout_s=5, connections=1)
    try:
        assert [c["choices"][0]["delta"]["content"] for c in await read(made)] == ["via the proxy"]
    finally:
        await made.close()
    assert hosts == ["provider.test"]
    monkeypatch.setenv("NO_PROXY", "provider.test")
    assert OpenAIWire(api_key="sk-test", base_url="http://provider.test/v1", timeout_s=5, connections=1).proxy is None


async def test_a_provider_over_tls_is_verified_against_the_roots_ssl_cert_file_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_certificates(tmp_path, "127.0.0.1")
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    app = web.Application()
    app.router.add_post("/v1/chat/completions", events(chunk("private", "stop")))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=served)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # started: it has its socket
    try:
        async def ask() -> list[dict[str, Any]]:
            made = OpenAIWire(api_key="sk-test", base_url=f"https://127.0.0.1:{port}/v1", timeout_s=5, connections=1)
            try:
                return await read(made)
            finally:
                await made.close()

        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        with pytest.raises(aiohttp.ClientConnectorCertificateError) as unknown:  # certifi's roots: not ours
            await ask()
        assert never_connected(unknown.value)  # refused at the handshake: nothing was sent, nothing billed
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.crt"))
        assert [c["choices"][0]["delta"]["content"] for c in await ask()] == ["private"]
    finally:
        await runner.cleanup()
