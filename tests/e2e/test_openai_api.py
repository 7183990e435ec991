"""The official ``openai`` SDK, sync and async, against real Gateway, Brain and Hands processes."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis

from tests.conftest import OWNER_TOKEN, Processes, gateway_url, processes_matching, stack_healthy, wait_until
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.e2e


@pytest.fixture
def options() -> dict[str, str]:
    """Extra settings for the stack (a test may override it)."""
    return {}


@pytest.fixture
def stack(processes: Processes, pincer_env: dict[str, str], options: dict[str, str]) -> Iterator[dict[str, str]]:
    workspace = Path(tempfile.mkdtemp(prefix="pincer-e2e-oai-"))
    workspace.chmod(0o755)
    (workspace / "notes.txt").write_text("the secret word is pincer-42\n")
    processes.env = {**pincer_env, "PINCER_WORKSPACE": str(workspace), "PINCER_BRAIN__AGENTS": "{coder: {}}",
                     "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true",
                     "PINCER_BRAIN__OPENAI_DIRECT": "true", **options}  # the default road for openai/ models
    processes.start("gateway", name="gateway")
    processes.start("brain", name="brain")
    processes.start("hands", name="hands")
    wait_until(lambda: stack_healthy(processes.env), timeout=60, what="a healthy stack")
    yield processes.env
    shutil.rmtree(workspace, ignore_errors=True)


def client(env: dict[str, str], key: str = OWNER_TOKEN, **options: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway_url(env)}/v1", api_key=key, max_retries=0, **options)  # type: ignore[arg-type]


def test_models_and_plain_answers(stack: dict[str, str], processes: Processes) -> None:
    api = client(stack)
    assert [m.id for m in api.models.list()] == ["pincer", "pincer/coder"]
    assert api.models.retrieve("pincer/coder").id == "pincer/coder"

    answer = api.chat.completions.create(model="pincer", messages=[{"role": "user", "content": "hello"}])
    assert answer.object == "chat.completion" and answer.choices[0].message.content == "echo: hello"
    assert answer.choices[0].finish_reason == "stop" and answer.usage and answer.usage.total_tokens == 18

    stream = api.chat.completions.create(model="pincer/coder", stream=True, stream_options={"include_usage": True},
                                         messages=[{"role": "user", "content": "stream this please"}])
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: stream this please" and len([c for c in chunks if c.choices]) > 3
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage and chunks[-1].usage.total_tokens == 18
    # openai/ models took the SDK's road: the Brain never loaded litellm (~150 MB it would hold idle).
    brain = next(proc for name, proc, _ in processes.started if name == "brain")
    assert "litellm" not in Path(f"/proc/{brain.pid}/maps").read_text()


def test_a_tool_turn_shows_its_call_and_quotes_the_file(stack: dict[str, str]) -> None:
    api = client(stack)
    messages = [{"role": "user", "content": 'CALL read_file {"path": "notes.txt"}'}]
    answer = api.chat.completions.create(model="pincer", messages=messages)  # type: ignore[arg-type]
    content = answer.choices[0].message.content or ""
    assert '🔧 read_file({"path": "notes.txt"}) → ok' in content and "pincer-42" in content
    assert [c["tool"] for c in answer.model_extra["pincer"]["tool_calls"]] == ["read_file"]  # type: ignore[index]

    chunks = list(api.chat.completions.create(model="pincer", messages=messages, stream=True))  # type: ignore[arg-type]
    tools = [c.model_extra["pincer"]["tool"] for c in chunks if c.model_extra and "pincer" in c.model_extra]
    assert [(t["tool"], t["status"]) for t in tools] == [("read_file", "started"), ("read_file", "finished")]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed.index("🔧 read_file") < streamed.index("RESULT read_file")


def test_a_delegation_shows_as_a_tool_with_its_sub_agents_calls_nested(stack: dict[str, str],
                                                                        processes: Processes) -> None:
    api = client(stack, default_headers={"X-OpenWebUI-Chat-Id": "owui-delegating"})
    task = 'CALL read_file {"path": "notes.txt"}'
    messages = [{"role": "user", "content": "CALL delegate " + json.dumps({"task": task})}]
    chunks = list(api.chat.completions.create(model="pincer", messages=messages, stream=True))  # type: ignore[arg-type]
    tools = [c.model_extra["pincer"]["tool"] for c in chunks if c.model_extra and "pincer" in c.model_extra]
    assert [(t["tool"], t["status"]) for t in tools] == [("delegate", "started"), ("read_file", "started"),
                                                         ("read_file", "finished"), ("delegate", "finished")]
    assert tools[1]["parent_call_id"] == tools[0]["call_id"] and "parent_call_id" not in tools[0]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert '↳ 🔧 read_file({"path": "notes.txt"}) → ok' in streamed
    assert streamed.index("↳ 🔧 read_file") < streamed.index("🔧 delegate(") < streamed.index("RESULT delegate")
    assert "pincer-42" in streamed  # the sub-agent read the file; its answer came back as the tool's result
    # `pincer trace` shows the sub-agent's turn under the delegate call, across the processes' records.
    printed = processes.run("trace", "owui-delegating").stdout
    lines = printed.splitlines()
    delegate = next(i for i, line in enumerate(lines) if "tool delegate" in line)
    assert "-> owner/owui-delegating:sub-" in lines[delegate]
    assert any("    tool read_file" in line for line in lines[delegate + 1:])
    child = lines[delegate].rpartition("-> owner/")[2]
    read = httpx.get(f"{gateway_url(stack)}/v1/sessions/{child}", timeout=10,
                     headers={"Authorization": f"Bearer {OWNER_TOKEN}"})
    assert read.status_code == 200 and read.json()["entries"][0]["content"] == task


def test_a_sub_agents_question_reaches_the_stream_and_is_answered_over_http(stack: dict[str, str]) -> None:
    """ask_user in a delegated turn: relayed into the parent's stream as a line and ``pincer.question``; the
    answer, posted by the stream's own client, reaches the sub-agent and comes back through its answer."""
    api = client(stack, default_headers={"X-OpenWebUI-Chat-Id": "owui-asking"})
    task = 'CALL ask_user {"questions": [{"text": "Ship it?", "choices": ["yes", "not yet"]}]}'
    messages = [{"role": "user", "content": "CALL delegate " + json.dumps({"task": task})}]
    streamed, asked = "", []
    for chunk in api.chat.completions.create(model="pincer", messages=messages, stream=True):  # type: ignore[arg-type]
        streamed += chunk.choices[0].delta.content or "" if chunk.choices else ""
        question = (chunk.model_extra or {}).get("pincer", {}).get("question")
        if question:
            asked.append(question)
            answered = httpx.post(f"{gateway_url(stack)}/v1/questions/{question['question_id']}",
                                  json={"answers": ["not yet"]}, headers={"Authorization": f"Bearer {OWNER_TOKEN}"},
                                  timeout=10)
            assert answered.status_code == 200, answered.text
    assert [q["questions"] for q in asked] == [[{"text": "Ship it?", "choices": ["yes", "not yet"]}]]
    assert f"❓ Ship it? [yes, not yet] (POST /v1/questions/{asked[0]['question_id']})" in streamed
    assert '"answers": ["not yet"]' in streamed.replace('\\"', '"')  # the sub-agent's answer quotes its result


def test_a_session_header_keeps_pincers_transcript_as_the_record(stack: dict[str, str],
                                                                 scripted_llm: ScriptedLLM) -> None:
    api = client(stack, default_headers={"X-OpenWebUI-Chat-Id": "owui-chat-1"})
    history: list[dict[str, str]] = [{"role": "system", "content": "Answer like a pirate."}]
    for text in ("first", "second", "third"):
        history.append({"role": "user", "content": text})
        answer = api.chat.completions.create(model="pincer", messages=history)  # type: ignore[arg-type]
        # The client keeps its own (here: altered) copy; Pincer's transcript is what the model reads.
        history.append({"role": "assistant", "content": f"(client's copy of {text})"})
        assert answer.choices[0].message.content == f"echo: {text}"
    sent = scripted_llm.requests[-1]["messages"]
    assert [m["content"] for m in sent if m["role"] == "user"] == ["first", "second", "third"]
    assert [m["content"] for m in sent if m["role"] == "assistant"] == ["echo: first", "echo: second"]
    assert sent[0]["content"].startswith("You are Pincer")  # the agent's instructions first, as cached
    assert "Answer like a pirate." in sent[1]["content"] and sent[1]["role"] == "system"  # added, not replaced
    transcript = httpx.get(f"{gateway_url(stack)}/v1/sessions/owui-chat-1", timeout=10,
                           headers={"Authorization": f"Bearer {OWNER_TOKEN}"}).json()["entries"]
    assert len(transcript) == 6


def test_without_a_session_the_messages_are_the_context_of_one_that_expires(stack: dict[str, str],
                                                                           scripted_llm: ScriptedLLM) -> None:
    api = client(stack)
    raw = api.chat.completions.with_raw_response.create(model="pincer", messages=[
        {"role": "user", "content": "my name is Ada"}, {"role": "assistant", "content": "Hello Ada"},
        {"role": "user", "content": [{"type": "text", "text": "what is"}, {"type": "text", "text": "my name?"}]},
    ])
    session = raw.headers["x-pincer-session"]
    assert session.startswith("oai-") and raw.parse().choices[0].message.content == "echo: what is\nmy name?"
    sent = scripted_llm.requests[-1]["messages"]
    assert [(m["role"], m["content"]) for m in sent[1:]] == [
        ("user", "my name is Ada"), ("assistant", "Hello Ada"), ("user", "what is\nmy name?")]
    store = redis.Redis.from_url(stack["PINCER_REDIS_URL"])
    ttl = store.ttl(f"{stack['PINCER_REDIS__PREFIX']}session:{{owner/{session}}}:transcript")  # the token's own
    assert 0 < ttl <= 3600  # gateway.openai.ephemeral_ttl_s
    for log in ("events", "events-seq"):  # its event log goes with it (not a day, as a named session's does)
        left = store.ttl(f"{stack['PINCER_REDIS__PREFIX']}session:{{owner/{session}}}:{log}")
        assert 0 < left <= 3600, (log, left)


def test_what_pincer_cannot_honour_is_refused(stack: dict[str, str]) -> None:
    api = client(stack)
    with pytest.raises(openai.AuthenticationError):
        client(stack, key="pcr_wrong").models.list()
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        api.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError, match="client-side tools"):
        api.chat.completions.create(model="pincer", messages=[{"role": "user", "content": "hi"}],
                                    tools=[tool])  # type: ignore[list-item]
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        api.chat.completions.create(model="pincer", n=2, messages=[{"role": "user", "content": "hi"}])
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    with pytest.raises(openai.BadRequestError, match="image_url"):
        api.chat.completions.create(model="pincer", messages=[{"role": "user", "content": [image]}])  # type: ignore[list-item]
    with pytest.raises(openai.BadRequestError, match="last message must be the user's"):
        api.chat.completions.create(model="pincer", messages=[{"role": "assistant", "content": "hi"}])
    with pytest.raises(openai.InternalServerError) as failed:  # the provider refused: a 502 with the reason
        api.chat.completions.create(model="pincer", messages=[{"role": "user", "content": "STATUS 401"}])
    assert failed.value.status_code == 502 and "MODEL_ERROR" in str(failed.value.body)


async def test_the_async_sdk_streams_too(stack: dict[str, str]) -> None:
    api = openai.AsyncOpenAI(base_url=f"{gateway_url(stack)}/v1", api_key=OWNER_TOKEN, max_retries=0)
    stream = await api.chat.completions.create(model="pincer", stream=True,
                                               messages=[{"role": "user", "content": "async hello"}])
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "echo: async hello"
    turns = await asyncio.gather(*(api.chat.completions.create(
        model="pincer", messages=[{"role": "user", "content": f"parallel {i}"}]) for i in range(3)))
    assert sorted(t.choices[0].message.content or "" for t in turns) == [f"echo: parallel {i}" for i in range(3)]
    await api.close()


def test_a_client_that_hangs_up_mid_stream_leaves_no_tool_running(stack: dict[str, str]) -> None:
    api = client(stack)
    command = 'CALL exec {"command": "sleep 88.5", "timeout": 600, "yield_ms": 100000}'
    stream = api.chat.completions.create(model="pincer", stream=True, messages=[{"role": "user", "content": command}],
                                         extra_headers={"X-Pincer-Session": "hang-up"})
    for chunk in stream:
        if chunk.model_extra and chunk.model_extra.get("pincer", {}).get("tool", {}).get("status") == "started":
            break
    wait_until(lambda: processes_matching("sleep 88.5"), timeout=30, what="the command to start")
    stream.close()
    wait_until(lambda: not processes_matching("sleep 88.5"), timeout=30, what="the command to be killed")


@pytest.mark.parametrize("options", [{
    "PINCER_GATEWAY__OPENAI__SESSION_FROM_USER": "true", "PINCER_GATEWAY__OPENAI__SHOW_TOOLS": "none",
    "PINCER_GATEWAY__CORS": "true", "PINCER_GATEWAY__ALLOWED_ORIGINS": '["https://chat.example"]'}])
def test_sessions_from_librechat_or_the_user_field_tools_hidden_and_cors(stack: dict[str, str],
                                                                        scripted_llm: ScriptedLLM) -> None:
    api = client(stack, default_headers={"X-Conversation-Id": "librechat-7"})
    for text in ("one", "two"):
        api.chat.completions.create(model="pincer", messages=[{"role": "user", "content": text}])
    assert [m["content"] for m in scripted_llm.requests[-1]["messages"] if m["role"] == "user"] == ["one", "two"]

    by_user = client(stack)  # no header: the user field names the session (gateway.openai.session_from_user)
    for text in ("first", "second"):
        raw = by_user.chat.completions.with_raw_response.create(
            model="pincer", user="ada@example.com", messages=[{"role": "user", "content": text}])
    assert raw.headers["x-pincer-session"].startswith("user-")
    assert [m["content"] for m in scripted_llm.requests[-1]["messages"] if m["role"] == "user"] == ["first", "second"]

    quiet = by_user.chat.completions.create(
        model="pincer", messages=[{"role": "user", "content": 'CALL read_file {"path": "notes.txt"}'}]
    )
    content = quiet.choices[0].message.content or ""
    assert "🔧" not in content and "pincer-42" in content  # show_tools: none
    assert [c["tool"] for c in quiet.model_extra["pincer"]["tool_calls"]] == ["read_file"]  # type: ignore[index]

    preflight = httpx.options(f"{gateway_url(stack)}/v1/chat/completions", timeout=10, headers={
        "Origin": "https://chat.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://chat.example"
    foreign = httpx.options(f"{gateway_url(stack)}/v1/chat/completions", timeout=10, headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in foreign.headers
