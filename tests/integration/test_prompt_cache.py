"""The prompt laid out for a provider's cache, on the real model path (litellm's HTTP road and the openai
SDK's) against the scripted server: the stable head and the tools are byte for byte the same turn after
turn whatever memory holds, Anthropic-family models get cache breakpoints on the wire and others none."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from brain.config import BrainSettings
from brain.llm import LiteLLMClient, warm_up
from brain.prompt import EPHEMERAL
from brain.worker import default_llm
from bus.protocol import ChatReply, ToolSpec
from bus.streams import Bus
from memory.longterm import LongTermMemory
from tests.scripted_llm import ScriptedLLM

ROADS = [pytest.param(False, id="litellm"), pytest.param(True, id="openai-sdk")]
TOOLS = [ToolSpec(name=name, description=f"the {name}", parameters={"type": "object"}) for name in ("a", "b")]


async def _ignore(_text: str) -> None:
    return None


@pytest.mark.parametrize("direct", ROADS)
async def test_two_turns_send_the_same_head_and_tools_whatever_memory_holds(
        bus: Bus, pool, chat, scripted_llm: ScriptedLLM, direct: bool) -> None:
    if not direct:
        await asyncio.to_thread(warm_up)  # litellm's import takes seconds: not inside a turn's deadline
    memory = LongTermMemory(bus.redis, bus.keys)
    await memory.write("main", "colour", "The user likes green.", owner="user")
    values: dict[str, Any] = {"model": "openai/scripted", "api_base": scripted_llm.api_base, "api_key": "sk-scripted",
                              "openai_direct": direct, "llm_retries": 0, "llm_timeout_s": 20}
    await pool(default_llm(BrainSettings(**values)), **values)
    assert isinstance((await chat("hello", session_id="cached"))[-1], ChatReply)
    await memory.write("main", "boat", "The boat is called Marigold.", owner="user")  # recalled from now on
    assert isinstance((await chat("again", session_id="cached"))[-1], ChatReply)

    first, second = scripted_llm.requests
    assert json.dumps(first["messages"][0]) == json.dumps(second["messages"][0])  # the instructions, byte for byte
    assert json.dumps(first["tools"]) == json.dumps(second["tools"])
    names = [tool["function"]["name"] for tool in first["tools"]]
    assert names == sorted(names) and "memory_read" in names
    # What memory holds comes after the head, in a system message of its own, and differs between the turns.
    assert first["messages"][0]["role"] == "system" and "green" not in json.dumps(first["messages"][0])
    assert first["messages"][1]["role"] == second["messages"][1]["role"] == "system"
    assert "green" in first["messages"][1]["content"] and "Marigold" not in first["messages"][1]["content"]
    assert "Marigold" in second["messages"][1]["content"]
    assert [m["content"] for m in second["messages"][2:]] == ["hello", "echo: hello", "again"]
    assert "cache_control" not in json.dumps(scripted_llm.requests)  # an openai/ model is sent no marks


async def test_an_anthropic_model_is_sent_breakpoints_and_its_cache_reads_come_back(
        scripted_llm: ScriptedLLM) -> None:
    await asyncio.to_thread(warm_up)
    model = "anthropic/claude-3-5-haiku-latest"
    head = [{"role": "system", "content": "Be brief."}, {"role": "system", "content": "Memory: likes green."}]
    conversation = [*head, {"role": "user", "content": "hello"}, {"role": "assistant", "content": "echo: hello"},
                    {"role": "user", "content": "again"}]

    def client(**options: Any) -> LiteLLMClient:
        return LiteLLMClient(model=model, api_base=scripted_llm.api_base, api_key="sk-ant-scripted", timeout_s=20,
                             retries=0, **options)

    done = await client().complete(conversation, TOOLS, _ignore)
    body = scripted_llm.requests[-1]
    assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL},
                              {"type": "text", "text": "Memory: likes green."}]  # only the stable head is marked
    assert [tool.get("cache_control") for tool in body["tools"]] == [None, EPHEMERAL]  # and the last tool
    assert done.text == "echo: again"
    assert done.usage["prompt_tokens"] == 11 and done.usage["cached_tokens"] == 8  # the provider's cache read

    await client(prompt_cache=False).complete(conversation, TOOLS, _ignore)
    assert "cache_control" not in json.dumps(scripted_llm.requests[-1])  # brain.prompt_cache: false
