"""The pool-wide limits every turn an identity starts passes, whoever starts it: its message rate and the
Brains' backlog.

The Gateway's doors (gateway/server/limits.py) and the jobs' scheduler (brain/scheduler.py) charge the same
bucket per identity (``Keys.message_rate``), refilled from Redis' own clock so processes whose clocks
disagree share it, and read the same backlog. Each caller turns a refusal into its own kind: a 429 or 503
at the Gateway, a run recorded skipped at the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bus.keys import BRAIN_GROUP
from bus.scripts import ScriptCall, lua

if TYPE_CHECKING:  # only named: the Gateway's settings hold RateLimits, and `pincer up` reads those
    from bus.streams import Bus

# KEYS: the identity's bucket. ARGV: capacity, tokens per ms, how many to take (at most the capacity).
# 0: taken; else how many ms until that many are there.
TAKE = lua("bus.admission.take", """
local capacity, per_ms, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local state = redis.call('hmget', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or capacity
local at = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - at) * per_ms)
local wait_ms = 0
if tokens >= cost then tokens = tokens - cost else wait_ms = math.ceil((cost - tokens) / per_ms) end
redis.call('hset', KEYS[1], 'tokens', tostring(tokens), 'at', now)
redis.call('pexpire', KEYS[1], math.ceil(capacity / per_ms) + 1000)
return wait_ms
""")


@dataclass(frozen=True)
class RateLimits:
    """An identity's messages per minute (a burst of ``burst`` at once) and the backlog past which none start."""

    messages_per_minute: int = 120
    burst: int = 30
    max_inbox_backlog: int = 1000


class Admission:
    def __init__(self, bus: Bus, limits: RateLimits) -> None:
        self.bus, self.limits = bus, limits

    async def take_message(self, identity: str) -> int:
        """Count one message against the identity's rate: 0 when taken, else the ms until one would be."""
        take = self.take_call(identity)
        # With the bus's writes, so messages arriving together share a round trip (EVAL: see bus/scripts.py).
        return int(take.read((await self.bus.batcher.run(take.add))[0]))

    def take_call(self, identity: str, messages: int = 1) -> ScriptCall:
        """``take_message`` as a script to run (alone, or as the gate of what the message does next); what
        costs as much as several messages takes that many, at most a whole burst."""
        per_ms = self.limits.messages_per_minute / 60_000
        return ScriptCall(TAKE, (self.bus.keys.message_rate(identity),),
                          (self.limits.burst, per_ms, self.cost_of(messages)), int)

    def cost_of(self, messages: int) -> int:
        """What taking ``messages`` costs: at most a whole burst, so a long fork waits for a full bucket
        rather than being refused for ever."""
        return max(1, min(messages, self.limits.burst))

    async def waiting(self) -> int:
        """Messages in the Brain inbox no Brain has read yet (counted up to the backlog limit)."""
        from bus.pool import unread  # here, not above: the pool's queries bring redis-py with them

        return await unread(self.bus, self.bus.keys.brain_inbox, BRAIN_GROUP, cap=self.limits.max_inbox_backlog)
