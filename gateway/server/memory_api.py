"""``/v1/memory``: an identity's long-term notes, listed and deleted (what `pincer memory` and a person's own
client call). A caller sees and deletes its own notes with an agent; an operator also another identity's
(``?owner=NAME``) and the agent's shared notes (``?shared=1``). A deleted note leaves no copy in the memory
log, and every worker's search forgets it (docs/memory.md)."""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bus.protocol import ErrorCode
from gateway.server.handling import caller
from gateway.turns.refusal import Refused
from memory.longterm import SHARED, LongTermMemory

KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")  # as the memory tools name notes
AGENT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class MemoryRoutes:
    def __init__(self, memory: LongTermMemory) -> None:
        self.memory = memory

    def routes(self) -> list[Route]:
        return [Route("/v1/memory", self.list_notes, methods=["GET"]),
                Route("/v1/memory/{key}", self.delete_note, methods=["DELETE"])]

    async def list_notes(self, request: Request) -> Response:
        """The notes the owner sees with the agent: its own and the shared ones (``scope`` says which)."""
        agent, owner = self._whose(request)
        return JSONResponse({"agent": agent, "notes": await self.memory.list(agent, owner=owner)})

    async def delete_note(self, request: Request) -> Response:
        key = request.path_params["key"]
        if not KEY.match(key):
            raise Refused(ErrorCode.INVALID_ARGUMENTS, f"{key[:40]!r} is not a note's name (letters, digits, "
                          "_ . -, up to 100)")
        agent, owner = self._whose(request)
        if not await self.memory.delete(agent, key, owner=owner):
            raise Refused(ErrorCode.NOT_FOUND, f"no {'shared' if owner == SHARED else 'own'} note named "
                          f"{key!r} with agent {agent!r}")
        return JSONResponse({"agent": agent, "key": key, "scope": "shared" if owner == SHARED else "own",
                             "deleted": True})

    def _whose(self, request: Request) -> tuple[str, str]:
        """The agent and the owner a request means: the caller's own notes unless an operator says otherwise."""
        identity = caller(request)
        agent = request.query_params.get("agent", "main")
        if not AGENT.match(agent):
            raise Refused(ErrorCode.INVALID_ARGUMENTS, f"{agent[:40]!r} is not an agent's id")
        if not identity.may_use(agent):
            raise Refused(ErrorCode.FORBIDDEN, f"this token may not use agent {agent!r}")
        shared = request.query_params.get("shared") in ("1", "true")
        owner = SHARED if shared else request.query_params.get("owner") or identity.name
        if owner != identity.name and not identity.operator:
            raise Refused(ErrorCode.FORBIDDEN, "only an operator token may touch the shared notes or another "
                          "identity's")
        return agent, owner
