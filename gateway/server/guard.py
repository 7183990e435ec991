"""The checks every request passes before any handler runs: Host, Origin, body size, token.

An ASGI middleware (not Starlette's ``BaseHTTPMiddleware``, which costs a
task per request). In order: the ``Host`` header must name this Gateway (a
DNS-rebinding page names its own host), a browser's ``Origin`` must be ours
or allowed (a foreign page's ``text/plain`` POST never gets a preflight),
the body is read up to ``gateway.max_body_bytes`` and no further, and the
bearer token must name an identity, which handlers find in
``request.state.identity``. ``/healthz`` and ``/readyz`` need none of it
(nor ``/metrics`` with ``gateway.metrics_public``).
"""

from __future__ import annotations

import logging
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bus.metrics import Meter
from bus.numbers import whole_number
from bus.protocol import ErrorCode
from gateway.config import GatewaySettings
from gateway.server.connections import Credential
from gateway.server.errors import REDIS_AWAY, refusal_response
from gateway.tokens import Identity, TokenStore, WebSessions, digest
from gateway.turns.refusal import Refused, redis_away

log = logging.getLogger("gateway.guard")

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
# The page and its files, and the sign-in routes: what a browser needs before it has a session.
PAGE_PATHS = frozenset({"/", "/login", "/logout"})
PAGE_PREFIX = "/static/"
HOOK_PREFIX = "/v1/hooks/"  # signed with the hook's own secret instead (gateway/server/hooks.py)
SOCKET_PATH = "/v1/ws"  # may authenticate with its first frame (a browser cannot set headers on a WebSocket)
COOKIE = "pincer_session"
# A browser sends the cookie with what other pages of the same site ask too (another port on localhost, where
# SameSite does not tell them apart); it says where each request comes from (Fetch Metadata), and the cookie
# counts only from the Gateway's own pages, or a person's own navigation. Clients that send no such header
# (not a browser) are unaffected.
COOKIE_SITES = frozenset({"same-origin", "none"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class Guard:
    def __init__(self, app: ASGIApp, *, settings: GatewaySettings, tokens: TokenStore, meter: Meter,
                 web: WebSessions | None = None) -> None:
        self.app, self.tokens, self.meter, self.web = app, tokens, meter, web
        self.open_paths = OPEN_PATHS | ({"/metrics"} if settings.metrics_public else set())
        self.max_body = settings.max_body_bytes
        self.hosts = [h.lower() for h in settings.hosts()]
        self.origins = {o.rstrip("/").lower() for o in settings.allowed_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        try:
            headers = _headers(scope)
            host = self._check_host(headers)
            self._check_origin(headers, host)
            if scope["type"] == "http" and scope["method"] in BODY_METHODS:
                receive = await self._read_body(headers, receive)
            path = scope["path"]
            optional = path in PAGE_PATHS or path.startswith((PAGE_PREFIX, HOOK_PREFIX)) or \
                (scope["type"] == "websocket" and path == SOCKET_PATH)
            try:
                state = scope.setdefault("state", {})
                state["identity"], state["credential"] = await self._identify(headers, optional=optional)
            except REDIS_AWAY as exc:
                raise redis_away(exc) from None
        except Refused as refusal:
            self.meter.count("pincer_gateway_refusals", refusal.code.value)
            if scope["type"] == "websocket":
                code = 1013 if refusal.code == ErrorCode.SERVICE_UNAVAILABLE else 1008  # 1013: try again later
                await send({"type": "websocket.close", "code": code, "reason": refusal.message[:120]})
                return
            await refusal_response(refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check_host(self, headers: dict[str, str]) -> str:
        raw = headers.get("host", "")
        host = _host_name(raw)
        if not host or not any(fnmatchcase(host, allowed) for allowed in self.hosts):
            raise Refused(ErrorCode.FORBIDDEN, f"this Gateway does not answer for host {raw!r}; "
                          "an operator can add it to gateway.allowed_hosts")
        return raw.lower()

    def _check_origin(self, headers: dict[str, str], host: str) -> None:
        origin = headers.get("origin")
        if origin is None:
            return  # not a browser's cross-site request: curl, SDKs, servers
        origin = origin.rstrip("/").lower()
        if origin in self.origins or urlsplit(origin).netloc == host:
            return
        raise Refused(ErrorCode.FORBIDDEN, f"requests from pages at {origin!r} are refused; "
                      "an operator can allow that origin in gateway.allowed_origins")

    async def _read_body(self, headers: dict[str, str], receive: Receive) -> Receive:
        """Read the whole body now (at most max_body bytes) and hand it on as one message."""
        declared = headers.get("content-length")
        length = None if declared is None else whole_number(declared)
        if declared is not None and (length is None or length > self.max_body):
            raise self._too_large()
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return _replay(message, receive)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return _replay({"type": "http.request", "body": b"".join(chunks), "more_body": False}, receive)

    def _too_large(self) -> Refused:
        return Refused(ErrorCode.PAYLOAD_TOO_LARGE,
                       f"the request body is larger than {self.max_body:,} bytes (gateway.max_body_bytes)")

    async def _identify(self, headers: dict[str, str], *,
                        optional: bool = False) -> tuple[Identity | None, Credential | None]:
        """The bearer token's identity, else the sign-in cookie's, and the credential that names it
        (an open connection lives only as long as that); None only where ``optional``."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            own = headers.get("sec-fetch-site", "same-origin") in COOKIE_SITES
            session = _cookie(headers.get("cookie", ""), COOKIE) if own else None
            found = await self.web.identify(session) if session and self.web is not None else None
            if found is not None:
                return found[0], Credential(token_digest=found[1], web_session=session)
            if optional:
                return None, None
            raise Refused(ErrorCode.UNAUTHENTICATED, "this Gateway needs a token: send `Authorization: Bearer <token>` "
                                  "(`pincer token create NAME` makes one), or sign in with `pincer open`")
        identity = await self.tokens.identify(token.strip())
        if identity is None:
            raise Refused(ErrorCode.UNAUTHENTICATED, "the token is not valid (revoked, mistyped, or from another pool)")
        return identity, Credential(token_digest=digest(token.strip()))


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


def _host_name(raw: str) -> str:
    """The name in a Host header, without its port: ``[::1]:8780`` -> ``::1``."""
    raw = raw.strip().lower()
    if raw.startswith("["):
        return raw[1:raw.find("]")] if "]" in raw else ""
    return raw.rsplit(":", 1)[0] if raw.count(":") == 1 else raw


def _replay(first: Message, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return first
        return await receive()

    return replay
