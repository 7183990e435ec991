"""``/v1/memory``: an identity's long-term notes, listed, searched and deleted, and what recall finds for a
question (what `pincer memory` and a person's own client call). A caller sees and deletes its own notes with
an agent; an operator also another identity's (``?owner=NAME``) and the agent's shared notes (``?shared=1``). A
deleted note leaves no copy in the memory log, and every worker's search forgets it (docs/memory.md).

Recall (``/v1/memory/recall``) is the agent's own ``memory_search`` tool, run by a Hands worker for the caller:
the search index lives in the Hands workers, and asking one keeps a single home for what recall finds
(``memory.recall``), the same for a turn and for this page."""

from __future__ import annotations

import re
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bus.numbers import whole_number
from bus.protocol import ErrorCode, ToolExecute, ToolResult, now_ms
from bus.replies import ReplyInbox
from bus.streams import Bus
from gateway.server.handling import caller
from gateway.turns.limits import CallerLimits
from gateway.turns.refusal import Refused
from gateway.turns.session_names import owner_meant
from memory.longterm import SHARED, LongTermMemory

KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")  # as the memory tools name notes
AGENT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
QUERY_CHARS = 500  # as memory_search's query
RECALL_LIMIT = 50  # as memory_search's limit
RECALL_TIMEOUT_S = 15.0


class Recaller(Protocol):
    """What recall finds for ``owner`` with an agent: hits as ``memory_search`` returns them, best first."""

    async def recall(self, agent_id: str, query: str, *, owner: str, limit: int) -> list[dict[str, Any]]: ...


class PoolRecall:
    """Recall asked of the Hands pool: one ``memory_search`` call on the caller's behalf, answered by a worker's
    index (the one a turn's search reads)."""

    def __init__(self, bus: Bus, inbox: ReplyInbox, *, timeout_s: float = RECALL_TIMEOUT_S) -> None:
        self.bus, self.inbox, self.timeout_s = bus, inbox, timeout_s

    async def recall(self, agent_id: str, query: str, *, owner: str, limit: int) -> list[dict[str, Any]]:
        call = ToolExecute(tool="memory_search", args={"query": query, "limit": limit}, agent_id=agent_id,
                           sender=owner, session_id=f"{owner or 'shared'}/memory-recall", reply_to=self.inbox.stream,
                           deadline=now_ms() + int(self.timeout_s * 1000))
        try:
            result = await self.inbox.request(self.bus.keys.hands_requests, call, call.call_id,
                                              timeout=self.timeout_s, final=(ToolResult,))
        except TimeoutError:
            raise Refused(ErrorCode.SERVICE_UNAVAILABLE, f"no Hands worker answered within {self.timeout_s:g}s: recall "
                          "runs on one (start one with `pincer hands` or `pincer up`)") from None
        assert isinstance(result, ToolResult)
        if not result.success:
            error = result.error
            assert error is not None
            raise Refused(error.code, f"recall failed: {error.message}")
        hits: list[dict[str, Any]] = result.data.get("hits", []) if isinstance(result.data, dict) else []
        return hits


class MemoryRoutes:
    def __init__(self, memory: LongTermMemory, recall: Recaller | None = None, *,
                 limits: CallerLimits | None = None) -> None:
        self.memory, self.recaller, self.limits = memory, recall, limits

    def routes(self) -> list[Route]:
        return [Route("/v1/memory", self.list_notes, methods=["GET"]),
                Route("/v1/memory/recall", self.recall, methods=["GET"]),
                Route("/v1/memory/{key}", self.delete_note, methods=["DELETE"])]

    async def list_notes(self, request: Request) -> Response:
        """The notes the owner sees with the agent: its own and the shared ones (``scope`` says which);
        ``?q=``: those whose name or text holds it (ignoring case)."""
        agent, owner = self._whose(request)
        query = _query(request, required=False).lower()
        notes = await self.memory.list(agent, owner=owner, holding=query)
        return JSONResponse({"agent": agent, "notes": notes, **({"q": query} if query else {})})

    async def recall(self, request: Request) -> Response:
        """What the agent's recall (``memory_search``) finds for ``?q=`` among the owner's notes, the shared
        ones and the owner's past conversations, best first (``?limit=``, 10 unless said)."""
        agent, owner = self._whose(request)
        query = _query(request, required=True)
        raw = request.query_params.get("limit", "10")
        limit = whole_number(raw)
        if limit is None or not 1 <= limit <= RECALL_LIMIT:
            raise Refused(ErrorCode.INVALID_ARGUMENTS, f"limit must be a whole number from 1 to {RECALL_LIMIT}, "
                          f"got {raw[:20]!r}")
        if self.recaller is None:
            raise Refused(ErrorCode.SERVICE_UNAVAILABLE, "recall is not available from this Gateway")
        if self.limits is not None:  # each recall is work for a Hands worker: it counts as a message does
            await self.limits.take_message(caller(request).name)
        hits = await self.recaller.recall(agent, query, owner=owner, limit=int(raw))
        return JSONResponse({"agent": agent, "q": query, "hits": hits})

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
        if request.query_params.get("shared") in ("1", "true"):
            if not identity.operator:
                raise Refused(ErrorCode.FORBIDDEN, "only an operator token may touch the shared notes")
            return agent, SHARED
        return agent, owner_meant(identity, request.query_params.get("owner"), "touch another identity's notes")


def _query(request: Request, *, required: bool) -> str:
    """``?q=``, trimmed: what a search or recall looks for."""
    query = request.query_params.get("q", "").strip()
    if required and not query:
        raise Refused(ErrorCode.INVALID_ARGUMENTS, "say what to recall with ?q= (a question or a few words)")
    if len(query) > QUERY_CHARS:
        raise Refused(ErrorCode.INVALID_ARGUMENTS, f"q is {len(query)} characters; at most {QUERY_CHARS}")
    return query
