"""``/v1/channels``: each chat channel's state, the strangers waiting to be paired, and the people let in
by pairing, for an operator (what `pincer channels` shows and does). Pairing and unpairing go through the
channel kit's own store (``gateway.channels.access``), so the API and the CLI follow one rule."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import gateway.channels.access as access
from bus.numbers import whole_number
from bus.pool import channel_rows
from bus.protocol import ErrorCode
from bus.streams import Bus
from gateway.channels.config import KNOWN
from gateway.server.handling import caller
from gateway.turns.refusal import Refused


class ChannelRoutes:
    def __init__(self, bus: Bus, enabled: list[str]) -> None:
        self.bus, self.enabled = bus, enabled

    def routes(self) -> list[Route]:
        return [Route("/v1/channels", self.states, methods=["GET"]),
                Route("/v1/channels/pairing", self.pending, methods=["GET"]),
                Route("/v1/channels/pairing/{code}", self.pair, methods=["POST"]),
                Route("/v1/channels/paired", self.paired, methods=["GET"]),
                Route("/v1/channels/paired/{user}", self.unpair, methods=["DELETE"])]

    async def states(self, request: Request) -> Response:
        """Each channel that runs or is enabled: connected, stalled, no poller or not running; when its poller
        last made progress; messages in and out, errors and the last one."""
        _operator(request)
        return JSONResponse({"channels": await channel_rows(self.bus, self.enabled)})

    async def pending(self, request: Request) -> Response:
        """The pairing requests waiting (``?channel=``: one channel's), oldest first."""
        _operator(request)
        found = [{"channel": name, **who} for name in _channels(request)
                 for who in await access.pending(self.bus, name)]
        return JSONResponse({"requests": sorted(found, key=lambda w: (w["asked"], w["channel"]))})

    async def pair(self, request: Request) -> Response:
        """Let in the stranger given the code (``?channel=`` names the channel it was given on)."""
        by = _operator(request)
        channel, code = _channel(request), request.path_params["code"]
        if not code.isalnum() or len(code) > 32:
            raise Refused(ErrorCode.INVALID_ARGUMENTS, f"{code[:40]!r} is not a pairing code (letters and "
                          f"digits, {access.CODE_LENGTH} of them)")
        who = await access.pair(self.bus, channel, code, by=f"http:{by}")
        if who is None:
            raise Refused(ErrorCode.NOT_FOUND, f"no pending pairing code {code!r} on {channel}: it was used, "
                          "expired, or mistyped (a stranger is given a new one when they write again)")
        return JSONResponse({"channel": channel, "user": who["user"], "username": who.get("username", ""),
                             "identity": access.identity_name(channel, who["user"]), "paired": True})

    async def paired(self, request: Request) -> Response:
        """The people let in by pairing (``?channel=``: one channel's): who let them in, when, their handle."""
        _operator(request)
        found = []
        for name in _channels(request):
            for user, how in sorted((await access.paired(self.bus, name)).items()):
                by, _, rest = how.partition(" ")
                at, _, handle = rest.partition(" ")
                found.append({"channel": name, "user": user, "identity": access.identity_name(name, user),
                              "by": by, "at": whole_number(at), "username": handle.lstrip("@")})
        return JSONResponse({"paired": found})

    async def unpair(self, request: Request) -> Response:
        """Let the person out (``?channel=``); their jobs are removed with them."""
        _operator(request)
        channel, user = _channel(request), request.path_params["user"]
        stopped = await access.unpair_and_forget(self.bus, channel, user)
        if stopped is None:
            raise Refused(ErrorCode.NOT_FOUND, f"{channel} user {user[:80]!r} was not paired")
        return JSONResponse({"channel": channel, "user": user, "unpaired": True, "jobs_removed": stopped})


def _operator(request: Request) -> str:
    identity = caller(request)
    if not identity.operator:
        raise Refused(ErrorCode.FORBIDDEN, "channels and pairing need an operator token "
                      "(`pincer token create NAME --scope operator`)")
    return identity.name


def _channel(request: Request) -> str:
    """The channel ``?channel=`` names, which a pairing or an unpairing needs."""
    name = request.query_params.get("channel")
    if name not in KNOWN:
        raise Refused(ErrorCode.INVALID_ARGUMENTS, f"say which channel with ?channel= (one of {', '.join(KNOWN)})"
                      + (f"; {name[:40]!r} is not one" if name else ""))
    return name


def _channels(request: Request) -> list[str]:
    """The channels a listing covers: ``?channel=``'s, or every known one."""
    return [_channel(request)] if "channel" in request.query_params else list(KNOWN)
