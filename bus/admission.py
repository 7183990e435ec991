"""The pool-wide limits every turn an identity starts passes, whoever starts it: its message rate, the text
it may store a day, and the Brains' backlog.

The Gateway's doors (gateway/turns/limits.py) and the jobs' scheduler (brain/scheduler.py) charge the same
buckets per identity (``Keys.message_rate``, ``Keys.text_rate``), refilled from Redis' own clock so
processes whose clocks disagree share them, and read the same backlog. The text bucket bounds what one
identity can make Redis hold: messages a minute times the largest request would otherwise fill it within
the hour. Each caller turns a refusal into its own kind: a 429 or 503 at the Gateway, a run recorded
skipped at the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bus.keys import BRAIN_GROUP
from bus.scripts import ScriptCall, lua

if TYPE_CHECKING:  # only named: the Gateway's settings hold RateLimits, and `pincer up` reads those
    from bus.streams import Bus

# KEYS: the identity's message bucket, its text bucket. ARGV: for messages and for bytes of text, each: the
# capacity, what comes back a ms, how much to take (at most the capacity). Both are taken or neither. 0: taken;
# N > 0: ms until that many messages are there; -N: ms until that many bytes are. Two keys, not one hash: a
# process of an older release runs its own script on the message bucket, and its short expiry would end a
# day's text with it.
TAKE = lua("bus.admission.take", """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function held(key, capacity, per_ms)
  local state = redis.call('hmget', key, 'tokens', 'at')
  local since = math.max(0, now - (tonumber(state[2]) or now))
  return math.min(capacity, (tonumber(state[1]) or capacity) + since * per_ms)
end
local function keep(key, tokens, capacity, per_ms)
  redis.call('hset', key, 'tokens', tostring(tokens), 'at', now)
  redis.call('pexpire', key, math.ceil(capacity / per_ms) + 1000)
end
local capacity, per_ms, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local byte_capacity, byte_per_ms, byte_cost = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local tokens = held(KEYS[1], capacity, per_ms)
local bytes = held(KEYS[2], byte_capacity, byte_per_ms)
local wait_ms = 0
if tokens < cost then
  wait_ms = math.ceil((cost - tokens) / per_ms)
elseif bytes < byte_cost then
  wait_ms = -math.ceil((byte_cost - bytes) / byte_per_ms)
else
  tokens, bytes = tokens - cost, bytes - byte_cost
end
keep(KEYS[1], tokens, capacity, per_ms)
keep(KEYS[2], bytes, byte_capacity, byte_per_ms)
return wait_ms
""")

DAY_MS = 86_400_000


@dataclass(frozen=True)
class RateLimits:
    """An identity's messages per minute (a burst of ``burst`` at once), the bytes of text it may store a day
    (all at once, or spread), and the backlog past which no message starts."""

    messages_per_minute: int = 120
    burst: int = 30
    text_bytes_per_day: int = 256 << 20
    max_inbox_backlog: int = 1000


@dataclass(frozen=True)
class Refusal:
    """Why a take was refused: which limit was short, and how long until it would not be."""

    wait_ms: int
    short: str  # "messages" or "text"


def refusal(said: int) -> Refusal | None:
    """What a take's result says: None when taken."""
    if said == 0:
        return None
    return Refusal(said, "messages") if said > 0 else Refusal(-said, "text")


class Admission:
    def __init__(self, bus: Bus, limits: RateLimits) -> None:
        self.bus, self.limits = bus, limits

    async def take_message(self, identity: str, *, size: int = 0) -> Refusal | None:
        """Count one message, of ``size`` bytes of text stored, against the identity's limits: None when
        taken, else which limit was short and for how long."""
        take = self.take_call(identity, size=size)
        # With the bus's writes, so messages arriving together share a round trip (EVAL: see bus/scripts.py).
        return refusal(take.read((await self.bus.batcher.run(take.add))[0]))

    def take_call(self, identity: str, messages: int = 1, *, size: int = 0) -> ScriptCall:
        """``take_message`` as a script to run (alone, or as the gate of what the message does next), reading
        as the script's signed result (``refusal`` reads it); what costs as much as several messages takes
        that many, at most a whole burst (none: ``messages=0``, for text alone), and more text than a day's
        takes a whole day's."""
        per_ms = self.limits.messages_per_minute / 60_000
        day = self.limits.text_bytes_per_day
        return ScriptCall(TAKE, (self.bus.keys.message_rate(identity), self.bus.keys.text_rate(identity)),
                          (self.limits.burst, per_ms, self.cost_of(messages) if messages else 0, day, day / DAY_MS,
                           min(max(0, size), day)), int)

    def cost_of(self, messages: int) -> int:
        """What taking ``messages`` costs: at most a whole burst, so a long fork waits for a full bucket
        rather than being refused for ever."""
        return max(1, min(messages, self.limits.burst))

    async def waiting(self) -> int:
        """Messages in the Brain inbox no Brain has read yet (counted up to the backlog limit)."""
        from bus.pool import unread  # here, not above: the pool's queries bring redis-py with them

        return await unread(self.bus, self.bus.keys.brain_inbox, BRAIN_GROUP, cap=self.limits.max_inbox_backlog)
