"""The tool list from Hands, per agent and sender, cached until the digest Hands announces moves."""

from __future__ import annotations

import asyncio
import logging

from bus.carry import Carried
from bus.errors import PincerError
from bus.presence import alive
from bus.protocol import SkillInfo, ToolsAvailable, ToolsList, ToolSpec, now_ms
from bus.replies import ReplyInbox
from bus.streams import Bus

log = logging.getLogger("brain.catalog")


class NoHandsAvailable(PincerError):
    """No Hands worker answered ``tools:list`` in time."""


class Unread:
    """The digest was not read yet: ``lookup`` reads it."""


UNREAD = Unread()


class ToolCatalog:
    def __init__(self, bus: Bus, inbox: ReplyInbox, *, timeout_s: float) -> None:
        self.bus, self.inbox, self.timeout_s = bus, inbox, timeout_s
        # Hands' tool policy decides per agent and sender, so each pair has its own list.
        self._cache: dict[tuple[str, str], tuple[list[ToolSpec], list[SkillInfo]]] = {}
        self._digest: bytes | None = None
        # The request in flight per pair: turns that start together (a burst, a Brain just started, up to
        # brain.max_turns of them) share its answer instead of sending Hands one request each.
        self._asking: dict[tuple[str, str], asyncio.Task[tuple[list[ToolSpec], list[SkillInfo]]]] = {}
        self._reading: asyncio.Task[bytes | None] | None = None  # the digest's read in flight, shared alike

    async def tools(self, agent_id: str = "main", sender: str = "") -> list[ToolSpec]:
        return (await self.lookup(agent_id, sender))[0]

    async def lookup(self, agent_id: str = "main", sender: str = "", *,
                     announced: bytes | Unread | None = UNREAD) -> tuple[list[ToolSpec], list[SkillInfo]]:
        """The tools and instruction skills this agent may use with this sender; ``announced``: the digest
        Hands announces, read already (with the turn's first reads)."""
        digest = await self._announced() if isinstance(announced, Unread) else announced
        if digest != self._digest:
            self._cache.clear()  # Hands' tools changed: every list is stale
        key = (agent_id, sender)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        asking = self._asking.get(key)
        if asking is None:
            asking = self._asking[key] = asyncio.get_running_loop().create_task(self._ask(agent_id, sender, digest))
            asking.add_done_callback(lambda done: self._asked(key, done))
        return await asyncio.shield(asking)  # a turn cancelled meanwhile leaves the others their answer

    def digest_read(self) -> Carried[bytes | None]:
        """The announced digest's read, for a caller that sends it with its own commands."""
        key = self.bus.keys.tools_digest
        return Carried(lambda pipe: pipe.get(key), 1, lambda got: got[0])

    def offers(self, agent_id: str, sender: str, tool: str) -> bool:
        """Whether the list last heard for this pair holds ``tool`` (False before any was heard)."""
        cached = self._cache.get((agent_id, sender))
        return cached is not None and any(spec.name == tool for spec in cached[0])

    async def _announced(self) -> bytes | None:
        """The digest Hands announces: one GET for all the turns that ask while it is on its way."""
        if self._reading is None or self._reading.done():
            self._reading = asyncio.get_running_loop().create_task(self._read_digest())
            self._reading.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved
        return await asyncio.shield(self._reading)

    async def _read_digest(self) -> bytes | None:
        digest: bytes | None = await self.bus.redis.get(self.bus.keys.tools_digest)  # type: ignore[assignment]  # bytes: decode_responses=False
        return digest

    def _asked(self, key: tuple[str, str], done: asyncio.Task[tuple[list[ToolSpec], list[SkillInfo]]]) -> None:
        del self._asking[key]
        if not done.cancelled():
            done.exception()  # retrieved: every turn that waited on it may have been cancelled

    async def _ask(self, agent_id: str, sender: str,
                   digest: bytes | None) -> tuple[list[ToolSpec], list[SkillInfo]]:
        """One ``tools:list`` to Hands; its answer cached under the digest read before it was sent."""
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
        # One order, whichever Hands worker listed them; sorted here once, so every turn is handed the same
        # list object and what is made of it once per list (its wire form, its JSON) is made once.
        tools = sorted(reply.tools, key=lambda spec: spec.name)
        self._cache[agent_id, sender] = (tools, reply.skills)
        log.info("tool list refreshed for agent %s: %d tools, digest %s", agent_id, len(tools), reply.digest)
        return tools, reply.skills
