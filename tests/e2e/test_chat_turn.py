"""End to end: real Gateway, Brain and Hands processes over a real Redis, litellm against a scripted server."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from httpx_sse import connect_sse

from tests.conftest import OWNER_TOOL_NAMES, TOOL_NAMES, Processes, gateway_client, gateway_url, wait_until
from tests.e2e.conftest import send, start_stack
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.e2e


@pytest.fixture
def stack(processes: Processes, pincer_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    (tmp_path / "workspace" / "notes.txt").write_text("the secret word is pincer-42\n")
    start_stack(processes)
    return pincer_env


def test_a_chat_turn_reads_a_file_through_hands(stack: dict[str, str], scripted_llm: ScriptedLLM) -> None:
    response = send(stack, 'CALL read_file {"path": "notes.txt"}')
    assert response.status_code == 200, response.text
    body = response.json()
    assert "pincer-42" in body["text"] and body["text"].startswith("RESULT read_file:")
    assert body["model"] and body["usage"]["total_tokens"] == 36  # two model calls of 18 tokens
    assert [c["tool"] for c in body["tool_calls"]] == ["read_file"]

    # litellm really spoke HTTP to the model, offering the tools Hands announced.
    first = scripted_llm.requests[0]
    assert first["stream"] is True
    assert sorted(t["function"]["name"] for t in first["tools"]) == OWNER_TOOL_NAMES  # the owner's turn
    assert "tidy-notes" in first["messages"][0]["content"]  # the instruction skill is offered in the prompt

    with gateway_client(stack) as client:
        transcript = client.get("/v1/sessions/e2e").json()["entries"]
    assert [e["role"] for e in transcript] == ["user", "assistant", "tool", "assistant"]
    assert transcript[1]["tool_calls"][0]["function"] == {"name": "read_file", "arguments": '{"path": "notes.txt"}'}
    tool = transcript[2]
    assert "pincer-42" in tool["content"] and tool["metadata"]["success"] is True
    assert tool["metadata"]["worker_id"].startswith("hands-")  # it ran on a Hands worker process


def test_the_reply_streams_as_server_sent_events(stack: dict[str, str]) -> None:
    events = []
    with gateway_client(stack) as client, connect_sse(
        client, "POST", "/v1/sessions/sse/messages",
        json={"text": 'CALL list_directory {}'},
    ) as source:
        assert source.response.status_code == 200
        events = [(e.event, json.loads(e.data)) for e in source.iter_sse()]
    kinds = [kind for kind, _ in events]
    assert kinds[:2] == ["tool", "tool"] and kinds[-1] == "reply"
    assert events[0][1]["status"] == "started" and events[1][1]["status"] == "finished"
    deltas = "".join(data["text"] for kind, data in events if kind == "delta")
    assert "notes.txt" in deltas and deltas == events[-1][1]["text"]
    assert kinds.count("delta") > 1  # text arrives in pieces, as the model sends it


def test_unknown_tool_and_invalid_arguments_reach_the_model(stack: dict[str, str]) -> None:
    body = send(stack, 'CALL teleport {"to": "mars"}\nCALL read_file {"path": 5}').json()
    teleport, read = body["text"].split("\n", 1)
    assert teleport.startswith("RESULT teleport:") and '"error": "TOOL_NOT_FOUND"' in teleport
    assert "available tools: " + ", ".join(OWNER_TOOL_NAMES) in teleport
    assert '"error": "INVALID_ARGUMENTS"' in read and "path: 5 is not of type 'string'" in read


def test_model_failure_is_a_clear_error(stack: dict[str, str]) -> None:
    response = send(stack, "STATUS 401")
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "MODEL_ERROR" and "refused the API key" in error["message"]


def test_pincer_chat_cli(stack: dict[str, str], processes: Processes) -> None:
    ok = processes.run("chat", "-m", 'CALL read_file {"path": "notes.txt"}', "--session", "cli")
    assert ok.returncode == 0, ok.stderr
    assert "pincer-42" in ok.stdout
    assert "read_file" in ok.stderr  # tool calls are shown as they happen
    failed = processes.run("chat", "-m", "STATUS 401")
    assert failed.returncode == 1 and "MODEL_ERROR" in failed.stderr
    gone = processes.run("chat", "-m", "hi", "--url", "http://127.0.0.1:9")
    assert gone.returncode == 1 and "cannot reach the Gateway" in gone.stderr
    talk = processes.run("chat", "--session", "talk", input="first line\n\nsecond line\n")
    assert talk.returncode == 0, talk.stderr
    assert "echo: first line" in talk.stdout and "echo: second line" in talk.stdout
    tools = processes.run("tools", "--json")
    assert tools.returncode == 0, tools.stderr
    assert [t["name"] for t in json.loads(tools.stdout)] == TOOL_NAMES


def test_a_pool_with_no_hands_ends_the_turn_with_an_error(processes: Processes, pincer_env: dict[str, str]) -> None:
    start_stack(processes, hands=0)
    assert httpx.get(f"{gateway_url(pincer_env)}/healthz").status_code == 503
    response = send(pincer_env, 'CALL read_file {"path": "notes.txt"}')
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "SERVICE_UNAVAILABLE" and "no Hands worker answered" in error["message"]


def test_no_brain_is_refused_at_the_door(processes: Processes, pincer_env: dict[str, str]) -> None:
    start_stack(processes, hands=1, brain=False)
    response = send(pincer_env, "hello")
    assert response.status_code == 503 and "no Brain is running" in response.json()["error"]["message"]


def test_bad_requests_get_clear_errors(stack: dict[str, str]) -> None:
    api = gateway_client(stack)
    json_type = {"content-type": "application/json"}
    assert api.post("/v1/sessions/ok/messages", content=b"{nope", headers=json_type).status_code == 400
    empty = api.post("/v1/sessions/ok/messages", json={"text": ""})
    assert empty.status_code == 400 and "text" in empty.json()["error"]["message"]
    assert api.post("/v1/sessions/..%2Fx/messages", json={"text": "x"}).status_code in (400, 404)
    assert api.get("/v1/sessions/never-used").status_code == 404
    assert api.delete("/v1/sessions/never-used").status_code == 404
    assert send(stack, "hello", session="to-delete").status_code == 200
    assert "to-delete" in api.get("/v1/sessions").json()["sessions"]
    assert api.delete("/v1/sessions/to-delete").json() == {"session_id": "to-delete", "deleted": True}
    assert api.get("/v1/sessions/to-delete").status_code == 404


def test_pincer_skills_lists_loaded_and_refused(processes: Processes, tmp_path: Path) -> None:
    from tests.conftest import make_skill

    user_skills = tmp_path / "my-skills"
    make_skill(user_skills, "greedy", "name: greedy\ndescription: x\nparameters: {}\n"
               "permissions: {filesystem: {write: ['/**']}}", "def handle(args, ctx):\n    return 1\n")
    from tests.conftest import SHIPPED_SKILLS

    env = {"PINCER_HANDS__SKILL_DIRS": f'["{SHIPPED_SKILLS}", "{user_skills}"]'}
    listed = processes.run("skills", "--json", extra_env=env)
    assert listed.returncode == 0, listed.stderr
    report = json.loads(listed.stdout)
    assert [t["name"] for t in report["tools"]] == ["word_count"]
    assert [s["name"] for s in report["instructions"]] == ["tidy-notes"]
    assert len(report["refused"]) == 1 and "asks for more than the global policy" in report["refused"][0]["reason"]
    table = processes.run("skills", extra_env=env)
    assert "refused" in table.stdout and "word_count" in table.stdout


def test_exec_approval_is_asked_inline_by_pincer_chat(processes: Processes, pincer_env: dict[str, str]) -> None:
    import shutil
    import tempfile

    workspace = Path(tempfile.mkdtemp(prefix="pincer-e2e-ws-"))
    workspace.chmod(0o755)
    try:
        processes.env = {**pincer_env, "PINCER_WORKSPACE": str(workspace), "PINCER_HANDS__EXEC__MODE": "ask",
                         "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true"}
        start_stack(processes, hands=1)
        command = 'CALL exec {"command": "echo approved > out.txt; cat out.txt"}'
        refused = processes.run("chat", "-m", command, "--session", "a1", input="n\n")
        assert refused.returncode == 0, refused.stderr
        assert "Approve running this?" in refused.stderr and "APPROVAL_DENIED" in refused.stdout
        assert not (workspace / "out.txt").exists()
        allowed = processes.run("chat", "-m", command, "--session", "a2", input="y\n")
        assert allowed.returncode == 0, allowed.stderr
        assert '"stdout": "approved\\n"' in allowed.stdout and (workspace / "out.txt").read_text() == "approved\n"
        stale = gateway_client(processes.env).post("/v1/approvals/nope", json={"decision": "deny"})
        assert stale.status_code == 404 and "answered, or it expired" in stale.json()["error"]["message"]
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def test_ask_user_is_asked_in_the_terminal_by_pincer_chat(processes: Processes, pincer_env: dict[str, str],
                                                          scripted_llm: ScriptedLLM) -> None:
    processes.env = pincer_env
    start_stack(processes, hands=1)
    ask = ('CALL ask_user {"questions": [{"text": "Which \\u001b[2Jcolour?", "choices": ["red", "blue"]}, '
           '{"text": "Why?"}]}')
    # "green" is no choice: asked again; "2" picks blue; the written answer is any line
    answered = processes.run("chat", "-m", ask, "--session", "q1", input="green\n2\nit is calm\n")
    assert answered.returncode == 0, answered.stderr
    assert "Which \\x1b[2Jcolour?" in answered.stderr and "\x1b" not in answered.stderr  # never drives it
    assert "1. red" in answered.stderr and "(one of 1-2)" in answered.stderr and "Why?" in answered.stderr
    assert '"answers": ["blue", "it is calm"]' in answered.stdout
    results = [m["content"] for b in scripted_llm.requests for m in b["messages"] if m.get("role") == "tool"]
    assert [json.loads(r) for r in results] == [{"answers": ["blue", "it is calm"], "by": "owner"}]


def test_cancel_through_the_gateway_kills_the_running_command(processes: Processes,
                                                             pincer_env: dict[str, str]) -> None:
    import shutil
    import tempfile
    import threading

    from tests.conftest import processes_matching

    workspace = Path(tempfile.mkdtemp(prefix="pincer-e2e-cancel-"))
    workspace.chmod(0o755)
    try:
        processes.env = {**pincer_env, "PINCER_WORKSPACE": str(workspace),
                         "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true"}
        start_stack(processes, hands=1)
        replies: list[httpx.Response] = []
        turn = threading.Thread(target=lambda: replies.append(
            send(processes.env, 'CALL exec {"command": "sleep 77.25", "timeout": 600, "yield_ms": 100000}',
                 session="cancel-me")))
        turn.start()
        wait_until(lambda: processes_matching("sleep 77.25"), timeout=30, what="the command to start")
        cancel = gateway_client(processes.env).post("/v1/sessions/cancel-me/cancel")
        assert cancel.status_code == 202
        turn.join(30)
        assert replies and replies[0].status_code == 502
        assert replies[0].json()["error"]["code"] == "CANCELLED"
        wait_until(lambda: not processes_matching("sleep 77.25"), timeout=15, what="the command to be killed")
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def test_pincer_chat_prints_what_models_and_tools_wrote_without_obeying_it(stack: dict[str, str],
                                                                           processes: Processes) -> None:
    hostile = "CALL [/bold]\x1b[8mtool {}\nplus \x1b]0;owned\x07 a title and \x1b[2J a clear"
    done = processes.run("chat", "-m", hostile, "--session", "hostile")
    assert done.returncode == 0, done.stderr  # rich markup in a tool name no longer crashes it
    assert "[/bold]" in done.stderr and "TOOL_NOT_FOUND" in done.stdout
    for output in (done.stdout, done.stderr):
        assert "\x1b" not in output and "\x07" not in output
