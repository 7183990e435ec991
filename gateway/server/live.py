"""``/v1/ws``: one WebSocket per client for every session it follows, with the HTTP API's rules.

Frames are JSON objects with a ``type``. The client sends ``auth`` (first,
unless a header or the sign-in cookie already named it), ``subscribe``
(``session``, optional ``after``), ``unsubscribe``, ``send`` (``session``,
``text``, optional ``agent_id``: a detached turn), ``cancel`` and ``decide``.
A session is the caller's own by its name; an operator adds ``owner`` to
reach another identity's (see ``gateway.turns.session_names``). The Gateway sends
``ready``, ``event`` (one per session event, with its id), ``resync``,
``accepted`` and ``error``. Each subscription reads the session's
log only as fast as the client takes frames (a bounded queue), so a slow
client costs the Gateway nothing more, and one that falls behind the log's
cap is told to resync.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from bus.protocol import ErrorCode
from gateway.server.connections import Credential
from gateway.server.errors import REDIS_AWAY
from gateway.tokens import Identity, digest
from gateway.turns.events import Resync, parse_after
from gateway.turns.refusal import Refused, redis_away
from gateway.turns.session_names import qualify
from memory.session_ids import owner_in

if TYPE_CHECKING:
    from gateway.server.connections import Connections
    from gateway.server.fanout import Fanout
    from gateway.tokens import TokenStore
    from gateway.turns.limits import CallerLimits
    from gateway.turns.runner import TurnRunner

log = logging.getLogger("gateway.live")

AUTH_TIMEOUT_S = 10.0
OUTBOX = 256  # frames waiting for a slow client, across its subscriptions
MAX_FRAME = 256 * 1024
# What the server reads of one WebSocket message at most (uvicorn closes past it, 1009): room for a frame
# refused with a message of its own, and no 16 MiB held for a stranger before sign-in.
MAX_SOCKET_MESSAGE = 4 * MAX_FRAME


class LiveSocket:
    def __init__(self, websocket: WebSocket, *, turns: TurnRunner, tokens: TokenStore, limits: CallerLimits,
                 connections: Connections, fanout: Fanout) -> None:
        self.ws, self.turns, self.tokens, self.limits = websocket, turns, tokens, limits
        self.connections, self.fanout = connections, fanout
        self.identity: Identity | None = websocket.scope.get("state", {}).get("identity")
        self.credential: Credential | None = websocket.scope.get("state", {}).get("credential")
        self.outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue(OUTBOX)
        self.subscriptions: dict[str, asyncio.Task[None]] = {}

    async def serve(self) -> None:
        await self.ws.accept()
        try:
            try:
                if self.identity is None and not await self._authenticate():
                    return
                identity = self.identity
                assert identity is not None
                agents = await self.turns.agents_for(identity)
            except REDIS_AWAY as exc:
                raise redis_away(exc) from None
            hold = self.limits.hold_stream(identity.name)
        except Refused as refusal:
            await self.ws.send_json({"type": "error", "code": refusal.code.value, "message": refusal.message})
            unavailable = refusal.code == ErrorCode.SERVICE_UNAVAILABLE
            await self.ws.close(1013 if unavailable else 1008)  # 1013: try again later
            return
        with self.connections.opened(self.credential) as connection:
            sender = asyncio.create_task(self._send_frames())
            reader = asyncio.create_task(self._read_frames(identity, agents))
            ended = asyncio.create_task(connection.ended.wait())
            try:
                await asyncio.wait({reader, ended}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                hold.release()
                tasks = [*self.subscriptions.values(), sender, reader, ended]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            failure = None if reader.cancelled() else reader.exception()
            if failure is not None:  # an unexpected failure: Starlette logs it and closes the socket
                raise failure
            if connection.reason is not None:  # its token revoked, its sign-in ended, or its lifetime over
                with contextlib.suppress(Exception):
                    await self.ws.send_json({"type": "error", "code": connection.code.value,
                                             "message": connection.why})
                    await self.ws.close(1008 if connection.reason == "revoked" else 1001, connection.reason)

    async def _read_frames(self, identity: Identity, agents: list[str]) -> None:
        try:
            await self.ws.send_json({"type": "ready", "name": identity.name, "agents": agents})
            while True:
                raw = await self.ws.receive_text()
                await self._handle(raw)
        except WebSocketDisconnect:
            pass

    async def _authenticate(self) -> bool:
        try:
            async with asyncio.timeout(AUTH_TIMEOUT_S):
                frame = json.loads(await self.ws.receive_text())
        except (TimeoutError, ValueError, RecursionError, WebSocketDisconnect):  # "[[[[…": RecursionError
            frame = {}
        token = frame.get("token") if isinstance(frame, dict) and frame.get("type") == "auth" else None
        self.identity = await self.tokens.identify(token) if isinstance(token, str) else None
        self.credential = Credential(token_digest=digest(token)) if self.identity and isinstance(token, str) else None
        if self.identity is None:
            with contextlib.suppress(Exception):
                await self.ws.send_json({"type": "error", "code": ErrorCode.UNAUTHENTICATED.value,
                                         "message": 'send {"type": "auth", "token": "<token>"} first, within '
                                                    f"{AUTH_TIMEOUT_S:g}s (or sign in: the cookie is enough)"})
                await self.ws.close(1008)
            return False
        return True

    async def _send_frames(self) -> None:
        while True:
            await self.ws.send_json(await self.outbox.get())

    async def _handle(self, raw: str) -> None:
        ref = None
        try:
            if len(raw) > MAX_FRAME:
                raise Refused(ErrorCode.PAYLOAD_TOO_LARGE, f"a frame may hold at most {MAX_FRAME:,} bytes")
            frame = json.loads(raw)
            if not isinstance(frame, dict):
                raise Refused(ErrorCode.BAD_REQUEST, "a frame is a JSON object with a type")
            ref = frame.get("ref")
            await self._dispatch(frame)
        except (ValueError, RecursionError):  # RecursionError: thousands of nested brackets
            await self._error(ErrorCode.BAD_REQUEST, "a frame is a JSON object with a type", ref)
        except Refused as refusal:
            await self._error(refusal.code, refusal.message, ref)
        except REDIS_AWAY as exc:  # this frame fails; the socket stays for the next one
            away = redis_away(exc)
            await self._error(away.code, away.message, ref)

    async def _dispatch(self, frame: dict[str, Any]) -> None:
        identity = self.identity
        assert identity is not None
        kind, ref = frame.get("type"), frame.get("ref")
        name = frame.get("session")
        session, where = "", {"session": name}
        if kind in ("subscribe", "unsubscribe", "send", "cancel"):
            owner = frame.get("owner")
            if not isinstance(name, str) or not (owner is None or isinstance(owner, str)):
                raise Refused(ErrorCode.BAD_REQUEST, "session: a session id (letters, digits, _ . : -); "
                              "owner (operators): an identity's name")
            session = qualify(identity, name, owner)
            if owner_in(session) != identity.name:  # frames of another's session say whose it is
                where["owner"] = owner_in(session)
        match kind:
            case "subscribe":
                await self.turns.own_session(identity, session)
                raw_after = frame.get("after")
                after = parse_after(str(raw_after)) if raw_after is not None else None
                if raw_after is not None and after is None:
                    raise Refused(ErrorCode.BAD_REQUEST, "after: the id of the last event seen, or 0")
                start = after or await self.turns.log.last_id(session)
                old = self.subscriptions.pop(session, None)
                if old is not None:
                    old.cancel()
                self.subscriptions[session] = asyncio.create_task(self._follow(session, where, start))
                await self.outbox.put({"type": "subscribed", **where, "after": start, "ref": ref})
            case "unsubscribe":
                task = self.subscriptions.pop(session, None)
                if task is not None:
                    task.cancel()
            case "send":
                accepted = await self.turns.send_detached(identity, session, frame)
                await self.outbox.put({"type": "accepted", **accepted, "ref": ref})
            case "cancel":
                await self.turns.own_session(identity, session)
                await self.turns.cancel(session, by=identity.name)
                await self.outbox.put({"type": "cancel_sent", **where, "ref": ref})
            case "decide":
                decided = await self.turns.decide_approval(identity, str(frame.get("approval_id", "")),
                                                             frame.get("decision"))
                await self.outbox.put({"type": "decided", **decided, "ref": ref})
            case "answer":
                answered = await self.turns.answer_question(identity, str(frame.get("question_id", "")),
                                                            frame.get("answers"))
                await self.outbox.put({"type": "answered", **answered, "ref": ref})
            case _:
                raise Refused(ErrorCode.BAD_REQUEST, f"unknown frame type {kind!r}: use subscribe, "
                              "unsubscribe, send, cancel, decide or answer")

    async def _follow(self, session: str, where: dict[str, Any], after: str) -> None:
        """Frames name the session as the client did (``where``: its name, and owner if not the client)."""
        async for item in self.fanout.subscribe(session, after).events():
            if isinstance(item, Resync):
                await self.outbox.put({"type": "resync", **where, "after": item.now})
            else:
                await self.outbox.put({**item.frame(), **where})  # waits while the client lags

    async def _error(self, code: ErrorCode, message: str, ref: Any) -> None:
        await self.outbox.put({"type": "error", "code": code.value, "message": message, "ref": ref})
