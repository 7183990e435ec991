"""A Slack server on loopback, for the Slack channel's tests: the Web API's HTTP shape and Socket Mode's
WebSocket envelopes, as Slack documents them (https://api.slack.com/apis/socket-mode), no internet.

Web API methods at ``/api/<method>`` take query, form or JSON parameters and a ``Bearer`` token, and
answer ``{"ok": true, ...}`` or ``{"ok": false, "error": ...}`` (a 429 with ``Retry-After`` when rate
limited). ``apps.connections.open`` (with the app-level token) gives a ``ws://`` URL; a connection
is greeted with ``hello``, and envelopes (``events_api``, ``interactive``) are spread over the open
connections. An envelope not acknowledged (``{"envelope_id": ...}``) within ``redeliver_s`` is sent
again with ``retry_attempt`` raised, as Slack retries; ``disconnect`` asks clients to reconnect, and
``cut`` drops every connection as a network outage would. What is said and posted is kept as each
channel's history (``conversations.history``, ``conversations.replies``: newest or oldest first, after
``oldest``, in pages by ``cursor``).

The test side plays the people: ``say`` and ``press`` queue envelopes, ``posted`` reads what the bot
wrote (edits applied), ``fail`` makes the next calls of a method answer an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import httpx
from slack_sdk.signature import SignatureVerifier
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from bus.redis_server import free_port
from tests.loopback import ThreadedServer, request_params

BOT_TOKEN = "xoxb-1-test-bot-token"
APP_TOKEN = "xapp-1-test-app-token"
BOT_USER, BOT_ID, TEAM = "UBOT0001", "BBOT0001", "T0TEST01"


@dataclass
class Posted:
    channel: str
    ts: str
    thread_ts: str
    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)
    edits: int = 0

    @property
    def buttons(self) -> list[dict[str, Any]]:
        return [e for b in self.blocks if b.get("type") == "actions" for e in b.get("elements", [])]


class FakeSlack:
    def __init__(self, *, redeliver_s: float = 3.0) -> None:
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api/"
        self.redeliver_s = redeliver_s
        self.posted: list[Posted] = []
        self.history: dict[str, list[dict[str, Any]]] = {}  # by channel, in the order said
        self.ephemeral: list[dict[str, Any]] = []
        self.uploads: list[tuple[str, str, str, bytes]] = []  # channel, thread, name, content
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.acked: list[str] = []
        self.deliveries: list[tuple[str, int]] = []  # (envelope id, retry attempt) of each one sent
        self.connections_opened = 0
        self.socket_port = 0  # set: connections are given this port (a relay in front, tests/netcut.py)
        self.push_url = ""  # set: envelopes are posted there, signed (the Events API), not sent over sockets
        self.signing_secret = ""
        self.pushes: list[tuple[str, int, int]] = []  # (envelope id, retry number, HTTP status) of each post
        self.refuse_connections_until = 0.0
        self.failing: dict[str, list[tuple[int, str, float]]] = {}
        self._hosted: dict[str, tuple[str, bytes]] = {}
        self._staged: dict[str, bytes] = {}
        self._envelopes: dict[str, dict[str, Any]] = {}  # not yet acknowledged, by envelope id
        self._all: dict[str, dict[str, Any]] = {}
        self._due: dict[str, float] = {}  # when each unacknowledged envelope is (re)sent
        self._sockets: list[WebSocket] = []
        self._ids = itertools.count(1)
        self._ts = itertools.count(1)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        # No server pings: the SDK pings itself, and reads a ping's binary payload as text.
        self._server = ThreadedServer(self._app(), self.port, "the fake Slack server", lifespan="on",
                                      ws_ping_interval=None)

    # --- lifecycle ---

    def start(self) -> FakeSlack:
        self._server.start()  # the lifespan has run: the deliverer is up
        return self

    def stop(self) -> None:
        self._server.stop()

    # --- the people's side ---

    def say(self, user: str, text: str, *, channel: str = "", thread_ts: str = "",
            file: tuple[str, bytes] | None = None) -> str:
        """A message by ``user`` (in their DM with the bot unless ``channel`` is given): its ts."""
        channel = channel or f"D{user}"
        ts = self._next_ts()
        event: dict[str, Any] = {"type": "message", "channel": channel, "user": user, "text": text, "ts": ts,
                                 "channel_type": "im" if channel.startswith("D") else "channel",
                                 "event_ts": ts, "team": TEAM}
        if thread_ts:
            event["thread_ts"] = thread_ts
        self._keep(channel, {k: v for k, v in event.items() if k not in ("channel", "channel_type", "event_ts",
                                                                          "team")})
        if file is not None:
            file_id = f"F{next(self._ids):08d}"
            self._hosted[file_id] = file
            event["subtype"] = "file_share"
            url = f"http://127.0.0.1:{self.port}/files/{file_id}/{quote(file[0], safe='')}"
            event["files"] = [{"id": file_id, "name": file[0], "size": len(file[1]), "mimetype": "text/plain",
                               "url_private_download": url}]
        event_id = f"Ev{next(self._ids):08d}"
        self._queue({"type": "events_api", "accepts_response_payload": False,
                     "payload": {"token": "legacy", "team_id": TEAM, "api_app_id": "A0TEST", "event": event,
                                 "type": "event_callback", "event_id": event_id, "event_time": int(time.time())}})
        return ts

    def press(self, user: str, posted: Posted, value: str) -> None:
        action = next(b for b in posted.buttons if b["value"] == value)
        message: dict[str, Any] = {"ts": posted.ts, "text": posted.text}
        if posted.thread_ts:
            message["thread_ts"] = posted.thread_ts
        self._queue({"type": "interactive", "accepts_response_payload": False, "payload": {
            "type": "block_actions", "user": {"id": user, "username": user.lower(), "team_id": TEAM},
            "api_app_id": "A0TEST", "trigger_id": f"{next(self._ids)}.{TEAM}.trigger",
            "container": {"type": "message", "message_ts": posted.ts, "channel_id": posted.channel},
            "channel": {"id": posted.channel}, "message": message,
            "actions": [{"type": "button", "action_id": action["action_id"], "value": value,
                         "block_id": "b1", "action_ts": str(time.time())}]}})

    def _keep(self, channel: str, message: dict[str, Any]) -> None:
        with self._lock:
            said = self.history.setdefault(channel, [])
            thread = message.get("thread_ts")
            for parent in said if thread else []:  # a thread's first message is marked so, as Slack does
                if parent["ts"] == thread:
                    parent["thread_ts"] = thread
                    parent["reply_count"] = int(parent.get("reply_count", 0)) + 1
            said.append(message)

    def in_channel(self, channel: str) -> list[Posted]:
        with self._lock:
            return [p for p in self.posted if p.channel == channel]

    def fail(self, method: str, *, times: int = 1, error: str = "internal_error", status: int = 200,
             retry_after: float = 0) -> None:
        with self._lock:
            self.failing.setdefault(method, []).extend([(status, error, retry_after)] * times)

    def disconnect(self) -> None:
        """Slack's "refresh_requested": every client should open a new connection."""
        self._soon(self._broadcast({"type": "disconnect", "reason": "refresh_requested"}))

    def cut(self, seconds: float) -> None:
        """Every connection dropped, and new ones refused for ``seconds`` (a network outage)."""
        self.refuse_connections_until = time.monotonic() + seconds
        self._soon(self._drop_all())

    def push_to(self, url: str, signing_secret: str) -> None:
        """The Events API: each envelope's payload posted to ``url``, signed, until it is answered 200."""
        self.push_url, self.signing_secret = url, signing_secret

    @staticmethod
    def signed(body: bytes, secret: str, timestamp: str = "") -> dict[str, str]:
        """The headers Slack signs a request with (by slack_sdk's own signer)."""
        timestamp = timestamp or str(int(time.time()))
        signature = SignatureVerifier(secret).generate_signature(timestamp=timestamp, body=body) or ""
        return {"X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": signature}

    def unacked(self) -> int:
        with self._lock:
            return len(self._envelopes)

    # --- the server ---

    def _next_ts(self) -> str:
        return f"{int(time.time())}.{next(self._ts):06d}"

    def sent_envelope(self, envelope_id: str) -> dict[str, Any] | None:
        return self._all.get(envelope_id)

    def _queue(self, envelope: dict[str, Any]) -> None:
        envelope["envelope_id"] = f"env-{next(self._ids)}"
        self._all[envelope["envelope_id"]] = envelope
        with self._lock:
            self._envelopes[envelope["envelope_id"]] = envelope
            self._due[envelope["envelope_id"]] = 0.0
        self._soon(None)

    def _soon(self, work: Any) -> None:
        assert self._loop is not None and self._wake is not None
        wake = self._wake
        if work is not None:
            asyncio.run_coroutine_threadsafe(work, self._loop)
        self._loop.call_soon_threadsafe(wake.set)

    def _app(self) -> Starlette:
        app = Starlette(routes=[Route("/api/{method}", self._method, methods=["GET", "POST"]),
                                Route("/files/{file_id}/{name:path}", self._download, methods=["GET"]),
                                Route("/upload/{file_id}", self._upload, methods=["POST"]),
                                WebSocketRoute("/socket", self._socket)],
                        lifespan=self._lifespan)
        return app

    @contextlib.asynccontextmanager
    async def _lifespan(self, _: Starlette) -> AsyncIterator[None]:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        deliverer = asyncio.get_running_loop().create_task(self._deliver())
        yield
        deliverer.cancel()

    async def _deliver(self) -> None:
        """Each due envelope to the next open connection; unacknowledged ones again after redeliver_s."""
        turn = itertools.count()
        assert self._wake is not None
        while True:
            now = time.monotonic()
            with self._lock:
                due = [e for eid, e in self._envelopes.items() if self._due[eid] <= now]
                sockets = list(self._sockets)
            if self.push_url:
                for envelope in due:
                    await self._post(envelope, now)
                due = []
            for envelope in due if sockets else []:
                eid = envelope["envelope_id"]
                attempt = sum(1 for d, _ in self.deliveries if d == eid)
                if attempt > 3:  # Slack gives up after three retries
                    with self._lock:
                        self._envelopes.pop(eid, None)
                    continue
                sent = {**envelope, **({"retry_attempt": attempt, "retry_reason": "timeout"} if attempt else {})}
                socket = sockets[next(turn) % len(sockets)]
                try:
                    await socket.send_text(json.dumps(sent))
                    self.deliveries.append((eid, attempt))
                except Exception:  # a socket closing under us: sent again to another
                    continue
                with self._lock:
                    if eid in self._due:
                        self._due[eid] = now + self.redeliver_s
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.25)

    async def _post(self, envelope: dict[str, Any], now: float) -> None:
        eid = envelope["envelope_id"]
        attempt = sum(1 for d, _, _ in self.pushes if d == eid)
        if envelope["type"] == "interactive":
            body = urlencode({"payload": json.dumps(envelope["payload"])}).encode()
            kind = "application/x-www-form-urlencoded"
        else:
            body, kind = json.dumps(envelope["payload"]).encode(), "application/json"
        headers = {"Content-Type": kind, **self.signed(body, self.signing_secret)}
        if attempt:
            headers.update({"X-Slack-Retry-Num": str(attempt), "X-Slack-Retry-Reason": "http_error"})
        try:
            async with httpx.AsyncClient(timeout=3) as http:  # Slack waits 3 s for an answer
                status = (await http.post(self.push_url, content=body, headers=headers)).status_code
        except httpx.HTTPError:
            status = 0
        self.pushes.append((eid, attempt, status))
        with self._lock:
            if status == 200 or attempt >= 3:
                self._envelopes.pop(eid, None)
                self._due.pop(eid, None)
            elif eid in self._due:
                self._due[eid] = now + self.redeliver_s

    async def _socket(self, socket: WebSocket) -> None:
        if time.monotonic() < self.refuse_connections_until:
            await socket.close(code=1011)
            return
        await socket.accept()
        await socket.send_text(json.dumps({"type": "hello", "num_connections": len(self._sockets) + 1,
                                           "connection_info": {"app_id": "A0TEST"},
                                           "debug_info": {"host": "fake", "approximate_connection_time": 3600}}))
        with self._lock:
            self._sockets.append(socket)
        assert self._wake is not None
        self._wake.set()
        try:
            while True:
                said = json.loads(await socket.receive_text())
                eid = said.get("envelope_id")
                if eid:
                    with self._lock:
                        self.acked.append(eid)
                        self._envelopes.pop(eid, None)
                        self._due.pop(eid, None)
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            with self._lock:
                if socket in self._sockets:
                    self._sockets.remove(socket)

    async def _broadcast(self, message: dict[str, Any]) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for socket in sockets:
            with contextlib.suppress(Exception):
                await socket.send_text(json.dumps(message))

    async def _drop_all(self) -> None:
        with self._lock:
            sockets, self._sockets = list(self._sockets), []
        for socket in sockets:
            with contextlib.suppress(Exception):
                await socket.close(code=1001)

    async def _method(self, request: Request) -> Response:
        method = request.path_params["method"]
        params = await request_params(request)
        token = request.headers.get("authorization", "").removeprefix("Bearer ").strip() or params.get("token", "")
        with self._lock:
            self.calls.append((method, params))
            failing = self.failing.get(method)
            failure = failing.pop(0) if failing else None
        if failure is not None:
            status, error, retry_after = failure
            headers = {"Retry-After": str(int(retry_after))} if retry_after else {}
            return JSONResponse({"ok": False, "error": error}, status_code=status, headers=headers)
        wanted = APP_TOKEN if method == "apps.connections.open" else BOT_TOKEN
        if token != wanted:
            return JSONResponse({"ok": False, "error": "invalid_auth"})
        handler = getattr(self, "_" + method.replace(".", "_"), None)
        if handler is None:
            return JSONResponse({"ok": False, "error": "unknown_method"})
        answer: dict[str, Any] = handler(params)
        return JSONResponse(answer)

    def _auth_test(self, _: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "url": "https://fake.slack.test/", "team": "Test", "user": "pincer", "team_id": TEAM,
                "user_id": BOT_USER, "bot_id": BOT_ID}

    def _apps_connections_open(self, _: dict[str, Any]) -> dict[str, Any]:
        if time.monotonic() < self.refuse_connections_until:
            return {"ok": False, "error": "service_unavailable"}
        self.connections_opened += 1
        return {"ok": True, "url": f"ws://127.0.0.1:{self.socket_port or self.port}/socket"
                                     f"?ticket={self.connections_opened}"}

    def _chat_postMessage(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802  # Slack's name
        text = str(params.get("text") or "")
        if not text and not params.get("blocks"):
            return {"ok": False, "error": "no_text"}
        if len(text) > 40_000:
            return {"ok": False, "error": "msg_too_long"}
        posted = Posted(channel=str(params["channel"]), ts=self._next_ts(), text=text,
                        thread_ts=str(params.get("thread_ts") or ""), blocks=_blocks(params.get("blocks")))
        with self._lock:
            self.posted.append(posted)
        message = {"type": "message", "user": BOT_USER, "bot_id": BOT_ID, "text": text, "ts": posted.ts,
                   **({"thread_ts": posted.thread_ts} if posted.thread_ts else {})}
        self._keep(posted.channel, message)
        return {"ok": True, "channel": posted.channel, "ts": posted.ts, "message": {"text": text, "ts": posted.ts}}

    def _conversations_history(self, params: dict[str, Any]) -> dict[str, Any]:
        """A channel's top level, newest first: what was said after ``oldest``, a page at a time."""
        with self._lock:
            said = list(self.history.get(str(params["channel"]), []))
        top = [m for m in said if m.get("thread_ts") in (None, m["ts"]) or m.get("subtype") == "thread_broadcast"]
        return _page(list(reversed(_after(top, params))), params)

    def _conversations_replies(self, params: dict[str, Any]) -> dict[str, Any]:
        """A thread, oldest first: its first message always, then the replies after ``oldest``."""
        thread = str(params["ts"])
        with self._lock:
            said = list(self.history.get(str(params["channel"]), []))
        parent = [m for m in said if m["ts"] == thread]
        if not parent:
            return {"ok": False, "error": "thread_not_found"}
        replies = [m for m in said if m.get("thread_ts") == thread and m["ts"] != thread]
        return _page(parent + _after(replies, params), params)

    def _chat_update(self, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            found = next((p for p in self.posted if p.channel == params["channel"] and p.ts == params["ts"]), None)
            if found is None:
                return {"ok": False, "error": "message_not_found"}
            found.text, found.blocks = str(params.get("text") or ""), _blocks(params.get("blocks"))
            found.edits += 1
        return {"ok": True, "channel": found.channel, "ts": found.ts}

    def _chat_postEphemeral(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802  # Slack's name
        with self._lock:
            self.ephemeral.append(params)
        return {"ok": True, "message_ts": self._next_ts()}

    def _files_getUploadURLExternal(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        file_id = f"F{next(self._ids):08d}"
        self._staged[file_id] = b""
        self._hosted[file_id] = (str(params.get("filename", "")), b"")
        return {"ok": True, "upload_url": f"http://127.0.0.1:{self.port}/upload/{file_id}", "file_id": file_id}

    def _files_completeUploadExternal(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        files = json.loads(params["files"]) if isinstance(params["files"], str) else params["files"]
        with self._lock:
            for item in files:
                name = self._hosted[item["id"]][0]
                self.uploads.append((str(params.get("channel_id", "")), str(params.get("thread_ts") or ""), name,
                                     self._staged.pop(item["id"], b"")))
        return {"ok": True, "files": [{"id": item["id"]} for item in files]}

    async def _upload(self, request: Request) -> Response:
        file_id = request.path_params["file_id"]
        if file_id not in self._staged:
            return Response("no such upload", status_code=404)
        self._staged[file_id] = await request.body()
        return Response("OK - uploaded")

    async def _download(self, request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {BOT_TOKEN}":
            return Response("not authorised", status_code=403)
        found = self._hosted.get(request.path_params["file_id"])
        if found is None:
            return Response("no such file", status_code=404)
        return Response(found[1], media_type="application/octet-stream")


def _after(messages: list[dict[str, Any]], params: dict[str, Any]) -> list[dict[str, Any]]:
    oldest = float(params.get("oldest") or 0)
    inclusive = str(params.get("inclusive", "")).lower() in ("1", "true")
    return [m for m in messages if float(m["ts"]) > oldest or (inclusive and float(m["ts"]) == oldest)]


def _page(messages: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    start, limit = int(params.get("cursor") or 0), min(int(params.get("limit") or 100), 999)
    page, rest = messages[start:start + limit], messages[start + limit:]
    return {"ok": True, "messages": page, "has_more": bool(rest),
            "response_metadata": {"next_cursor": str(start + limit) if rest else ""}}


def _blocks(raw: Any) -> list[dict[str, Any]]:
    if not raw:
        return []
    value = json.loads(raw) if isinstance(raw, str) else raw
    return list(value) if isinstance(value, list) else []
