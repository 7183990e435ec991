"""The tool list from Hands, cached until the digest Hands announces moves."""

from __future__ import annotations

import logging

from bus.presence import alive
from bus.protocol import SkillInfo, ToolsAvailable, ToolsList, ToolSpec, now_ms
from bus.streams import Bus, ReplyInbox

log = logging.getLogger("brain.catalog")


class NoHandsAvailable(Exception):
    """No Hands worker answered ``tools:list`` in time."""


class ToolCatalog:
    def __init__(self, bus: Bus, inbox: ReplyInbox, *, timeout_s: float) -> None:
        self.bus, self.inbox, self.timeout_s = bus, inbox, timeout_s
        self._tools: list[ToolSpec] | None = None
        self.skills: list[SkillInfo] = []  # instruction skills, refreshed with the tools
        self._digest: bytes | None = None

    async def tools(self) -> list[ToolSpec]:
        digest = await self.bus.redis.get(self.bus.keys.tools_digest)
        if self._tools is not None and digest == self._digest:
            return self._tools
        request = ToolsList(reply_to=self.inbox.stream, deadline=now_ms() + int(self.timeout_s * 1000))
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
        self._tools, self._digest, self.skills = reply.tools, digest, reply.skills
        log.info("tool list refreshed: %d tools, digest %s", len(reply.tools), reply.digest)
        return self._tools
