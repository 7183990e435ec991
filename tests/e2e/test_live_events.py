"""A session's live events: served by any Gateway, resumed from Last-Event-ID, capped with a resync."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from httpx_sse import connect_sse

from bus.redis_server import free_port
from tests.conftest import OWNER_TOKEN, Processes, gateway_client, wait_until
from tests.e2e.conftest import start_stack

pytestmark = pytest.mark.e2e


@pytest.fixture
def two_gateways(processes: Processes, pincer_env: dict[str, str], tmp_path: Path) -> Iterator[tuple[dict, dict]]:
    (tmp_path / "workspace" / "notes.txt").write_text("the secret word is pincer-42\n")
    processes.env = {**pincer_env, "PINCER_GATEWAY__EVENTS__KEEP": "100"}
    start_stack(processes, hands=1)
    other = {**processes.env, "PINCER_GATEWAY_PORT": str(free_port())}
    processes.start("gateway", name="gateway-b", extra_env=other)
    wait_until(lambda: _healthy(other), timeout=60, what="the second Gateway")
    yield processes.env, other


def _healthy(env: dict) -> bool:
    try:
        with gateway_client(env, token=None, timeout=2) as client:
            return client.get("/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def detach(env: dict, session: str, text: str) -> dict:
    with gateway_client(env) as client:
        sent = client.post(f"/v1/sessions/{session}/messages", json={"text": text, "detach": True})
    assert sent.status_code == 202, sent.text
    return sent.json()


def events(env: dict, session: str, *, until: str, after: str | None = None, token: str = OWNER_TOKEN,
           limit: int = 200) -> list[dict]:
    """Events of ``session`` from ``after`` until one of kind ``until`` (inclusive)."""
    headers = {"Last-Event-ID": after} if after else {}
    found = []
    with gateway_client(env, token=token) as client, \
            connect_sse(client, "GET", f"/v1/sessions/{session}/events", headers=headers) as source:
        assert source.response.status_code == 200, source.response.read()
        for sse in source.iter_sse():
            found.append({"id": sse.id, "event": sse.event, **json.loads(sse.data)})
            if sse.event == until or len(found) >= limit:
                return found
    return found


def test_a_detached_turn_is_followed_from_another_gateway_and_resumed(two_gateways) -> None:
    first, second = two_gateways
    sent = detach(first, "live-1", 'CALL read_file {"path": "notes.txt"}')
    seen = events(second, "live-1", after="0", until="reply")
    kinds = [e["event"] for e in seen]
    assert kinds[0] == "message" and kinds[-1] == "reply", kinds
    assert seen[0]["text"].startswith("CALL read_file") and seen[0]["message_id"] == sent["message_id"]
    tools = {e["status"]: e for e in seen if e["event"] == "tool" and e["tool"] == "read_file"}
    assert tools["started"]["arguments"] == '{"path": "notes.txt"}'  # what the model asked, in full
    assert tools["finished"]["duration_ms"] >= 0 and "error_code" not in tools["finished"]
    assert "pincer-42" in seen[-1]["text"]
    ids = [e["id"] for e in seen]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-")))) and len(set(ids)) == len(ids)

    # A client that reconnects with the last id it saw gets exactly the rest.
    resumed = events(first, "live-1", after=ids[1], until="reply")
    assert [e["id"] for e in resumed] == ids[2:]


def test_a_dropped_client_does_not_stop_a_detached_turn(two_gateways) -> None:
    first, _ = two_gateways
    detach(first, "live-2", "SLEEP 1")
    with gateway_client(first) as client, connect_sse(client, "GET", "/v1/sessions/live-2/events",
                                                      headers={"Last-Event-ID": "0"}) as source:
        assert next(source.iter_sse()).event == "message"  # then hang up mid-turn

    def answered() -> bool:
        with gateway_client(first) as client:
            entries = client.get("/v1/sessions/live-2").json().get("entries", [])
        return any(e["role"] == "assistant" and "slept 1s" in (e.get("content") or "") for e in entries)
    wait_until(answered, timeout=30, what="the detached turn's answer in the transcript")


def test_a_client_behind_the_cap_is_told_to_resync(processes: Processes, pincer_env: dict[str, str]) -> None:
    processes.env = {**pincer_env, "PINCER_GATEWAY__EVENTS__KEEP": "12"}
    start_stack(processes, hands=1, brain=True)
    first = processes.env
    seen: list[dict] = []
    for n in range(6):  # a message, its deltas and a reply each: more than the 12 kept
        last = seen[-1]["id"] if seen else None
        detach(first, "live-3", f"turn {n}")
        seen += events(first, "live-3", after=last or "0", until="reply")
    kept = events(first, "live-3", after="0", until="(all kept)", limit=12)
    assert [e["id"] for e in kept] == [e["id"] for e in seen[-12:]]  # the newest 12, in order
    told = events(first, "live-3", after=seen[1]["id"], until="resync")  # its next events are gone
    assert [e["event"] for e in told] == ["resync"] and told[0]["after"] == seen[-1]["id"]
    fine = events(first, "live-3", after=seen[-13]["id"], until="reply")  # nothing it needs was trimmed
    assert fine[0]["id"] == seen[-12]["id"]


def test_bad_ids_and_other_peoples_sessions_are_refused(two_gateways, processes: Processes) -> None:
    first, _ = two_gateways
    detach(first, "live-4", "hello")
    with gateway_client(first) as client:
        bad = client.get("/v1/sessions/live-4/events", headers={"Last-Event-ID": "yesterday"})
    assert bad.status_code == 400 and "Last-Event-ID" in bad.json()["error"]["message"]
    made = processes.run("token", "create", "mallory")
    assert made.returncode == 0, made.stderr
    with gateway_client(first, token=made.stdout.strip()) as client:
        theirs = client.get("/v1/sessions/live-4/events", headers={"Last-Event-ID": "0"})
    assert theirs.status_code == 404


@pytest.fixture
def asking(asking_stack: dict[str, str], ws: Path) -> dict[str, str]:
    (ws / "notes.txt").write_text("over the socket\n")
    return asking_stack


def socket_url(env: dict) -> str:
    return f"ws://127.0.0.1:{env['PINCER_GATEWAY_PORT']}/v1/ws"


def frames_until(socket, kind: str, *, event: str | None = None, limit: int = 200) -> list[dict]:
    found = []
    while len(found) < limit:
        frame = json.loads(socket.recv(timeout=60))
        found.append(frame)
        if frame["type"] == kind and (event is None or frame.get("event") == event):
            return found
    raise AssertionError(f"no {kind} {event or ''} frame in {found}")


def test_a_socket_sends_follows_and_decides_an_approval(asking: dict) -> None:
    from websockets.sync.client import connect

    with connect(socket_url(asking)) as socket:
        socket.send(json.dumps({"type": "auth", "token": OWNER_TOKEN}))
        ready = json.loads(socket.recv(timeout=30))
        assert ready["type"] == "ready" and ready["name"] == "owner" and "main" in ready["agents"]
        socket.send(json.dumps({"type": "send", "session": "ws-1", "text": 'CALL exec {"command": "cat notes.txt"}'}))
        accepted = frames_until(socket, "accepted")[-1]
        socket.send(json.dumps({"type": "subscribe", "session": "ws-1", "after": "0", "ref": 7}))
        asked = frames_until(socket, "event", event="approval")
        assert any(f["type"] == "subscribed" and f["ref"] == 7 for f in asked)
        approval = asked[-1]
        assert approval["session"] == "ws-1" and "cat notes.txt" in approval["summary"]
        assert next(f["event"] for f in asked if f["type"] == "event") == "message"
        socket.send(json.dumps({"type": "decide", "approval_id": approval["approval_id"], "decision": "allow-once"}))
        rest = frames_until(socket, "event", event="reply")
        assert any(f["type"] == "decided" and f["decision"] == "allow-once" for f in rest)
        assert any(f.get("event") == "approval_decided" and f["by"] == "owner" for f in rest)
        assert "over the socket" in rest[-1]["text"] and rest[-1]["message_id"] == accepted["message_id"]

        socket.send("not json")
        assert json.loads(socket.recv(timeout=10))["code"] == "BAD_REQUEST"
        socket.send("[" * 50_000)  # deeper than the JSON parser recurses: refused as any other bad frame
        assert json.loads(socket.recv(timeout=10))["code"] == "BAD_REQUEST"
        socket.send(json.dumps({"type": "subscribe", "session": "x" * 300_000}))
        assert json.loads(socket.recv(timeout=10))["code"] == "PAYLOAD_TOO_LARGE"
        socket.send(json.dumps({"type": "subscribe", "session": "../etc"}))
        assert json.loads(socket.recv(timeout=10))["code"] == "BAD_REQUEST"


def test_a_socket_without_a_token_or_from_a_foreign_page_is_refused(asking: dict) -> None:
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect

    with connect(socket_url(asking)) as socket:
        socket.send(json.dumps({"type": "auth", "token": "pcr_wrong"}))
        refused = json.loads(socket.recv(timeout=10))
        assert refused["code"] == "UNAUTHENTICATED"
        with pytest.raises(ConnectionClosed):
            socket.recv(timeout=10)
    with connect(socket_url(asking)) as socket:  # before sign-in: nested too deep is no token, and no crash
        socket.send("[" * 50_000)
        assert json.loads(socket.recv(timeout=10))["code"] == "UNAUTHENTICATED"
    with connect(socket_url(asking), max_size=None) as socket:  # the server reads no more than 1 MiB of it
        socket.send("x" * (2 << 20))
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009  # message too big
    with pytest.raises(InvalidStatus) as foreign:
        connect(socket_url(asking), origin="https://evil.example",
                additional_headers={"Authorization": f"Bearer {OWNER_TOKEN}"})
    assert foreign.value.response.status_code == 403
