"""The chat page at ``/`` and the browser's sign-in: static files shipped in the package, no build step.

Sign-in is a one-time link (``pincer open``) or a pasted token; either gives
an HttpOnly, SameSite=Strict cookie that stands for the token until the
token is revoked, the page signs out or the cookie's week is over. The
link's code rides after ``#`` (``/login#code=...``): browsers never send that
part to a server, log it or pass it on as a referrer; the login page's script
posts it once and takes it out of the address. Nothing secret is readable by
the page's scripts, and the Content-Security-Policy lets only the Gateway's
own scripts run (a second wall behind DOMPurify).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

from bus.protocol import ErrorCode
from gateway.server.guard import COOKIE
from gateway.server.handling import read_json
from gateway.tokens import WebSessions
from gateway.turns.refusal import Refused

STATIC = Path(str(resources.files("gateway.server") / "static"))
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cache-Control": "no-store"}


class SignIn(BaseModel):
    """A pasted token, or a one-time link's code."""

    model_config = ConfigDict(extra="forbid")

    token: str | None = Field(default=None, min_length=1, max_length=512)
    code: str | None = Field(default=None, min_length=1, max_length=128)


class Hardened:
    """Static files with the page's security headers (and no directory listings)."""

    def __init__(self, app: StaticFiles) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []),
                                      *[(k.lower().encode(), v.encode()) for k, v in HEADERS.items()
                                        if k != "Cache-Control"]]
            await send(message)
        await self.app(scope, receive, with_headers)


def page_routes(web: WebSessions) -> list[BaseRoute]:
    async def page(_request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers=HEADERS)

    async def login_page(_request: Request) -> Response:
        return FileResponse(STATIC / "login.html", headers=HEADERS)

    async def sign_in(request: Request) -> Response:
        body = await read_json(request, SignIn, example='{"token": "pcr_..."} or {"code": "..."}')
        if (body.token is None) == (body.code is None):
            raise Refused(ErrorCode.INVALID_ARGUMENTS, "send either a token or a sign-in link's code")
        if body.code is not None:
            session = await web.redeem(body.code)
            why = "this sign-in link was used already or has expired; run `pincer open` again for a new one"
        else:
            session = await web.sign_in((body.token or "").strip())
            why = "that token is not valid (revoked, mistyped, or from another pool)"
        if session is None:
            raise Refused(ErrorCode.UNAUTHENTICATED, why)
        response = JSONResponse({"signed_in": True}, headers=HEADERS)
        _set_cookie(request, response, session, web.session_s)
        return response

    async def logout(request: Request) -> Response:
        session = request.cookies.get(COOKIE)
        if session:
            await web.end(session)
        response = JSONResponse({"signed_out": True}, headers=HEADERS)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    return [
        Route("/", page, methods=["GET"]),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", sign_in, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Mount("/static", Hardened(StaticFiles(directory=STATIC))),
    ]


def _set_cookie(request: Request, response: Response, session: str, max_age: int) -> None:
    response.set_cookie(COOKIE, session, max_age=max_age, path="/", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https")
