"""The tool list from Hands, per agent and sender, cached until the digest Hands announces moves."""

from __future__ import annotations

import logging

from bus.errors import PincerError
from bus.presence import alive
from bus.protocol import SkillInfo, ToolsAvailable, ToolsList, ToolSpec, now_ms
from bus.replies import ReplyInbox
from bus.streams import Bus

log = logging.getLogger("brain.catalog")


class NoHandsAvailable(PincerError):
    """No Hands worker answered ``tools:list`` in time."""


class ToolCatalog:
    def __init__(self, bus: Bus, inbox: ReplyInbox, *, timeout_s: float) -> None:
        self.bus, self.inbox, self.timeout_s = bus, inbox, timeout_s
        # Hands' tool policy decides per agent and sender, so each pair has its own list.
        self._cache: dict[tuple[str, str], tuple[list[ToolSpec], list[SkillInfo]]] = {}
        self._digest: bytes | None = None

    async def tools(self, agent_id: str = "main", sender: str = "") -> list[ToolSpec]:
        return (await self.lookup(agent_id, sender))[0]

    async def lookup(self, agent_id: str = "main", sender: str = "") -> tuple[list[ToolSpec], list[SkillInfo]]:
        """The tools and instruction skills this agent may use with this sender."""
        digest: bytes | None = await self.bus.redis.get(self.bus.keys.tools_digest)  # type: ignore[assignment]  # bytes: decode_responses=False
        if digest != self._digest:
            self._cache.clear()  # Hands' tools changed: every list is stale
        cached = self._cache.get((agent_id, sender))
        if cached is not None:
            return cached
        request = ToolsList(reply_to=self.inbox.stream, deadline=now_ms() + int(self.timeout_s * 1000),
                            agent_id=agent_id, sender=sender)
        try:
            reply = await self.inbox.request(
                self.bus.keys.hands_requests, request, request.request_id, timeout=self.timeout_s
            )
        except TimeoutError:
            workers = len(await alive(self.bus, "hands"))
            raise NoHandsAvailable(
                f"no Hands worker answered the tool list request within {self.timeout_s:g}s "
                f"({workers} alive); start one with `pincer hands` or `pincer up --hands N`"
            ) from None
        assert isinstance(reply, ToolsAvailable)
        # Remember the announced digest we saw, not the reply's: the cache follows the key.
        self._digest = digest
        self._cache[(agent_id, sender)] = (reply.tools, reply.skills)
        log.info("tool list refreshed for agent %s: %d tools, digest %s", agent_id, len(reply.tools), reply.digest)
        return reply.tools, reply.skills
