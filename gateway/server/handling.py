"""What every route does with a request: who asks, its JSON body, its session id, a turn it may abandon."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from bus.protocol import ErrorCode
from gateway.server.connections import Credential
from gateway.tokens import Identity
from gateway.turns.refusal import Refused
from gateway.turns.session_names import ALL_OWNERS, owner_meant, qualify

B = TypeVar("B", bound=BaseModel)


def caller(request: Request) -> Identity:
    """Who is asking: the identity the guard found for the request's token."""
    identity: Identity = request.state.identity
    return identity


def credential(request: Request) -> Credential | None:
    """What the caller's identity was proven with (an open stream lives only as long as it stands)."""
    found: Credential | None = getattr(request.state, "credential", None)
    return found


async def read_json(request: Request, model: type[B], *, example: str) -> B:
    """The body as ``model``: 415 unless it is JSON, 400 with every problem when it does not fit."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/json":
        raise Refused(ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                      f"send the body as JSON with `Content-Type: application/json` (got {kind or 'none'!r})")
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        lines = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()[:10]]
        raise Refused(ErrorCode.INVALID_ARGUMENTS,
                      f"bad request body (expected JSON like {example}): " + "; ".join(lines)) from None


async def collect_or_cancel(request: Request, collect: Coroutine[Any, Any, Response]) -> Response:
    """Run a plain request's turn to its end; a client that hangs up first cancels it."""
    done = asyncio.ensure_future(collect)
    gone = asyncio.ensure_future(until_disconnected(request.receive))
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not done.done():
            done.cancel()
            await asyncio.gather(done, return_exceptions=True)  # its events() cancels the turn
    if done.cancelled():
        return Response(status_code=499)
    result: Response = done.result()
    return result


def listed_owner(request: Request, what: str) -> str | None:
    """Whose ``what`` a list shows: the caller's own; an operator's ``?owner=NAME`` that identity's, and
    ``?owner=*`` every one's (None)."""
    identity, asked = caller(request), request.query_params.get("owner")
    if asked == ALL_OWNERS:
        if not identity.operator:
            raise Refused(ErrorCode.FORBIDDEN, f"only an operator token may list every identity's {what}")
        return None
    return owner_meant(identity, asked, f"list another identity's {what}")


def session_id_of(request: Request) -> str:
    """The wire id of the session the request names: the caller's own, or (an operator's ``?owner=``) another's."""
    return qualify(caller(request), request.path_params["session_id"], request.query_params.get("owner"))


async def until_disconnected(receive: Receive) -> None:
    """Return when the client of a plain (not streamed) request goes away (its body is read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
