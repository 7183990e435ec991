"""The long-term notes one call may use: its sender's own, and the agent's shared ones.

A tool (or a skill) gets this view as ``ctx.memory``: it says which agent's notes
it means, never whose; the view is bound to the call's sender (a call without one,
from a client of the bus itself, uses the shared notes). Writing a shared note
takes ``shared=True`` and an owner of the pool (``hands.tools.owners``).
"""

from __future__ import annotations

from bus.errors import PincerError
from hands.seams import NoteKeeping, Notes

SHARED = ""  # the owner of an agent's shared notes (memory.longterm.SHARED)


class NotAnOwner(PincerError, PermissionError):
    """A shared note written by someone who is not an owner of the pool."""


class CallersNotes:
    def __init__(self, store: NoteKeeping, *, owner: str, may_share: bool = False, turn: str = "") -> None:
        self.store, self.owner, self.may_share, self.turn = store, owner, may_share or owner == SHARED, turn

    async def write(self, agent_id: str, key: str, content: str, *, append: bool = False,
                    shared: bool = False) -> str:
        if shared and not self.may_share:
            raise NotAnOwner(f"only the pool's owners write shared notes (hands.tools.owners), and {self.owner!r} "
                             "is not one")
        return await self.store.write(agent_id, key, content, owner=SHARED if shared else self.owner, append=append)

    async def delete(self, agent_id: str, key: str, *, shared: bool = False) -> bool:
        """Delete the sender's note (or, for an owner of the pool, a shared one), every copy of it too."""
        if shared and not self.may_share:
            raise NotAnOwner(f"only the pool's owners delete shared notes (hands.tools.owners), and {self.owner!r} "
                             "is not one")
        return await self.store.delete(agent_id, key, owner=SHARED if shared else self.owner)

    async def read(self, agent_id: str, key: str) -> str | None:
        found = await self.store.read(agent_id, key, owner=self.owner)
        return None if found is None else found[0]

    async def find(self, agent_id: str, key: str) -> tuple[str, str] | None:
        """The note and whose it is: "own" or "shared"."""
        return await self.store.read(agent_id, key, owner=self.owner)

    async def list(self, agent_id: str) -> Notes:
        return await self.store.list(agent_id, owner=self.owner)

    async def search(self, agent_id: str, query: str, *, limit: int = 10) -> Notes:
        """The sender's notes, the shared ones and its earlier conversations (not this turn's words)."""
        return await self.store.search(agent_id, query, owner=self.owner, limit=limit, turn=self.turn)
