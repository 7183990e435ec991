"""A Discord server on loopback, for the Discord channel's tests: the REST API's HTTP shape and the gateway's
WebSocket protocol as Discord documents them (https://discord.com/developers/docs/events/gateway), no internet.

REST at ``/api/v10/...`` with ``Authorization: Bot <token>``: the bot user, ``/gateway/bot`` (the gateway's
URL), messages sent, edited and read back (newest first, ``after`` and ``limit``), typing, interaction
callbacks and follow-ups, attachments. The gateway: HELLO, IDENTIFY -> READY (+ GUILD_CREATE), heartbeats
ACKed, RESUME replaying what the session missed (then RESUMED), INVALID_SESSION for one that is gone,
RECONNECT on demand; every dispatch numbered per session, and a session left unconnected past
``resume_window_s`` gone for good. Like Discord, nothing is replayed to a new
session: what was said while no session was alive is only in the channels' history.

The test side plays the people: ``say`` (a DM, or a server channel or thread) and ``press`` dispatch
events, ``in_channel`` reads what the bot sent (edits applied), ``cut`` drops the connections.
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
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from bus.redis_server import free_port
from tests.loopback import ThreadedServer, request_params

TOKEN = "MTAxMDEwMTAxMDEw.fake.discord-bot-token"
EPOCH_MS = 1_420_070_400_000
BOT_ID, APP_ID, GUILD, GENERAL, THREAD = "1000000000000000001", "1000000000000000002", "1000000000000000100", \
    "1000000000000000101", "1000000000000000102"
BOT = {"id": BOT_ID, "username": "pincer", "discriminator": "0", "global_name": "Pincer", "avatar": None,
       "bot": True}


@dataclass
class Sent:
    id: str
    channel: str
    content: str
    components: list[dict[str, Any]] = field(default_factory=list)
    files: list[tuple[str, bytes]] = field(default_factory=list)
    edits: int = 0

    @property
    def buttons(self) -> list[dict[str, Any]]:
        return [c for row in self.components for c in row.get("components", [])]


@dataclass
class Session:
    id: str
    log: list[dict[str, Any]] = field(default_factory=list)  # every dispatch, numbered from 1
    socket: WebSocket | None = None
    acked: int = 0  # the last sequence the client confirmed by heartbeat or resume
    away_since: float = 0.0  # monotonic: when its last connection ended (0: connected)


class FakeDiscord:
    def __init__(self) -> None:
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api/v10"
        self.sent: list[Sent] = []
        self.followups: list[dict[str, Any]] = []  # ephemeral answers to presses
        self.callbacks: list[tuple[str, int]] = []  # (interaction id, response type)
        self.identifies = 0
        self.resumes = 0
        self.resumes_refused = 0
        self.resume_window_s = 300.0  # a session left unconnected longer cannot be resumed (INVALID_SESSION)
        self.refuse_until = 0.0
        self.heartbeat_ms = 5000  # the interval HELLO asks clients to heartbeat at (Discord's own is 41250)
        self.history: dict[str, list[dict[str, Any]]] = {}  # channel -> messages, oldest first
        self.hosted: dict[str, bytes] = {}
        self.sessions: dict[str, Session] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server = ThreadedServer(self._app(), self.port, "the fake Discord server", lifespan="on",
                                      ws_ping_interval=None)

    def start(self) -> FakeDiscord:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    # --- the people's side ---

    def snowflake(self) -> str:
        return str(((int(time.time() * 1000) - EPOCH_MS) << 22) | (next(self._ids) & 0x3FFFFF))

    @staticmethod
    def dm(user: str) -> str:
        return str(int(user) + 7)

    def say(self, user: str, text: str, *, channel: str = "", mention: bool = False,
            file: tuple[str, bytes] | None = None, username: str = "", display_name: str | None = None) -> str:
        """A message by ``user`` (named ``username``, shown as ``display_name``): in their DM with the bot unless
        ``channel`` (GENERAL, THREAD) is given."""
        where = channel or self.dm(user)
        message = self._message(where, {"id": user, "username": username or f"user{user[-4:]}", "discriminator": "0",
                                        "global_name": display_name, "avatar": None},
                                (f"<@{BOT_ID}> " if mention else "") + text, guild=bool(channel))
        if mention:
            message["mentions"] = [BOT]
        if file is not None:
            file_id = self.snowflake()
            self.hosted[file_id] = file[1]
            url = f"http://127.0.0.1:{self.port}/attachments/{file_id}/{quote(file[0], safe='')}"
            message["attachments"] = [{"id": file_id, "filename": file[0], "size": len(file[1]), "url": url,
                                       "proxy_url": url, "content_type": "text/plain"}]
        self._record(message)
        self._dispatch("MESSAGE_CREATE", message)
        return str(message["id"])

    def press(self, user: str, sent: Sent, custom_id: str) -> str:
        interaction = {"id": self.snowflake(), "application_id": APP_ID, "type": 3,
                       "token": f"itoken-{next(self._ids)}", "version": 1, "attachment_size_limit": 10 << 20,
                       "channel_id": sent.channel, "channel": {"id": sent.channel, "type": 1}, "locale": "en-US",
                       "app_permissions": "0",
                       "entitlements": [], "authorizing_integration_owners": {}, "context": 1,
                       "user": {"id": user, "username": f"user{user[-4:]}", "discriminator": "0", "avatar": None,
                                "global_name": None},
                       "data": {"custom_id": custom_id, "component_type": 2},
                       "message": {**self._message(sent.channel, BOT, sent.content, guild=False, message_id=sent.id),
                                   "components": sent.components}}
        self._dispatch("INTERACTION_CREATE", interaction)
        return str(interaction["id"])

    def in_channel(self, channel: str) -> list[Sent]:
        with self._lock:
            return [s for s in self.sent if s.channel == channel]

    def cut(self, seconds: float) -> None:
        """Every gateway connection dropped (close code 4000), and new ones refused for ``seconds``."""
        self.refuse_until = time.monotonic() + seconds
        self._soon(self._close_all(4000))

    def reconnect(self) -> None:
        """Discord's RECONNECT: the client is to resume on a new connection."""
        self._soon(self._send_all({"op": 7, "d": None}))

    # --- the server ---

    def _message(self, channel: str, author: dict[str, Any], content: str, *, guild: bool,
                 message_id: str = "") -> dict[str, Any]:
        message: dict[str, Any] = {"id": message_id or self.snowflake(), "channel_id": channel, "author": author,
                                   "content": content, "timestamp": "2026-12-01T00:00:00+00:00",
                                   "edited_timestamp": None, "tts": False, "mention_everyone": False,
                                   "mentions": [], "mention_roles": [], "attachments": [], "embeds": [],
                                   "pinned": False, "type": 0, "components": [], "flags": 0}
        if guild:
            message["guild_id"] = GUILD
            message["member"] = {"roles": [], "joined_at": "2026-01-01T00:00:00+00:00", "deaf": False, "mute": False,
                                 "flags": 0}
        return message

    def _record(self, message: dict[str, Any]) -> None:
        with self._lock:
            self.history.setdefault(str(message["channel_id"]), []).append(message)

    def _dispatch(self, kind: str, data: dict[str, Any]) -> None:
        """To every live session (numbered in its log: a session that is away gets it on RESUME)."""
        with self._lock:
            sessions = list(self.sessions.values())
            for session in sessions:
                session.log.append({"op": 0, "t": kind, "s": len(session.log) + 1, "d": data})
        for session in sessions:
            self._soon(self._flush(session))

    def _soon(self, work: Any) -> None:
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(work, self._loop)

    async def _flush(self, session: Session) -> None:
        socket = session.socket
        if socket is None:
            return
        with self._lock:
            pending = [e for e in session.log if e["s"] > getattr(socket, "pincer_sent", 0)]
        for event in pending:
            with contextlib.suppress(Exception):
                await socket.send_text(json.dumps(event))
                socket.pincer_sent = event["s"]  # type: ignore[attr-defined]

    async def _send_all(self, message: dict[str, Any]) -> None:
        for session in list(self.sessions.values()):
            if session.socket is not None:
                with contextlib.suppress(Exception):
                    await session.socket.send_text(json.dumps(message))

    async def _close_all(self, code: int) -> None:
        for session in list(self.sessions.values()):
            socket, session.socket = session.socket, None
            if socket is not None:
                with contextlib.suppress(Exception):
                    await socket.close(code=code)

    def _app(self) -> Starlette:
        return Starlette(routes=[
            Route("/api/v10/users/@me", self._me, methods=["GET"]),
            Route("/api/v10/gateway/bot", self._gateway, methods=["GET"]),
            Route("/api/v10/oauth2/applications/@me", self._application, methods=["GET"]),
            Route("/api/v10/channels/{channel}/messages", self._messages, methods=["GET", "POST"]),
            Route("/api/v10/channels/{channel}/messages/{message}", self._edit, methods=["PATCH"]),
            Route("/api/v10/channels/{channel}/typing", self._typing, methods=["POST"]),
            Route("/api/v10/interactions/{interaction}/{token}/callback", self._callback, methods=["POST"]),
            Route("/api/v10/webhooks/{application}/{token}", self._followup, methods=["POST"]),
            Route("/attachments/{file_id}/{name:path}", self._attachment, methods=["GET"]),
            WebSocketRoute("/gateway", self._socket)], lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, _: Starlette) -> AsyncIterator[None]:
        self._loop = asyncio.get_running_loop()
        yield

    @staticmethod
    def _authorised(request: Request) -> bool:
        return request.headers.get("authorization") == f"Bot {TOKEN}"

    async def _me(self, request: Request) -> Response:
        if not self._authorised(request):
            return JSONResponse({"message": "401: Unauthorized", "code": 0}, status_code=401)
        return JSONResponse({**BOT, "verified": True, "mfa_enabled": False, "flags": 0})

    async def _application(self, request: Request) -> Response:
        if not self._authorised(request):
            return JSONResponse({"message": "401: Unauthorized", "code": 0}, status_code=401)
        return JSONResponse({"id": APP_ID, "name": "Pincer", "icon": None, "description": "", "bot_public": True,
                             "bot_require_code_grant": False, "verify_key": "0" * 64, "flags": 0, "team": None,
                             "owner": {**BOT, "bot": False}, "bot": BOT})

    async def _gateway(self, request: Request) -> Response:
        if not self._authorised(request):
            return JSONResponse({"message": "401: Unauthorized", "code": 0}, status_code=401)
        return JSONResponse({"url": f"ws://127.0.0.1:{self.port}/gateway", "shards": 1,
                             "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 0,
                                                     "max_concurrency": 1}})

    async def _messages(self, request: Request) -> Response:
        if not self._authorised(request):
            return JSONResponse({"message": "401: Unauthorized", "code": 0}, status_code=401)
        channel = request.path_params["channel"]
        if request.method == "GET":
            after = int(request.query_params.get("after", "0"))
            limit = int(request.query_params.get("limit", "50"))
            with self._lock:
                found = [m for m in self.history.get(channel, []) if int(m["id"]) > after][:limit]
            return JSONResponse(list(reversed(found)))  # newest first, as Discord answers
        params = await request_params(request)
        payload = json.loads(params["payload_json"]) if "payload_json" in params else params
        files = [v for k, v in params.items() if k.startswith("files[") and isinstance(v, tuple)]
        content = str(payload.get("content") or "")
        if len(content) > 2000:
            return JSONResponse({"message": "Invalid Form Body", "code": 50035}, status_code=400)
        message = self._message(channel, BOT, content, guild=channel in (GENERAL, THREAD))
        message["components"] = payload.get("components") or []
        sent = Sent(id=message["id"], channel=channel, content=content, components=message["components"],
                    files=[(str(name), bytes(data)) for name, data in files])
        with self._lock:
            self.sent.append(sent)
        self._record(message)
        return JSONResponse(message)

    async def _edit(self, request: Request) -> Response:
        if not self._authorised(request):
            return JSONResponse({"message": "401: Unauthorized", "code": 0}, status_code=401)
        params = await request_params(request)
        payload = json.loads(params["payload_json"]) if "payload_json" in params else params
        with self._lock:
            found = next((s for s in self.sent if s.id == request.path_params["message"]), None)
            if found is None:
                return JSONResponse({"message": "Unknown Message", "code": 10008}, status_code=404)
            if "content" in payload:
                found.content = str(payload["content"] or "")
            if "components" in payload:
                found.components = payload["components"] or []
            found.edits += 1
        message = self._message(found.channel, BOT, found.content, guild=False, message_id=found.id)
        return JSONResponse({**message, "components": found.components})

    async def _typing(self, request: Request) -> Response:
        return Response(status_code=204)

    async def _callback(self, request: Request) -> Response:
        body = await request_params(request)
        payload = json.loads(body["payload_json"]) if "payload_json" in body else body
        kind = int(payload.get("type", 0))
        with self._lock:
            self.callbacks.append((request.path_params["interaction"], kind))
        if request.query_params.get("with_response") not in ("1", "true"):
            return Response(status_code=204)
        return JSONResponse({"interaction": {"id": request.path_params["interaction"], "type": 3,
                                             "activity_instance_id": None, "response_message_id": None,
                                             "response_message_loading": False,
                                             "response_message_ephemeral": False},
                             "resource": {"type": kind}})

    async def _followup(self, request: Request) -> Response:
        payload = await request_params(request)
        with self._lock:
            self.followups.append(payload)
        return JSONResponse(self._message("0", BOT, str(payload.get("content", "")), guild=False))

    async def _attachment(self, request: Request) -> Response:
        found = self.hosted.get(request.path_params["file_id"])
        return Response(found, media_type="text/plain") if found is not None else Response(status_code=404)

    async def _socket(self, socket: WebSocket) -> None:
        if time.monotonic() < self.refuse_until:
            await socket.close(code=1011)
            return
        await socket.accept()
        await socket.send_text(json.dumps({"op": 10, "d": {"heartbeat_interval": self.heartbeat_ms}}))
        session: Session | None = None
        try:
            while True:
                said = json.loads(await socket.receive_text())
                op, data = said.get("op"), said.get("d")
                if op == 1:
                    await socket.send_text(json.dumps({"op": 11}))
                elif op == 2:
                    if (data or {}).get("token") != TOKEN:
                        await socket.close(code=4004)
                        return
                    session = await self._identify(socket)
                elif op == 6:
                    session = await self._resume(socket, data or {})
                    if session is None:
                        continue
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            if session is not None and session.socket is socket:
                session.socket, session.away_since = None, time.monotonic()

    async def _identify(self, socket: WebSocket) -> Session:
        self.identifies += 1
        session = Session(id=f"session-{next(self._ids)}")
        with self._lock:
            self.sessions[session.id] = session
            session.log.append({"op": 0, "t": "READY", "s": 1, "d": {
                "v": 10, "user": {**BOT, "verified": True, "mfa_enabled": False, "flags": 0},
                "guilds": [{"id": GUILD, "unavailable": True}], "session_id": session.id,
                "resume_gateway_url": f"ws://127.0.0.1:{self.port}/gateway", "shard": [0, 1],
                "application": {"id": APP_ID, "flags": 0}, "private_channels": [], "relationships": []}})
            session.log.append({"op": 0, "t": "GUILD_CREATE", "s": 2, "d": _guild()})
        session.socket = socket
        socket.pincer_sent = 0  # type: ignore[attr-defined]
        await self._flush(session)
        return session

    async def _resume(self, socket: WebSocket, data: dict[str, Any]) -> Session | None:
        session = self.sessions.get(str(data.get("session_id")))
        if session is not None and session.away_since and \
                time.monotonic() - session.away_since > self.resume_window_s:
            self.sessions.pop(session.id, None)  # past its resume window: gone
            session = None
        if session is None or data.get("token") != TOKEN:
            self.resumes_refused += 1
            await socket.send_text(json.dumps({"op": 9, "d": False}))
            return None
        self.resumes += 1
        session.socket, session.away_since = socket, 0.0
        socket.pincer_sent = int(data.get("seq") or 0)  # type: ignore[attr-defined]
        await self._flush(session)
        with self._lock:
            session.log.append({"op": 0, "t": "RESUMED", "s": len(session.log) + 1, "d": {}})
        await self._flush(session)
        return session


def _guild() -> dict[str, Any]:
    return {"id": GUILD, "name": "Test", "icon": None, "owner_id": "1000000000000000999", "afk_channel_id": None,
            "afk_timeout": 300, "verification_level": 0, "default_message_notifications": 0,
            "explicit_content_filter": 0, "emojis": [], "features": [], "mfa_level": 0, "system_channel_id": None,
            "system_channel_flags": 0, "rules_channel_id": None, "vanity_url_code": None, "description": None,
            "banner": None, "premium_tier": 0, "preferred_locale": "en-US", "public_updates_channel_id": None,
            "nsfw_level": 0, "stickers": [], "premium_progress_bar_enabled": False,
            "joined_at": "2026-01-01T00:00:00+00:00", "large": False, "member_count": 3, "members": [],
            "roles": [{"id": GUILD, "name": "@everyone", "permissions": "1071698660929", "position": 0, "color": 0,
                       "hoist": False, "managed": False, "mentionable": False, "flags": 0}],
            "channels": [{"id": GENERAL, "type": 0, "name": "general", "position": 0, "permission_overwrites": [],
                          "parent_id": None, "nsfw": False, "topic": None, "rate_limit_per_user": 0,
                          "last_message_id": None, "flags": 0}],
            "threads": [{"id": THREAD, "type": 11, "guild_id": GUILD, "parent_id": GENERAL, "name": "a thread",
                         "owner_id": "1000000000000000999", "rate_limit_per_user": 0, "message_count": 0,
                         "member_count": 2, "flags": 0, "last_message_id": None,
                         "thread_metadata": {"archived": False, "auto_archive_duration": 1440, "locked": False,
                                             "archive_timestamp": "2026-12-01T00:00:00+00:00"}}],
            "voice_states": [], "presences": [], "stage_instances": [], "guild_scheduled_events": [],
            "unavailable": False}
