"""The local model's OpenAI-compatible server, on loopback, through the Brain's own client (litellm's road
and the openai SDK's) with a scripted generator in the model's place: what the Brain gets back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from brain.llm import LiteLLMClient
from bus.protocol import ToolSpec
from bus.redis_server import free_port
from localmodel.server import Generated, LocalModelServer
from tests.conftest import async_wait_until, closed_after_test

TEMPLATE = """{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}{% if message.tool_calls %}{{ message.tool_calls | tojson }}{% endif %}<|im_end|>
{% endfor %}{% if tools %}TOOLS {{ tools | map(attribute='function.name') | join(',') }}
{% endif %}<|im_start|>assistant
"""
KEY = "this-start-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
TOOLS = [ToolSpec(name="read_file", description="read a file", parameters={"type": "object"})]


class Scripted:
    """Replies in order; keeps the prompts it was given."""

    name, template, stop = "qwen-local", TEMPLATE, ["<|im_end|>"]

    def __init__(self, *replies: str) -> None:
        self.replies, self.prompts, self.warmed, self.limits = list(replies), [], [], []

    def warm(self, prompt: str) -> None:
        self.warmed.append(prompt)

    def generate(self, prompt: str, *, max_tokens: int, temperature: float) -> Generated:
        self.prompts.append(prompt)
        self.limits.append(max_tokens)
        return Generated(self.replies.pop(0), prompt_tokens=len(prompt.split()), completion_tokens=5)


pytestmark = pytest.mark.usefixtures("close_model_clients")


@pytest.fixture
async def serve() -> AsyncIterator:
    servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []

    async def start(generator: Scripted, warm_file: Path | None = None) -> str:
        port = free_port()
        app = LocalModelServer(generator, key=KEY, warm_file=warm_file).app()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        servers.append((server, asyncio.create_task(server.serve())))
        await async_wait_until(lambda: server.started, what="the local model server listening")
        return f"http://127.0.0.1:{port}/v1"

    yield start
    for server, task in servers:
        server.should_exit = True
        await task


def brain_client(api_base: str, *, direct: bool) -> LiteLLMClient:
    return closed_after_test(LiteLLMClient(model="openai/qwen-local", api_base=api_base, api_key=KEY, timeout_s=20,
                                           retries=0, openai_direct=direct))


async def ignore(_text: str) -> None:
    return None


@pytest.mark.parametrize("direct", [False, True], ids=["litellm", "openai-direct"])
async def test_the_brain_gets_structured_tool_calls_then_the_answer(serve, direct: bool) -> None:
    model = Scripted('<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>',
                     "The file says alpha.")
    client = brain_client(await serve(model), direct=direct)
    asked = [{"role": "user", "content": "What does a.txt say?"}]
    first = await client.complete(asked, TOOLS, ignore)
    assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [("read_file", {"path": "a.txt"})]
    streamed: list[str] = []

    async def keep(text: str) -> None:
        streamed.append(text)

    answered = [*asked, {"role": "assistant", "content": None, "tool_calls": [c.to_openai() for c in first.tool_calls]},
                {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "alpha"}]
    second = await client.complete(answered, TOOLS, keep)
    assert second.text == "The file says alpha." and "".join(streamed) == second.text and not second.tool_calls
    assert "TOOLS read_file" in model.prompts[0]  # the offered tools reached the model's template
    assert '"arguments": {"path": "a.txt"}' in model.prompts[1]  # its own call, read back as an object
    assert second.usage["completion_tokens"] == 5


async def test_an_invented_tool_is_asked_again_then_refused_in_words(serve) -> None:
    model = Scripted('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
                     '<tool_call>{"name": "read_file", "arguments": {"path": "b"}}</tool_call>',
                     '<tool_call>{"name": "format_disk", "arguments": {}}</tool_call>',
                     '<tool_call>{"name": "format_disk", "arguments": {}}</tool_call>')
    client = brain_client(await serve(model), direct=True)
    fixed = await client.complete([{"role": "user", "content": "tidy up"}], TOOLS, ignore)
    assert [c.name for c in fixed.tool_calls] == ["read_file"]
    assert "Those tools do not exist: 'rm_rf' is not one of the offered tools (read_file)" in model.prompts[1]
    refused = await client.complete([{"role": "user", "content": "wipe it"}], TOOLS, ignore)
    assert not refused.tool_calls and refused.text.startswith("I could not use the tools I meant to: 'format_disk'")


async def test_a_malformed_request_is_told_what_is_wrong(serve) -> None:
    api_base = await serve(Scripted())
    async with httpx.AsyncClient(headers=AUTH) as http:
        empty = await http.post(f"{api_base}/chat/completions", json={"model": "x", "messages": []})
        garbage = await http.post(f"{api_base}/chat/completions", content=b"{not json",
                                  headers={"Content-Type": "application/json"})
        listed = await http.get(f"{api_base}/models")
    assert empty.status_code == 400 and "messages" in empty.json()["error"]["message"]
    assert garbage.status_code == 400 and "not a chat completion request" in garbage.json()["error"]["message"]
    assert [m["id"] for m in listed.json()["data"]] == ["qwen-local"]


async def test_arguments_that_do_not_fit_are_asked_for_again_and_a_second_misfit_passes_on(serve) -> None:
    strict = [ToolSpec(name="read_file", description="read a file", parameters={
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]})]
    echoed = '<tool_call>{"name": "read_file", "arguments": {"type": "object"}}</tool_call>'
    model = Scripted(echoed, '<tool_call>{"name": "read_file", "arguments": {"path": "a.txt"}}</tool_call>',
                     echoed, echoed)
    client = brain_client(await serve(model), direct=False)
    fixed = await client.complete([{"role": "user", "content": "read a.txt"}], strict, ignore)
    assert [json.loads(c.arguments) for c in fixed.tool_calls] == [{"path": "a.txt"}]
    assert "does not fit its parameters: 'path' is a required property" in model.prompts[1]
    passed = await client.complete([{"role": "user", "content": "read a.txt"}], strict, ignore)
    # Twice wrong: the call goes to the Brain, whose tools answer with the validation error to fix.
    assert [json.loads(c.arguments) for c in passed.tool_calls] == [{"type": "object"}]


async def test_the_prompts_prefix_is_kept_private_and_read_ahead_by_the_next_start(serve, tmp_path: Path) -> None:
    kept = tmp_path / "models" / "model.gguf.prefix.txt"
    kept.parent.mkdir()
    first = Scripted("The file says alpha.")
    client = brain_client(await serve(first, kept), direct=True)
    asked = [{"role": "system", "content": "You are Pincer."}, {"role": "user", "content": "my secret is 1234"}]
    await client.complete(asked, TOOLS, ignore)
    prefix = kept.read_text()
    assert first.prompts[0].startswith(prefix) and "You are Pincer." in prefix
    assert "1234" not in prefix  # the conversation is never kept, only what precedes it
    assert kept.stat().st_mode & 0o077 == 0
    assert first.warmed == []  # nothing kept before this run
    second = Scripted()
    await serve(second, kept)
    await async_wait_until(lambda: second.warmed == [prefix], what="the kept prefix read ahead at start")


async def test_only_the_brain_with_this_starts_key_may_use_the_model(serve, tmp_path: Path) -> None:
    """A web page or another local user: no key, a wrong key, a foreign Host (DNS rebinding), a form post,
    an outsized body or answer. None reaches the model, and none changes the prefix it keeps warm."""
    model = Scripted("fine")
    kept = tmp_path / "prefix.txt"
    api_base = await serve(model, kept)
    ask = {"model": "x", "messages": [{"role": "system", "content": "EVIL PREFIX"}, {"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient() as http:
        url = f"{api_base}/chat/completions"
        for headers, body, status in [
            ({}, ask, 401),
            ({"Authorization": "Bearer wrong-key-0123456789"}, ask, 401),
            ({"Authorization": f"Basic {KEY}"}, ask, 401),
            ({**AUTH, "Host": "attacker.example"}, ask, 403),
            ({**AUTH, "Host": f"rebound.example:{api_base.split(':')[2].split('/')[0]}"}, ask, 403),
        ]:
            refused = await http.post(url, json=body, headers=headers)
            assert refused.status_code == status, (headers, refused.text)
        assert (await http.get(f"{api_base}/models")).status_code == 401
        form = await http.post(url, content=json.dumps(ask), headers={**AUTH, "Content-Type": "text/plain"})
        assert form.status_code == 415
        huge = await http.post(url, headers=AUTH, json={**ask, "pad": "x" * (5 << 20)})
        assert huge.status_code == 413
    assert model.prompts == [] and not kept.exists()  # nothing ran, nothing was kept
    async with httpx.AsyncClient(headers=AUTH) as http:
        greedy = await http.post(f"{api_base}/chat/completions", json={**ask, "max_tokens": 8192})
    assert greedy.status_code == 200 and model.limits == [4096]  # an answer's length is held to the cap


def test_the_server_refuses_to_start_without_a_key() -> None:
    with pytest.raises(ValueError, match="key of 16"):
        LocalModelServer(Scripted(), key="")
