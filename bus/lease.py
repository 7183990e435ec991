"""A lease: one holder among the replicas of a process at a time (a channel's poller, a scheduler).

The holder takes it for ``ttl_ms`` and renews it well before it lapses; a holder that stalls loses
it to another when it lapses. What the holder writes under the lease must check, in the same
script, that it still holds it (``HOLDS``, a Lua prelude): a paused holder that lost the lease can
then never write after the new holder has.
"""

from __future__ import annotations

from typing import Any

from bus.scripts import lua

# KEYS[1]: the lease. ARGV: holder, ttl ms. 1: held by us now; 0: another holds it.
TAKE = lua("bus.lease.take", """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
return 0
""")
# KEYS[1]: the lease. ARGV[1]: holder.
RELEASE = lua("bus.lease.release", """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""")
# The first lines of a script that writes under the lease (KEYS[1] the lease, ARGV[1] the holder).
HOLDS = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end\n"


class Lease:
    def __init__(self, redis: Any, key: str, holder: str, *, ttl_ms: int) -> None:
        self.key, self.holder, self.ttl_ms = key, holder, ttl_ms
        self._take = redis.register_script(TAKE)
        self._release = redis.register_script(RELEASE)
        self.held = False

    async def take(self) -> bool:
        """Take the lease, or renew it if ours; whether we hold it now."""
        self.held = bool(await self._take(keys=[self.key], args=[self.holder, self.ttl_ms]))
        return self.held

    async def release(self) -> None:
        if self.held:
            self.held = False
            await self._release(keys=[self.key], args=[self.holder])
