"""The Gateway as a careful operator puts it on a network: every refusal, over real HTTP, real processes."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest
from httpx_sse import connect_sse

from tests.conftest import OWNER_TOKEN, Processes, gateway_client, gateway_url, wait_until
from tests.e2e.conftest import create_token
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.e2e


def test_every_endpoint_but_healthz_needs_a_valid_token(secured: dict[str, str], processes: Processes) -> None:
    with gateway_client(secured, token=None) as anonymous:
        assert anonymous.get("/healthz").status_code == 200
        for method, path in [("GET", "/v1/sessions"), ("GET", "/v1/sessions/x"), ("DELETE", "/v1/sessions/x"),
                             ("POST", "/v1/sessions/x/messages"), ("POST", "/v1/sessions/x/cancel"),
                             ("POST", "/v1/approvals/x"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions")]:
            refused = anonymous.request(method, path, json={"text": "hi"})
            assert refused.status_code == 401, (method, path)
            assert refused.headers["www-authenticate"] == "Bearer"
            assert refused.json()["error"]["code"] == "UNAUTHENTICATED"
        wrong = anonymous.get("/v1/sessions", headers={"Authorization": "Bearer pcr_not-a-token"})
        assert wrong.status_code == 401 and "not valid" in wrong.json()["error"]["message"]
        assert anonymous.get("/v1/sessions", headers={"Authorization": f"Basic {OWNER_TOKEN}"}).status_code == 401

    alice = create_token(processes, "alice")
    with gateway_client(secured, alice) as client:
        assert client.get("/v1/sessions").json()["sessions"] == []
    assert processes.run("token", "revoke", "alice").returncode == 0
    with gateway_client(secured, alice) as client:  # other Gateways' caches lapse within seconds
        wait_until(lambda: client.get("/v1/sessions").status_code == 401, timeout=10, what="the revoked token refused")
    listed = processes.run("token", "list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    assert "exists" in processes.run("token", "create", "dup").stderr + processes.run("token", "create", "dup").stderr
    assert processes.run("token", "create", "owner").returncode == 1  # the configured token's name


def test_foreign_hosts_origins_bodies_and_types_are_refused(secured: dict[str, str]) -> None:
    with gateway_client(secured) as client:
        rebinding = client.get("/v1/sessions", headers={"Host": "attacker.example:8780"})
        assert rebinding.status_code == 403 and "gateway.allowed_hosts" in rebinding.json()["error"]["message"]
        assert client.get("/v1/sessions", headers={"Host": f"localhost:{secured['PINCER_GATEWAY_PORT']}"}) \
            .status_code == 200
        # A foreign page's "simple" request: text/plain needs no preflight, so the Gateway itself must refuse.
        page = client.post("/v1/sessions/web/messages", content=b'{"text": "run exec"}',
                           headers={"Origin": "https://evil.example", "Content-Type": "text/plain"})
        assert page.status_code == 403 and page.json()["error"]["code"] == "FORBIDDEN"
        own = gateway_url(secured)
        assert client.get("/v1/sessions", headers={"Origin": own}).status_code == 200
        assert client.get("/v1/sessions", headers={"Origin": "null"}).status_code == 403
        plain = client.post("/v1/sessions/web/messages", content=b'{"text": "hi"}',
                            headers={"Content-Type": "text/plain"})
        assert plain.status_code == 415 and plain.json()["error"]["code"] == "UNSUPPORTED_MEDIA_TYPE"
        huge = client.post("/v1/sessions/web/messages", json={"text": "x" * (2 << 20)})
        assert huge.status_code == 413 and "gateway.max_body_bytes" in huge.json()["error"]["message"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            yield b'{"text": "'
            for _ in range(40):
                yield b"y" * 65536
            yield b'"}'

        streamed = client.post("/v1/sessions/web/messages", content=chunks(),
                               headers={"Content-Type": "application/json"})
        assert streamed.status_code == 413
        assert client.get("/v1/sessions").json()["sessions"] == []  # nothing of it reached the Brain


def test_a_chat_token_owns_its_sessions(secured: dict[str, str], processes: Processes) -> None:
    alice, bob = create_token(processes, "alice"), create_token(processes, "bob")
    a, b = gateway_client(secured, alice), gateway_client(secured, bob)
    assert a.post("/v1/sessions/alices/messages", json={"text": "hello"}).json()["text"] == "echo: hello"
    # Names are each identity's own: bob's "alices" is a session of bob's, never alice's.
    assert b.get("/v1/sessions/alices").status_code == 404
    assert b.post("/v1/sessions/alices/cancel").status_code == 404
    assert b.delete("/v1/sessions/alices").status_code == 404
    assert b.post("/v1/sessions/alices/messages", json={"text": "let me in"}).json()["text"] == "echo: let me in"
    assert b.get("/v1/sessions").json()["sessions"] == ["alices"]
    assert a.get("/v1/sessions").json()["sessions"] == ["alices"]
    assert [e["content"] for e in a.get("/v1/sessions/alices").json()["entries"]] == ["hello", "echo: hello"]
    for path in ("/v1/sessions/alices?owner=alice", "/v1/sessions?owner=alice", "/v1/sessions?owner=*"):
        refused = b.get(path)  # naming another owner is an operator's act, refused outright for a chat token
        assert refused.status_code == 403 and "operator" in refused.json()["error"]["message"], path
    assert b.post("/v1/sessions/alices/messages?owner=alice", json={"text": "x"}).status_code == 403
    owner = gateway_client(secured)
    assert owner.get("/v1/sessions").json()["sessions"] == []  # an operator's own list is its own
    assert owner.get("/v1/sessions/alices").status_code == 404  # and a bare name is its own name
    assert sorted(owner.get("/v1/sessions?owner=*").json()["sessions"]) == ["alice/alices", "bob/alices"]
    assert owner.get("/v1/sessions?owner=alice").json()["sessions"] == ["alice/alices"]
    on_purpose = owner.get("/v1/sessions/alices?owner=alice").json()
    assert on_purpose["session_id"] == "alice/alices" and len(on_purpose["entries"]) == 2

    # The token is the sender: read_file is alice's alone, whatever the body says.
    mine = a.post("/v1/sessions/alice-file/messages", json={"text": 'CALL read_file {"path": "notes.txt"}'})
    assert "pincer-42" in mine.json()["text"]
    theirs = b.post("/v1/sessions/bob-file/messages", json={"text": 'CALL read_file {"path": "notes.txt"}'})
    assert "pincer-42" not in theirs.json()["text"] and "TOOL_NOT_FOUND" in theirs.json()["text"]
    smuggled = b.post("/v1/sessions/bob-2/messages", json={"text": "hi", "sender": "alice"})
    assert smuggled.status_code == 400  # no field of the body names who sends it


def test_no_identity_can_take_anothers_default_session_through_any_door(secured: dict[str, str],
                                                                        processes: Processes) -> None:
    from websockets.sync.client import connect

    squatter = create_token(processes, "squatter")
    s = gateway_client(secured, squatter)
    assert s.post("/v1/sessions/main/messages", json={"text": "over http"}).status_code == 200
    completion = s.post("/v1/chat/completions", headers={"X-Pincer-Session": "main"},
                        json={"model": "pincer", "messages": [{"role": "user", "content": "over openai"}]})
    assert completion.status_code == 200 and completion.headers["x-pincer-session"] == "main"
    with connect(f"ws://127.0.0.1:{secured['PINCER_GATEWAY_PORT']}/v1/ws") as socket:
        socket.send(json.dumps({"type": "auth", "token": squatter}))
        assert json.loads(socket.recv(timeout=30))["type"] == "ready"
        socket.send(json.dumps({"type": "send", "session": "main", "text": "over the socket"}))
        assert json.loads(socket.recv(timeout=30))["type"] == "accepted"
        for frame in ({"type": "subscribe", "session": "main", "owner": "owner"},
                      {"type": "send", "session": "main", "owner": "owner", "text": "in yours"},
                      {"type": "cancel", "session": "main", "owner": "owner"}):
            socket.send(json.dumps(frame))
            refused = json.loads(socket.recv(timeout=30))
            assert refused["type"] == "error" and refused["code"] == "FORBIDDEN", frame

    chat = processes.run("chat", "-m", "the owner's words")  # no --session: the caller's own main
    assert chat.returncode == 0 and "echo: the owner's words" in chat.stdout, chat.stderr
    owner = gateway_client(secured)
    mine = [e["content"] for e in owner.get("/v1/sessions/main").json()["entries"] if e["role"] == "user"]
    assert mine == ["the owner's words"]
    theirs = wait_until(lambda: [e["content"] for e in s.get("/v1/sessions/main").json()["entries"]
                                 if e["role"] == "user"] if len(s.get("/v1/sessions/main").json()["entries"]) >= 6
                        else None, timeout=30, what="the squatter's three turns")
    assert sorted(theirs) == ["over http", "over openai", "over the socket"]
    for method, path in [("GET", "/v1/sessions/main"), ("GET", "/v1/sessions/main/events"),
                         ("POST", "/v1/sessions/main/messages"), ("POST", "/v1/sessions/main/cancel"),
                         ("DELETE", "/v1/sessions/main"), ("POST", "/v1/chat/completions")]:
        refused = s.request(method, f"{path}?owner=owner", json={"text": "x", "model": "pincer",
                                                                 "messages": [{"role": "user", "content": "x"}]})
        assert refused.status_code == 403, (method, path, refused.text)
    assert [e["content"] for e in owner.get("/v1/sessions/main").json()["entries"] if e["role"] == "user"] == mine


def test_only_the_sessions_owner_or_an_operator_decides_its_approvals(secured: dict[str, str],
                                                                      processes: Processes) -> None:
    alice, bob = create_token(processes, "alice"), create_token(processes, "bob")
    decided: list[httpx.Response] = []
    events: list[tuple[str, dict]] = []

    def alices_turn() -> None:
        with gateway_client(secured, alice) as client, connect_sse(
            client, "POST", "/v1/sessions/asks/messages", json={"text": 'CALL exec {"command": "echo approved"}'},
        ) as source:
            for event in source.iter_sse():
                events.append((event.event, json.loads(event.data)))

    turn = threading.Thread(target=alices_turn)
    turn.start()
    approval = wait_until(lambda: next((d for kind, d in events if kind == "approval"), None), timeout=30,
                          what="the approval request")
    path = f"/v1/approvals/{approval['approval_id']}"
    assert gateway_client(secured, bob).post(path, json={"decision": "allow-once"}).status_code == 404
    forged = gateway_client(secured, alice).post(path, json={"decision": "allow-once", "by": "the admin"})
    assert forged.status_code == 400  # who decides is the token's name, never the body's
    decided.append(gateway_client(secured, alice).post(path, json={"decision": "allow-once"}))
    turn.join(60)
    assert decided[0].status_code == 200 and decided[0].json()["by"] == "alice"
    assert events[-1][0] == "reply" and "approved" in events[-1][1]["text"]


def turn_deciding(env: dict[str, str], token: str, session: str, command: str,
                  decide: Callable[[dict], None] | None) -> list[tuple[str, dict]]:
    """One exec turn over SSE; each approval it asks is handed to ``decide`` (None: the turn may ask none)."""
    events: list[tuple[str, dict]] = []
    with gateway_client(env, token) as client, connect_sse(
        client, "POST", f"/v1/sessions/{session}/messages", json={"text": f'CALL exec {{"command": "{command}"}}'},
    ) as source:
        for event in source.iter_sse():
            events.append((event.event, json.loads(event.data)))
            if event.event == "approval":
                assert decide is not None, f"{command!r} was asked again: {events}"
                decide(events[-1][1])
    return events


def test_allow_always_from_a_chat_token_covers_only_that_identity(secured: dict[str, str],
                                                                  processes: Processes) -> None:
    from websockets.sync.client import connect

    alice, bob = create_token(processes, "alice"), create_token(processes, "bob")

    def over_http(token: str, decision: str) -> Callable[[dict], None]:
        def decide(approval: dict) -> None:
            answer = gateway_client(secured, token).post(f"/v1/approvals/{approval['approval_id']}",
                                                          json={"decision": decision})
            assert answer.status_code == 200, answer.text
        return decide

    def over_the_socket(token: str, decision: str) -> Callable[[dict], None]:
        def decide(approval: dict) -> None:
            with connect(f"ws://127.0.0.1:{secured['PINCER_GATEWAY_PORT']}/v1/ws") as socket:
                socket.send(json.dumps({"type": "auth", "token": token}))
                assert json.loads(socket.recv(timeout=30))["type"] == "ready"
                socket.send(json.dumps({"type": "decide", "approval_id": approval["approval_id"],
                                        "decision": decision}))
                assert json.loads(socket.recv(timeout=30))["type"] == "decided"
        return decide

    for command, door in (("date", over_http), ("uname", over_the_socket)):
        first = turn_deciding(secured, alice, "always", command, door(alice, "allow-always"))
        assert first[-1][0] == "reply" and "approval" in [kind for kind, _ in first]
        again = turn_deciding(secured, alice, "always", command, None)  # alice's rule: not asked again
        assert again[-1][0] == "reply"
        # bob (a chat token) and the owner (an operator) are asked, and bob's "no" holds for bob
        denied = turn_deciding(secured, bob, "theirs", command, door(bob, "deny"))
        assert "APPROVAL_DENIED" in json.dumps(denied[-1][1])
        asked = turn_deciding(secured, OWNER_TOKEN, "ops", command, door(OWNER_TOKEN, "allow-once"))
        assert "approval" in [kind for kind, _ in asked]

    explained = processes.run("policy", "explain", "exec", "--sender", "alice")
    assert explained.returncode == 0, explained.stderr
    assert "hands.exec.mode ask" in explained.stdout
    rules = [line for line in explained.stdout.splitlines() if "allow-always by alice" in line]
    assert len(rules) == 2 and all("allowed for alice only on agent 'main'" in r for r in rules), explained.stdout
    assert "allow-always" not in processes.run("policy", "explain", "exec", "--sender", "bob").stdout


def test_agents_outside_the_tokens_list_are_refused(secured: dict[str, str], processes: Processes) -> None:
    narrow = create_token(processes, "narrow", "--agent", "main")
    with gateway_client(secured, narrow) as client:
        refused = client.post("/v1/sessions/n1/messages", json={"text": "hi", "agent_id": "coder"})
        assert refused.status_code == 403 and "may not use agent 'coder'" in refused.json()["error"]["message"]
        assert client.post("/v1/sessions/n2/messages", json={"text": "hi"}).status_code == 200
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["pincer"]
    with gateway_client(secured) as owner:
        assert [m["id"] for m in owner.get("/v1/models").json()["data"]] == ["pincer", "pincer/coder"]
        unknown = owner.post("/v1/sessions/n3/messages", json={"text": "hi", "agent_id": "ghost"})
        assert unknown.status_code == 404 and "no agent named 'ghost'" in unknown.json()["error"]["message"]


def test_open_turns_and_message_rates_are_limited_per_token(secured: dict[str, str], processes: Processes) -> None:
    busy = create_token(processes, "busy")
    results: list[httpx.Response] = []
    slow = threading.Thread(target=lambda: results.append(
        gateway_client(secured, busy).post("/v1/sessions/slow/messages", json={"text": "SLEEP 4"})))
    slow.start()
    with gateway_client(secured, busy) as client:
        # The slow turn is running once the Brain has written its message into the transcript.
        wait_until(lambda: client.get("/v1/sessions/slow").status_code == 200, timeout=30,
                   what="the slow turn to be running")
        second = client.post("/v1/sessions/other/messages", json={"text": "hi"})
        assert second.status_code == 429, second.text
        assert second.headers["retry-after"] == "1" and "open_turns_per_token" in second.json()["error"]["message"]
        slow.join(30)
        assert results[0].status_code == 200
        # 6 messages a minute in a burst of 6: one was sent above (the refused one counts nothing).
        codes = [client.post("/v1/sessions/rate/messages", json={"text": f"m{i}"}).status_code for i in range(8)]
        assert codes[:5] == [200] * 5 and 429 in codes[5:], codes  # a token comes back every 10 s
        limited = client.post("/v1/sessions/rate/messages", json={"text": "again"})
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    with gateway_client(secured) as owner:  # another token has its own bucket
        assert owner.post("/v1/sessions/owner-rate/messages", json={"text": "hi"}).status_code == 200


def test_no_token_text_reaches_any_log(secured: dict[str, str], processes: Processes) -> None:
    alice = create_token(processes, "alice")
    gateway_client(secured, alice).post("/v1/sessions/logged/messages", json={"text": "hi"})
    gateway_client(secured, alice + "x").get("/v1/sessions")
    logs = processes.logs()
    assert "message in" in logs  # the logs did capture the Gateway's work
    for secret in (alice, OWNER_TOKEN, alice[4:], OWNER_TOKEN[4:]):
        assert secret not in logs


def test_a_public_bind_without_a_token_refuses_to_start(processes: Processes, pincer_env: dict[str, str]) -> None:
    processes.env = {k: v for k, v in pincer_env.items() if k != "PINCER_GATEWAY_TOKEN"}
    exposed = processes.run("gateway", extra_env={"PINCER_GATEWAY__HOST": "0.0.0.0"})
    assert exposed.returncode == 78  # EX_CONFIG: a service manager does not restart it
    assert "refusing to listen on 0.0.0.0 with no token" in exposed.stderr
    assert "pincer token create" in exposed.stderr


def test_the_scripted_model_saw_no_owner_only_tool_for_bob(secured: dict[str, str], processes: Processes,
                                                           scripted_llm: ScriptedLLM) -> None:
    bob = create_token(processes, "bob")
    gateway_client(secured, bob).post("/v1/sessions/bob-tools/messages", json={"text": "hi"})
    offered = [t["function"]["name"] for t in scripted_llm.requests[-1]["tools"]]
    assert "read_file" not in offered and "write_file" in offered


def test_a_stream_left_before_its_first_chunk_holds_nothing_and_sends_its_message(
        secured: dict[str, str], processes: Processes) -> None:
    """A client that leaves once it has the headers: its open-turn place comes back (the token may have one) and
    its numbered message was sent, so the session's next message is answered, not held back behind it."""
    import socket

    quick = create_token(processes, "quick")
    body = json.dumps({"text": "SLEEP 1"}).encode()
    for attempt in range(2):  # 3 messages each: the token's burst is 6
        with socket.create_connection(("127.0.0.1", int(secured["PINCER_GATEWAY_PORT"])), timeout=30) as raw:
            raw.sendall(b"POST /v1/sessions/left/messages?stream=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"Authorization: Bearer " + quick.encode() + b"\r\nContent-Type: application/json\r\n"
                        b"Accept: text/event-stream\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            head = b""
            while b"\r\n\r\n" not in head:
                head += raw.recv(1)
            assert head.startswith(b"HTTP/1.1 200"), head
        with gateway_client(secured, quick, timeout=60) as client:
            # the place the stream held is given back: a token allowed one open turn may start another
            after = wait_until(lambda c=client, n=attempt: (r := c.post(f"/v1/sessions/next-{n}/messages",
                                                                        json={"text": "hi"})).status_code != 429
                               and r, timeout=30, what="the open-turn place given back")
            assert after.status_code == 200, after.text
            # the left turn's message was sent: the session's next one is answered, not held back behind it
            same = client.post("/v1/sessions/left/messages", json={"text": f"and then {attempt}"})
            assert same.status_code == 200 and same.json()["text"] == f"echo: and then {attempt}", same.text


def test_notes_belong_to_their_writer_through_every_door(secured: dict[str, str], processes: Processes) -> None:
    """A chat token's notes are its own over HTTP, the OpenAI endpoint and a sub-agent; an owner writes shared
    notes everyone reads; a chat token cannot."""
    bob = gateway_client(secured, create_token(processes, "bob"))
    carol = gateway_client(secured, create_token(processes, "carol"))

    def native(client: httpx.Client, session: str, text: str) -> str:
        answer = client.post(f"/v1/sessions/{session}/messages", json={"text": text}, timeout=60)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["text"])

    def openai(client: httpx.Client, text: str) -> str:
        answer = client.post("/v1/chat/completions", timeout=60,
                             json={"model": "pincer", "messages": [{"role": "user", "content": text}]})
        assert answer.status_code == 200, answer.text
        return str(answer.json()["choices"][0]["message"]["content"])

    write = 'CALL memory_write {"key": "gift", "content": "Bob wants a red scarf"}'
    assert '"scope": "own"' in native(bob, "notes", write)
    search = 'CALL memory_search {"query": "scarf"}'
    assert '"hits": []' in openai(carol, search)  # not Carol's, over another door
    via_sub_agent = native(carol, "notes", "CALL delegate " + json.dumps({"task": search}))
    assert "RESULT memory_search" in via_sub_agent and "Bob wants" not in via_sub_agent  # nor through a sub-agent
    assert "Bob wants a red scarf" in openai(bob, search)
    shared = 'CALL memory_write {"key": "house", "content": "dinner at seven", "shared": true}'
    assert "PERMISSION_DENIED" in native(bob, "notes", shared)
    owner = gateway_client(secured)
    assert "PERMISSION_DENIED" in native(owner, "notes", shared)  # owner's token: not in this stack's owners
    alice = gateway_client(secured, create_token(processes, "alice", "--scope", "operator"))
    assert '"scope": "shared"' in native(alice, "notes", shared)
    assert "dinner at seven" in openai(carol, 'CALL memory_read {"key": "house"}')
    # What Bob said in an earlier session is found from a later one (and from no one else's).
    native(bob, "monday", "my gym locker is number 4312")
    found = json.loads(native(bob, "friday", 'CALL memory_search {"query": "gym locker"}').partition(": ")[2])
    assert found["hits"][0]["source"] == "conversation" and found["hits"][0]["session"] == "monday"
    assert "4312" in found["hits"][0]["excerpt"]
    assert "4312" not in native(carol, "friday", 'CALL memory_search {"query": "gym locker"}')
