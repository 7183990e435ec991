"""The real litellm path against the scripted server: streaming assembly, error translation, fallbacks."""

from __future__ import annotations

import pytest

from brain.llm import LiteLLMClient, LLMError
from bus.protocol import ErrorCode, ToolSpec
from tests.conftest import closed_after_test
from tests.scripted_llm import ScriptedLLM

TOOLS = [ToolSpec(name="read_file", description="read", parameters={"type": "object"})]


# Both roads a model call takes: litellm's, and the openai SDK's own for `openai/` models.
pytestmark = [pytest.mark.parametrize("direct", [False, True], ids=["litellm", "openai-direct"]),
              pytest.mark.usefixtures("close_model_clients")]


async def ignore(_text: str) -> None:
    return None


def client(server: ScriptedLLM, model: str, fallbacks: list[str] | None = None, *,
           direct: bool) -> LiteLLMClient:
    return closed_after_test(LiteLLMClient(model=model, api_base=server.api_base, api_key="sk-test", timeout_s=20,
                                           retries=0, fallbacks=fallbacks, openai_direct=direct))


async def test_tool_calls_are_assembled_from_streamed_pieces(scripted_llm: ScriptedLLM, direct: bool) -> None:
    texts: list[str] = []

    async def on_text(text: str) -> None:
        texts.append(text)

    done = await client(scripted_llm, "openai/scripted", direct=direct).complete(
        [{"role": "user", "content": 'CALL read_file {"path": "a/b/c.txt"}\nCALL read_file {"path": "d"}'}],
        TOOLS, on_text)
    assert [(c.name, c.arguments) for c in done.tool_calls] == [("read_file", '{"path": "a/b/c.txt"}'),
                                                                ("read_file", '{"path": "d"}')]
    # cached_tokens: the provider's prompt_tokens_details, read through both roads
    assert done.usage == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18, "cached_tokens": 0}
    assert done.finish_reason == "tool_calls"
    echoed = await client(scripted_llm, "openai/scripted", direct=direct).complete(
        [{"role": "user", "content": "hello there"}], TOOLS, on_text
    )
    assert echoed.text == "echo: hello there" and "".join(texts) == "echo: hello there" and len(texts) > 1


async def test_rate_limited_model_falls_back_and_says_which_answered(scripted_llm: ScriptedLLM, direct: bool) -> None:
    done = await client(scripted_llm, "openai/fail429", ["openai/fail503", "openai/scripted"], direct=direct).complete(
        [{"role": "user", "content": "hi"}], TOOLS, ignore)
    assert done.text == "echo: hi" and done.model.endswith("scripted")
    assert [t.split(":")[0] for t in done.tried] == ["openai/fail429", "openai/fail503"]
    assert [r["model"] for r in scripted_llm.requests] == ["fail429", "fail503", "scripted"]


@pytest.mark.parametrize(("models", "code", "text"), [
    (["openai/fail401", "openai/scripted"], ErrorCode.MODEL_ERROR, "refused the API key"),  # no fallback for that
    (["openai/fail429", "openai/fail503"], ErrorCode.SERVICE_UNAVAILABLE, "every model failed"),
])
async def test_errors_that_fallbacks_do_not_fix(scripted_llm: ScriptedLLM, models: list[str], code: ErrorCode,
                                                text: str, direct: bool) -> None:
    with pytest.raises(LLMError) as info:
        await client(scripted_llm, models[0], models[1:], direct=direct).complete(
            [{"role": "user", "content": "hi"}], TOOLS, ignore
        )
    assert info.value.code is code and text in info.value.message


async def test_no_key_at_all_says_how_to_configure_one(scripted_llm: ScriptedLLM, direct: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    keyless = LiteLLMClient(model="openai/scripted", api_base=scripted_llm.api_base, api_key=None, timeout_s=20,
                            retries=0, openai_direct=direct)

    with pytest.raises(LLMError) as info:
        await keyless.complete([{"role": "user", "content": "hi"}], TOOLS, ignore)
    assert info.value.code is ErrorCode.MODEL_NOT_CONFIGURED and "PINCER_MODEL" in info.value.message


async def test_a_model_slower_than_the_timeout_is_said_to_be_one(scripted_llm: ScriptedLLM, direct: bool) -> None:
    slow = closed_after_test(LiteLLMClient(model="openai/scripted", api_base=scripted_llm.api_base,
                                           api_key="sk-test", timeout_s=1, retries=0, openai_direct=direct))

    with pytest.raises(LLMError) as info:
        await slow.complete([{"role": "user", "content": "SLEEP 3\nslow"}], TOOLS, ignore)
    # a timeout moves on to the fallbacks; with none left, every model failed, each saying why
    assert info.value.code is ErrorCode.SERVICE_UNAVAILABLE and "did not answer in time" in info.value.message
