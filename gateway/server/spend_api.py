"""``/v1/spend``: what the pool, each agent and each identity spent today and this month against their
limits, the latest alerts, and (``?days=N``) each day's spend for a chart. An operator sees the pool's; any
other caller only its own identity's lines, in the same shape (what `pincer budget --json` shows)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bus.numbers import whole_number
from bus.protocol import ErrorCode
from bus.streams import Bus
from gateway.server.handling import caller
from gateway.turns.refusal import Refused
from memory.spend import HISTORY_DAYS, SpendView, daily, report


class SpendRoutes:
    def __init__(self, bus: Bus, view: SpendView) -> None:
        self.bus, self.view = bus, view

    def routes(self) -> list[Route]:
        return [Route("/v1/spend", self.spend, methods=["GET"])]

    async def spend(self, request: Request) -> Response:
        identity = caller(request)
        only = None if identity.operator else f"identity:{identity.name}"
        days = _days(request.query_params.get("days"))
        found = await report(self.bus, self.view.budget, self.view.agent_ids(), only=only)
        if days:
            found["daily"] = await daily(self.bus, self.view.budget, days, only=only)
        return JSONResponse({"scope": "pool" if only is None else only, **found})


def _days(raw: str | None) -> int:
    """``?days=N`` as a number of days (0: not asked for)."""
    if raw is None:
        return 0
    days = whole_number(raw)
    if days is None or not 1 <= days <= HISTORY_DAYS:
        raise Refused(ErrorCode.INVALID_ARGUMENTS, f"days must be a whole number from 1 to {HISTORY_DAYS} "
                      f"(the days of spend kept), got {raw[:20]!r}")
    return days
