"""The direct road's transport: what an OpenAI-compatible server's stream and errors become. The server's
answers here are httpx's MockTransport; the real HTTP path is in tests/integration/test_llm_client.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from brain.llm import translate_error
from brain.openai_wire import MissingKey, OpenAIWire, ProviderError
from bus.protocol import ErrorCode


def wire(answer: Callable[[httpx.Request], httpx.Response]) -> OpenAIWire:
    made = OpenAIWire(api_key="sk-test", base_url="http://provider.test/v1", timeout_s=5, connections=4)
    made.client = httpx.AsyncClient(base_url="http://provider.test/v1", transport=httpx.MockTransport(answer),
                                    headers=made.client.headers)
    return made


def events(*data: Any) -> httpx.Response:
    body = "".join(f"data: {d if isinstance(d, str) else json.dumps(d)}\n\n" for d in data)
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body.encode())


def chunk(text: str = "", finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


async def read(made: OpenAIWire) -> list[dict[str, Any]]:
    return [c async for c in made.chunks({"model": "m", "messages": [], "stream": True})]


async def test_chunks_come_as_dicts_until_done_with_the_key_and_the_path_sent() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return events(chunk("he"), "", chunk("llo", "stop"), "[DONE]", chunk("never read"))

    got = await read(wire(answer))
    assert [c["choices"][0]["delta"]["content"] for c in got] == ["he", "llo"]
    assert str(seen[0].url) == "http://provider.test/v1/chat/completions"
    assert seen[0].headers["authorization"] == "Bearer sk-test"
    assert json.loads(seen[0].content)["model"] == "m"


async def test_a_stream_cut_before_its_end_is_an_error_not_half_an_answer() -> None:
    with pytest.raises(ProviderError, match="ended before its answer did"):
        await read(wire(lambda _r: events(chunk("half an"))))
    assert len(await read(wire(lambda _r: events(chunk("whole", "stop"))))) == 1  # a finish reason, no [DONE]


async def test_an_error_status_says_the_providers_message_and_code() -> None:
    said = {"error": {"message": "This model's maximum context length is 8192 tokens",
                      "code": "context_length_exceeded"}}
    with pytest.raises(ProviderError) as info:
        await read(wire(lambda _r: httpx.Response(400, json=said)))
    assert info.value.status_code == 400 and info.value.code == "context_length_exceeded"
    assert "maximum context length" in info.value.message
    translated = translate_error(info.value)
    assert translated.overflow and translated.code is ErrorCode.MODEL_ERROR


@pytest.mark.parametrize(("status", "body", "code", "said"), [
    (429, {"error": {"message": "slow down"}}, ErrorCode.RATE_LIMITED, "slow down"),
    (401, {"error": {"message": "bad key"}}, ErrorCode.MODEL_ERROR, "bad key"),
    (503, "<html>upstream gone</html>", ErrorCode.SERVICE_UNAVAILABLE, "upstream gone"),  # not JSON: its text
    (500, {"error": "plain words"}, ErrorCode.MODEL_ERROR, "plain words"),
])
async def test_error_statuses_become_the_wires_codes(status: int, body: Any, code: ErrorCode, said: str) -> None:
    content = body if isinstance(body, str) else json.dumps(body)
    with pytest.raises(ProviderError) as info:
        await read(wire(lambda _r: httpx.Response(status, content=content.encode())))
    assert translate_error(info.value).code is code
    assert said in info.value.message and f"Error code: {status}" in info.value.message


async def test_an_error_inside_the_stream_and_a_chunk_that_is_not_an_object_are_errors() -> None:
    with pytest.raises(ProviderError, match="overloaded"):
        await read(wire(lambda _r: events(chunk("a"), {"error": {"message": "overloaded"}})))
    with pytest.raises(ProviderError, match="not a JSON object"):
        await read(wire(lambda _r: events("[1, 2]")))


async def test_a_read_timeout_and_a_dropped_connection_are_told_apart() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("read timed out", request=request)

    def dropped(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("peer closed connection", request=request)

    for answer, code in ((slow, ErrorCode.TIMEOUT), (dropped, ErrorCode.SERVICE_UNAVAILABLE)):
        with pytest.raises(httpx.TransportError) as info:
            await read(wire(answer))
        assert translate_error(info.value).code is code


def test_no_key_anywhere_is_refused_before_any_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(MissingKey):
        OpenAIWire(api_key=None, base_url=None, timeout_s=5, connections=1)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://elsewhere.test/v1")
    made = OpenAIWire(api_key=None, base_url=None, timeout_s=5, connections=1)
    assert made.client.headers["authorization"] == "Bearer sk-env"
    assert str(made.client.base_url) == "http://elsewhere.test/v1/"


def test_a_body_with_tools_is_the_same_json_and_a_changed_list_is_sent_as_it_is_now() -> None:
    made = OpenAIWire(api_key="sk-test", base_url=None, timeout_s=5, connections=1)
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi \u2603"}], "tools": tools, "stream": True}
    assert json.loads(made.encoded(body)) == body
    assert json.loads(made.encoded({**body, "messages": []})) == {**body, "messages": []}  # the list's JSON again
    other = [*tools, {"type": "function", "function": {"name": "write_file", "parameters": {}}}]
    assert json.loads(made.encoded({**body, "tools": other}))["tools"] == other
    assert json.loads(made.encoded({"model": "m", "messages": []})) == {"model": "m", "messages": []}
