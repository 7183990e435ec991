"""Cache breakpoints: which models are sent them, and where they go in the request litellm is given."""

from __future__ import annotations

import copy
import json

import pytest

from brain.config import BrainSettings
from brain.llm import LiteLLMClient
from brain.prompt import EPHEMERAL, takes_cache_marks
from brain.worker import default_llm
from bus.protocol import ToolSpec

TOOLS = [ToolSpec(name=name, description=name, parameters={"type": "object"}) for name in ("a_tool", "b_tool")]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "system", "content": "Memory: likes green."},
            {"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("model", "marked"), [
    ("anthropic/claude-3-5-haiku-latest", True), ("claude-3-5-sonnet-20240620", True),
    ("bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0", True), ("bedrock/us.anthropic.claude-3-7-sonnet", True),
    ("vertex_ai/claude-3-5-sonnet@20240620", True),
    ("openai/gpt-4o-mini", False), ("gemini/gemini-2.0-flash", False), ("groq/llama-3.3-70b-versatile", False),
    ("bedrock/meta.llama3-70b-instruct-v1:0", False), ("openai/scripted", False), ("ollama/claude-like", False),
])
def test_only_anthropic_family_models_take_cache_marks(model: str, marked: bool) -> None:
    assert takes_cache_marks(model) is marked


def client(model: str, **options: bool) -> LiteLLMClient:
    return LiteLLMClient(model=model, api_base=None, api_key=None, timeout_s=10, retries=0, **options)


def test_an_anthropic_request_marks_the_end_of_the_stable_head_and_nothing_else() -> None:
    given = copy.deepcopy(MESSAGES)
    sent = client("anthropic/claude-3-5-haiku-latest").request("anthropic/claude-3-5-haiku-latest", given, TOOLS)
    assert sent["messages"][0] == {"role": "system",
                                   "content": [{"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL}]}
    assert sent["messages"][1:] == MESSAGES[1:]  # what changes between turns is not marked
    assert [tool.get("cache_control") for tool in sent["tools"]] == [None, EPHEMERAL]  # the last tool
    assert given == MESSAGES  # the turn's own list (what the flight record keeps) is untouched


@pytest.mark.parametrize("model", ["openai/gpt-4o-mini", "gemini/gemini-2.0-flash"])
def test_other_providers_are_sent_no_marks(model: str) -> None:
    sent = client(model).request(model, MESSAGES, TOOLS)
    assert "cache_control" not in json.dumps(sent) and sent["messages"] == MESSAGES


def test_the_setting_turns_the_marks_off_and_a_fallback_gets_its_own_form() -> None:
    off = default_llm(BrainSettings(model="anthropic/claude-3-5-haiku-latest", prompt_cache=False))
    assert isinstance(off, LiteLLMClient)
    assert "cache_control" not in json.dumps(off.request(off.model, MESSAGES, TOOLS))
    on = default_llm(BrainSettings(model="anthropic/claude-3-5-haiku-latest", fallbacks=["openai/gpt-4o-mini"]))
    assert isinstance(on, LiteLLMClient) and on.prompt_cache  # on by default
    assert "cache_control" in json.dumps(on.request(on.model, MESSAGES, TOOLS))
    assert "cache_control" not in json.dumps(on.request("openai/gpt-4o-mini", MESSAGES, TOOLS))


def test_a_request_without_tools_or_a_leading_system_message_is_marked_where_it_can_be() -> None:
    model = "anthropic/claude-3-5-haiku-latest"
    sent = client(model).request(model, [{"role": "user", "content": "hi"}], [])
    assert "tools" not in sent and sent["messages"] == [{"role": "user", "content": "hi"}]
