"""Revoking a token, or signing out, ends every connection opened with it, on every door and every Gateway."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import httpx
import pytest
from httpx_sse import connect_sse

from bus.redis_server import free_port
from tests.conftest import Processes, gateway_client, stack_healthy, wait_until
from tests.e2e.conftest import create_token

pytestmark = pytest.mark.e2e


def socket_url(env: dict[str, str]) -> str:
    return f"ws://127.0.0.1:{env['PINCER_GATEWAY_PORT']}/v1/ws"


class Open:
    """A connection held open in a thread, recording what it received and how it ended."""

    def __init__(self, run: Callable[[Open], None]) -> None:
        self.received: list[dict] = []
        self.ready = threading.Event()
        self.ended: str | None = None
        self.thread = threading.Thread(target=self._run, args=(run,), daemon=True)
        self.thread.start()
        assert self.ready.wait(60), f"the connection did not open: {self.received} {self.ended}"

    def _run(self, run: Callable[[Open], None]) -> None:
        try:
            run(self)
            self.ended = self.ended or "closed"
        except Exception as exc:  # what ended it is the finding
            self.ended = f"{type(exc).__name__}: {exc}"
            self.ready.set()

    def wait_ended(self) -> str:
        self.thread.join(30)  # revocation reaches it within ~2 s; the deadline only bounds a failure
        assert not self.thread.is_alive(), f"still open after revocation: {self.received}"
        assert self.ended is not None
        return self.ended


def websocket(env: dict[str, str], *, token: str | None = None, cookie: str | None = None) -> Open:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    def run(held: Open) -> None:
        headers = {"Cookie": f"pincer_session={cookie}"} if cookie else None
        with connect(socket_url(env), additional_headers=headers) as socket:
            if token:
                socket.send(json.dumps({"type": "auth", "token": token}))
            held.received.append(json.loads(socket.recv(timeout=30)))
            assert held.received[-1]["type"] == "ready", held.received
            socket.send(json.dumps({"type": "subscribe", "session": "live", "ref": "s"}))
            held.ready.set()
            try:
                while True:
                    held.received.append(json.loads(socket.recv(timeout=60)))
            except ConnectionClosed as closed:
                held.ended = f"ws {closed.rcvd.code if closed.rcvd else None}"

    return Open(run)


def sse(env: dict[str, str], token: str, method: str, path: str, body: dict | None = None) -> Open:
    def run(held: Open) -> None:
        with gateway_client(env, token) as client, connect_sse(client, method, path, json=body) as source:
            assert source.response.status_code == 200, source.response.read()
            held.ready.set()
            for event in source.iter_sse():
                if event.data and event.data != "[DONE]":
                    held.received.append({"event": event.event, **json.loads(event.data)})

    return Open(run)


def sign_in(env: dict[str, str], token: str) -> str:
    with gateway_client(env, token=None) as client:
        signed = client.post("/login", json={"token": token})
        assert signed.status_code == 200, signed.text
        return signed.cookies["pincer_session"]


def test_revoking_a_token_ends_its_sockets_and_streams_on_every_gateway(secured: dict[str, str],
                                                                       processes: Processes) -> None:
    other = {**secured, "PINCER_GATEWAY_PORT": str(free_port())}
    processes.start("gateway", name="gateway-b", extra_env=other)
    wait_until(lambda: stack_healthy(other), timeout=60, what="the second Gateway")
    alice, bob = create_token(processes, "alice"), create_token(processes, "bob")
    assert gateway_client(secured, alice).post("/v1/sessions/live/messages", json={"text": "hi"}).status_code == 200
    assert gateway_client(secured, bob).post("/v1/sessions/live/messages", json={"text": "hi"}).status_code == 200
    cookie = sign_in(secured, alice)

    alices = {
        "socket, bearer": websocket(secured, token=alice),
        "socket, bearer, other gateway": websocket(other, token=alice),
        "socket, cookie": websocket(secured, cookie=cookie),
        "events stream": sse(other, alice, "GET", "/v1/sessions/live/events"),
        "turn stream": sse(secured, alice, "POST", "/v1/sessions/slow/messages?stream=1", {"text": "SLEEP 30"}),
        "openai stream": sse(
            other,
            alice,
            "POST",
            "/v1/chat/completions",
            {"model": "pincer", "stream": True, "messages": [{"role": "user", "content": "SLEEP 30"}]},
        ),
    }
    bobs = websocket(secured, token=bob)
    assert processes.run("token", "revoke", "alice").returncode == 0

    for door, held in alices.items():
        ended = held.wait_ended()
        last = held.received[-1]
        if door.startswith("socket"):
            assert ended == "ws 1008", (door, ended)
            assert last["type"] == "error" and last["code"] == "UNAUTHENTICATED", (door, held.received)
        else:
            error = last.get("error", last)
            assert error["code"] == "UNAUTHENTICATED" and "revoked" in error["message"], (door, held.received)
    assert bobs.thread.is_alive() and bobs.ended is None  # another identity's socket stays
    with gateway_client(secured, bob) as client:  # and still works
        assert client.post("/v1/sessions/live/messages", json={"text": "still here"}).status_code == 200
    wait_until(lambda: any(f.get("event") == "reply" and "still here" in f.get("text", "") for f in bobs.received),
               timeout=30, what="bob's socket still delivering")


def test_signing_out_ends_that_browser_sessions_sockets_only(secured: dict[str, str], processes: Processes) -> None:
    alice = create_token(processes, "alice")
    assert gateway_client(secured, alice).post("/v1/sessions/live/messages", json={"text": "hi"}).status_code == 200
    leaving, staying = sign_in(secured, alice), sign_in(secured, alice)
    leaving_socket, staying_socket = websocket(secured, cookie=leaving), websocket(secured, cookie=staying)
    with httpx.Client(base_url=f"http://127.0.0.1:{secured['PINCER_GATEWAY_PORT']}",
                      cookies={"pincer_session": leaving}) as browser:
        out = browser.post("/logout")
        assert out.status_code == 200 and out.json() == {"signed_out": True}
    assert leaving_socket.wait_ended() == "ws 1008"
    assert staying_socket.thread.is_alive() and staying_socket.ended is None
