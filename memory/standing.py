"""What an identity may do while nobody is there, taken away with the identity.

An identity acts on its own in two ways: its scheduled jobs run as it, and its
exec allow-always rules let its commands run without asking. Both are standing
authority, not data, so revoking a token, deleting a webhook or letting a chat
user out withdraws both. Its sessions and notes stay: they are what it said,
for an operator to read or delete. A name is an identity, so a token made
later with the same name would otherwise inherit what the revoked one had
been allowed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from bus.text import literal, text
from memory.jobs import JobStore

if TYPE_CHECKING:
    from bus.streams import Bus


async def withdraw(bus: Bus, owner: str) -> list[str]:
    """Remove ``owner``'s jobs and its allow-always rules on every agent; the names of the jobs removed."""
    removed = await JobStore(bus).remove_owner(owner)
    await forget_always_rules(bus, owner)
    return removed


async def remove_and_withdraw(bus: Bus, owner: str, *, exists: Callable[[], Awaitable[bool]],
                              remove: Callable[[], Awaitable[bool]]) -> list[str] | None:
    """``remove`` the identity (its token, its hook), withdrawing before and after: before, so that a removal
    Redis cut short can be asked again (it still exists); after, for what it made in between. The jobs
    removed, or None when ``exists`` says there is no such identity."""
    if not await exists():
        return None
    removed = await withdraw(bus, owner)
    if not await remove():
        return None
    return sorted({*removed, *await withdraw(bus, owner)})


async def forget_always_rules(bus: Bus, owner: str) -> int:
    """Delete the allow-always rules that cover ``owner``, on every agent; how many agents' rules."""
    pattern = bus.keys.exec_allowlist("*", literal(owner))
    head = pattern[:pattern.index("*")]
    found = [text(k) async for k in bus.redis.scan_iter(match=pattern, count=1_000)]
    # An agent's id holds no ':', so a key with one before ``owner`` is another identity's ("x:owner").
    mine = [key for key in found if ":" not in key[len(head):-len(owner) - 1]]
    if mine:
        await bus.redis.delete(*mine)
    return len(mine)
