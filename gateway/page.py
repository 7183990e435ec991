"""The chat page at ``/`` and the browser's sign-in: static files shipped in the package, no build step.

Sign-in is a one-time link (``pincer open``) or a pasted token; either gives
an HttpOnly, SameSite=Strict cookie that stands for the token until the
token is revoked or the cookie's week is over. Nothing secret is readable by
the page's scripts, and the Content-Security-Policy lets only the Gateway's
own scripts run (a second wall behind DOMPurify).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

from bus.protocol import ErrorCode
from gateway.errors import Refused
from gateway.guard import COOKIE
from gateway.handling import read_json
from gateway.tokens import WebSessions

STATIC = Path(str(resources.files("gateway") / "static"))
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cache-Control": "no-store"}


class PastedToken(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: str = Field(min_length=1, max_length=512)


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

    async def login_with_code(request: Request) -> Response:
        session = await web.redeem(request.query_params.get("code", ""))
        if session is None:
            return HTMLResponse("<!doctype html><title>Pincer</title><p>This sign-in link was used already or has "
                                "expired. Run <code>pincer open</code> again for a new one.</p>", status_code=400,
                                headers=HEADERS)
        response = RedirectResponse("/", status_code=303, headers=HEADERS)
        _set_cookie(request, response, session, web.session_s)
        return response

    async def login_with_token(request: Request) -> Response:
        body = await read_json(request, PastedToken, example='{"token": "pcr_..."}')
        session = await web.sign_in(body.token.strip())
        if session is None:
            raise Refused(401, ErrorCode.UNAUTHENTICATED, "that token is not valid (revoked, mistyped, or from "
                          "another pool)")
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
        Route("/login", login_with_code, methods=["GET"]),
        Route("/login", login_with_token, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Mount("/static", Hardened(StaticFiles(directory=STATIC))),
    ]


def _set_cookie(request: Request, response: Response, session: str, max_age: int) -> None:
    response.set_cookie(COOKIE, session, max_age=max_age, path="/", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https")
