"""``/v1/tokens`` and ``/v1/admin/hooks``: the Gateway's tokens and signed webhooks, made, listed, rotated
and removed by an operator (what `pincer token` and `pincer hooks` do). A new token's or hook's secret is in
the answer that made it and never again; a listing shows none. Revoking a token or removing a hook removes
its identity's jobs, through the same functions the CLI calls.

Hooks are managed under ``/v1/admin/hooks`` because ``POST /v1/hooks/{name}`` is the signed entry point a
sender calls without a token: an operator's "make a hook" must not be a path a sender can reach."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bus.protocol import ErrorCode
from bus.streams import Bus
from gateway.server.handling import caller, read_json
from gateway.server.hooks import NAME as HOOK_NAME
from gateway.server.hooks import HookStore, remove_and_forget
from gateway.tokens import NAME_PATTERN, OWNER, TokenError, TokenStore, revoke_and_forget
from gateway.turns.refusal import Refused
from gateway.turns.runner import AGENT_ID

ROTATE_GRACE_S = 3600.0  # as `pincer hooks rotate`'s --grace


class NewToken(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    scope: Literal["chat", "operator"] = "chat"
    agents: list[str] = []  # the agents it may use; none: every agent

    def agent_problem(self) -> str | None:
        bad = [a for a in self.agents if not re.match(AGENT_ID, a)]
        return f"agents: {bad[0][:40]!r} is not an agent's id" if bad else None


class NewHook(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=HOOK_NAME)
    agent: str = Field(default="main", pattern=AGENT_ID)
    template: str = Field(min_length=1, max_length=20_000)  # {payload} marks where a request's body goes
    deliver: str | None = Field(default=None, pattern=r"^https?://\S+$")


class Rotate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grace_s: float = Field(default=ROTATE_GRACE_S, ge=0, le=30 * 86_400)  # the old secret stays good this long


class AdminRoutes:
    def __init__(self, bus: Bus, tokens: TokenStore, *, static_token: bool) -> None:
        self.bus, self.tokens, self.static_token = bus, tokens, static_token
        self.hooks = HookStore(bus.redis, bus.keys)

    def routes(self) -> list[Route]:
        return [Route("/v1/tokens", self.list_tokens, methods=["GET"]),
                Route("/v1/tokens", self.create_token, methods=["POST"]),
                Route("/v1/tokens/{name}", self.revoke_token, methods=["DELETE"]),
                Route("/v1/admin/hooks", self.list_hooks, methods=["GET"]),
                Route("/v1/admin/hooks", self.add_hook, methods=["POST"]),
                Route("/v1/admin/hooks/{name}/rotate", self.rotate_hook, methods=["POST"]),
                Route("/v1/admin/hooks/{name}", self.remove_hook, methods=["DELETE"])]

    async def list_tokens(self, request: Request) -> Response:
        """Every stored token's identity (never a secret: only digests are kept), and the configured one."""
        _operator(request, "tokens")
        found = [{**i.model_dump(mode="json"), "source": "stored"} for i in await self.tokens.list()]
        if self.static_token:
            found.append({"name": OWNER, "scope": "operator", "agents": None, "created": None,
                          "source": "gateway.token"})
        return JSONResponse({"tokens": found})

    async def create_token(self, request: Request) -> Response:
        _operator(request, "tokens")
        body = await read_json(request, NewToken, example='{"name": "alice", "scope": "chat", "agents": ["main"]}')
        if problem := body.agent_problem():
            raise Refused(ErrorCode.INVALID_ARGUMENTS, problem)
        try:
            token = await self.tokens.create(body.name, scope=body.scope, agents=body.agents or None)
        except TokenError as exc:
            raise Refused(ErrorCode.CONFLICT, str(exc)) from None
        return JSONResponse({"name": body.name, "scope": body.scope, "agents": body.agents or None, "token": token,
                             "note": "the token is shown this once: keep it somewhere safe"}, status_code=201)

    async def revoke_token(self, request: Request) -> Response:
        _operator(request, "tokens")
        name = request.path_params["name"]
        if name == OWNER and self.static_token:
            raise Refused(ErrorCode.CONFLICT, f"{OWNER!r} is the configured token (gateway.token): change it "
                          "in the config, not here")
        stopped = await revoke_and_forget(self.bus, self.tokens, name)
        if stopped is None:
            raise Refused(ErrorCode.NOT_FOUND, f"no token named {name[:64]!r}")
        return JSONResponse({"name": name, "revoked": True, "jobs_removed": stopped})

    async def list_hooks(self, request: Request) -> Response:
        _operator(request, "hooks")
        return JSONResponse({"hooks": [hook.shown() for hook in await self.hooks.list()]})

    async def add_hook(self, request: Request) -> Response:
        _operator(request, "hooks")
        body = await read_json(request, NewHook, example='{"name": "ci", "template": "CI says: {payload}"}')
        try:
            secret = await self.hooks.add(body.name, agent=body.agent, template=body.template, deliver=body.deliver)
        except ValueError as exc:  # the name is taken (the fields were checked above)
            raise Refused(ErrorCode.CONFLICT, str(exc)) from None
        return JSONResponse({"name": body.name, "agent": body.agent, "path": f"/v1/hooks/{body.name}",
                             "secret": secret, "note": "the secret is shown this once: give it to the sender"},
                            status_code=201)

    async def rotate_hook(self, request: Request) -> Response:
        _operator(request, "hooks")
        name = request.path_params["name"]
        grace = await read_json(request, Rotate, example='{"grace_s": 3600}') if await request.body() else Rotate()
        if await self.hooks.get(name) is None:
            raise Refused(ErrorCode.NOT_FOUND, f"no hook named {name[:64]!r}")
        secret = await self.hooks.rotate(name, grace_s=grace.grace_s)
        return JSONResponse({"name": name, "secret": secret, "previous_good_for_s": grace.grace_s})

    async def remove_hook(self, request: Request) -> Response:
        _operator(request, "hooks")
        name = request.path_params["name"]
        stopped = await remove_and_forget(self.bus, self.hooks, name)
        if stopped is None:
            raise Refused(ErrorCode.NOT_FOUND, f"no hook named {name[:64]!r}")
        return JSONResponse({"name": name, "removed": True, "jobs_removed": stopped})


def _operator(request: Request, what: str) -> None:
    if not caller(request).operator:
        raise Refused(ErrorCode.FORBIDDEN, f"{what} are managed with an operator token "
                      "(`pincer token create NAME --scope operator`)")
