"""The pool's backlog: calls no worker can start yet wait in Redis, a turn per session, in lanes.

A call's lane is its narrowest gate (``tool:<name>`` for a tool with its own
limit, else ``category:<key>``; the gates are ``hands/limits.py``'s). A
worker reads ``hands:requests`` freely and starts what it has room for at
once; a call it has no room for is *parked* in its lane, in one script that
also acknowledges it, so it is always in exactly one place in Redis:

- each session has a queue in the lane, and the sessions with calls waiting
  take turns (a rotation list): a session with a thousand calls queued puts
  one at a time in front of everyone else's;
- the lane's stream holds the calls ready to start, at most the pool's
  capacity for the lane; it is read by group ``hands`` only by workers with
  room in the lane, so whichever worker frees a slot first takes the next
  call, and a lane that is full never holds up another;
- whenever a call leaves the lane's stream, the queues feed it again.

``QUEUE_FULL`` is answered when the lane already holds its bound
(``hands.queue.pool_depth``, else ``hands.queue.depth`` per live worker);
``QUEUE_TIMEOUT`` when a call has waited longer than ``hands.queue.wait_s``
since it reached the pool: the worker whose turn it is (``backlog_turn``)
moves such calls back to ``hands:requests``, where any worker answers them.
All of a lane's keys share its hash tag; the scripts name its queues from
the tag, so one lane lives in one cluster slot (docs/capacity.md). This
module is the Redis side; the worker's (room, parking, upkeep) is
``hands/lanes.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from bus.codec import pack
from bus.keys import HANDS_GROUP
from bus.protocol import now_ms
from bus.scripts import ScriptCall, lua
from bus.streams import Bus
from hands.config import QueueSettings

log = logging.getLogger("hands.backlog")

QUEUED_FIELD = b"queued"  # when the call reached the pool (ms), carried by its copies in the lanes

# Shared by the scripts: how many calls of a lane's stream the group has not been given yet, and
# moving calls from the sessions' queues to the stream, one session at a time, up to ``cap``.
_LANE_LUA = """
local function group_of(stream, group)
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local f = {}
    for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
    if f['name'] == group then return f end
  end
  return nil
end

local function queued_of(fields)
  for j = 1, #fields, 2 do
    if fields[j] == 'queued' then return tonumber(fields[j + 1]) end
  end
  return nil
end

local function unread_entries(stream, group, count)
  local f = group_of(stream, group)
  return redis.call('XRANGE', stream, f and ('(' .. f['last-delivered-id']) or '-', '+', 'COUNT', count)
end

local function unread(stream, group)
  if redis.call('EXISTS', stream) == 0 then return 0 end
  local f = group_of(stream, group)
  if not f then return redis.call('XLEN', stream) end
  if f['lag'] then return f['lag'] end
  return #redis.call('XRANGE', stream, '(' .. f['last-delivered-id'], '+')
end

local function feed(base, group, cap)
  local rotation, waiting = base .. ':rotation', base .. ':waiting'
  local room, moved = cap - unread(base, group), 0
  while moved < room do
    local session = redis.call('LPOP', rotation)
    if not session then break end
    local queue = base .. ':session:' .. session
    local packed = redis.call('LPOP', queue)
    if packed then
      redis.call('XADD', base, '*', unpack(cmsgpack.unpack(packed), 2))
      moved = moved + 1
    end
    if redis.call('LLEN', queue) > 0 then redis.call('RPUSH', rotation, session) end
  end
  if redis.call('LLEN', rotation) == 0 then
    redis.call('DEL', waiting)
  elseif moved > 0 then
    redis.call('DECRBY', waiting, moved)
  end
  return moved
end
"""

# KEYS: the stream the call was read from (hands:requests; the lane's own when given back), the lane's
# stream (its queues and counters are named from it, under its hash tag). ARGV: group, session, entry id,
# cap, bound, packed call, 'front' to put it first in its session's queue.
# Returns the calls the lane holds with this one, or -(what it holds) when it is full (nothing done).
PARK = lua("hands.backlog.park", _LANE_LUA + """
local group, base, session = ARGV[1], KEYS[2], ARGV[2]
local held = unread(base, group) + tonumber(redis.call('GET', base .. ':waiting') or '0')
if held >= tonumber(ARGV[5]) then return -held end
local queue = base .. ':session:' .. session
if redis.call(ARGV[7] == 'front' and 'LPUSH' or 'RPUSH', queue, ARGV[6]) == 1 then
  redis.call('RPUSH', base .. ':rotation', session)
end
redis.call('INCR', base .. ':waiting')
feed(base, group, tonumber(ARGV[4]))
redis.call('XACK', KEYS[1], group, ARGV[3])
return held + 1
""")

# KEYS: the lane's stream. ARGV: group, cap. Returns how many calls moved to the lane's stream.
FEED = lua("hands.backlog.feed", _LANE_LUA + """
return feed(KEYS[1], ARGV[1], tonumber(ARGV[2]))
""")

# KEYS: hands:requests, the lane's stream. ARGV: group, cap, cutoff ms (0: expire nothing), most to expire.
# Feeds the lane, moves calls queued before the cutoff to hands:requests (their answer: QUEUE_TIMEOUT),
# and returns {unread in the stream, waiting in queues, oldest arrival ms or 0, expired}.
KEEP = lua("hands.backlog.keep", _LANE_LUA + """
local group, base, cutoff, most = ARGV[1], KEYS[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local rotation, waiting = base .. ':rotation', base .. ':waiting'
local expired, oldest = 0, 0
for _, session in ipairs(redis.call('LRANGE', rotation, 0, -1)) do
  local queue = base .. ':session:' .. session
  while expired < most do
    local head = redis.call('LINDEX', queue, 0)
    if not head then break end
    local call = cmsgpack.unpack(head)
    if call[1] >= cutoff then break end
    redis.call('LPOP', queue)
    redis.call('XADD', KEYS[1], '*', unpack(call, 2))
    expired = expired + 1
  end
  if redis.call('LLEN', queue) == 0 then redis.call('LREM', rotation, 0, session) end
end
if expired > 0 then redis.call('DECRBY', waiting, expired) end
if cutoff > 0 and redis.call('EXISTS', base) == 1 then
  for _, entry in ipairs(unread_entries(base, group, most)) do
    local queued = queued_of(entry[2])
    if queued and queued < cutoff then
      redis.call('XDEL', base, entry[1])
      redis.call('XADD', KEYS[1], '*', unpack(entry[2]))
      expired = expired + 1
    end
  end
end
feed(base, group, tonumber(ARGV[2]))
for _, session in ipairs(redis.call('LRANGE', rotation, 0, -1)) do
  local head = redis.call('LINDEX', base .. ':session:' .. session, 0)
  if head then
    local queued = cmsgpack.unpack(head)[1]
    if oldest == 0 or queued < oldest then oldest = queued end
  end
end
local ready = unread(base, group)
if ready > 0 then
  for _, entry in ipairs(unread_entries(base, group, ready)) do
    local queued = queued_of(entry[2])
    if queued and (oldest == 0 or queued < oldest) then oldest = queued end
  end
end
return {ready, tonumber(redis.call('GET', waiting) or '0'), oldest, expired}
""")


def queued_ms(entry_id: str, fields: dict[bytes, bytes]) -> int:
    """When a call reached the pool: its ``queued`` field once parked, else its entry id's time."""
    queued = fields.get(QUEUED_FIELD)
    return int(queued) if queued is not None else int(entry_id.partition("-")[0])


@dataclass(frozen=True)
class LaneState:
    ready: int  # in the lane's stream, not yet given to a worker
    waiting: int  # in the sessions' queues behind it
    oldest_ms: int  # when the longest-waiting call reached the pool (0: none)


class Backlog:
    """The Redis side of the lanes: park a call, feed a lane, keep (expire, measure) the lanes."""

    def __init__(self, bus: Bus, queue: QueueSettings, *, group: str = HANDS_GROUP) -> None:
        self.bus, self.queue, self.group = bus, queue, group
        self._feeding: dict[str, int] = {}  # lane -> cap, fed at the end of this loop turn
        self._keep = bus.redis.register_script(KEEP)

    def stream(self, lane: str) -> str:
        return self.bus.keys.hands_lane(lane)

    async def park(self, lane: str, session: str, entry_id: str, fields: dict[bytes, bytes], *,
                   cap: int, bound: int, given_back: bool = False) -> int:
        """Put a call read from ``hands:requests`` in its lane and acknowledge it, in one script.
        Returns how many calls the lane holds with it; negative (minus what it holds) when full.
        ``given_back``: a call read from the lane's own stream that this worker cannot start after
        all goes back first in its session's queue."""
        queued = queued_ms(entry_id, fields)
        flat: list[bytes | int] = [queued]
        for name, value in fields.items():
            if name != QUEUED_FIELD:
                flat += [name, value]
        flat += [QUEUED_FIELD, str(queued).encode()]
        packed = pack(flat, bin_type=False)  # Redis' cmsgpack reads no bin type: raw strings
        base = self.stream(lane)
        source = base if given_back else self.bus.keys.hands_requests
        results = await self.bus.batcher.run(ScriptCall(
            PARK, (source, base), (self.group, session, entry_id, cap, bound, packed,
                                   "front" if given_back else "back")).add)
        return int(results[0])

    def feed_soon(self, lane: str, cap: int) -> None:
        """Refill a lane's stream from its queues, once for every call of this loop turn that left it."""
        if not self._feeding:
            asyncio.get_running_loop().call_soon(self._feed)
        self._feeding[lane] = cap

    def _feed(self) -> None:
        lanes, self._feeding = self._feeding, {}
        for lane, cap in lanes.items():
            self.bus.batcher.send(ScriptCall(FEED, (self.stream(lane),), (self.group, cap)).add)

    async def keep(self, lane: str, *, cap: int, expire: bool) -> LaneState:
        """Feed the lane, expire what waited past ``hands.queue.wait_s`` (when ``expire``), and say
        what it holds."""
        cutoff = now_ms() - int(self.queue.wait_s * 1000) if expire else 0
        ready, waiting, oldest, expired = await self._keep(
            keys=[self.bus.keys.hands_requests, self.stream(lane)], args=[self.group, cap, cutoff, 1000])
        if expired:
            log.warning("%d call%s waited in lane %s past hands.queue.wait_s (%gs); answering QUEUE_TIMEOUT",
                        expired, "" if expired == 1 else "s", lane, self.queue.wait_s)
        return LaneState(int(ready), int(waiting), int(oldest))

    async def lanes(self, own: Iterable[str]) -> list[str]:
        """Every lane of the pool: this worker's (registered) and those other workers registered."""
        own = list(own)
        if own:
            await self.bus.redis.sadd(self.bus.keys.hands_lanes, *own)
        members: set[bytes] = await self.bus.redis.smembers(self.bus.keys.hands_lanes)  # type: ignore[assignment]  # bytes: the bus never decodes
        return sorted(member.decode() for member in members)


def describe(states: dict[str, LaneState], now: int) -> dict[str, dict[str, float]]:
    """The backlog as `pincer status` shows it: calls held and the oldest one's age, per lane."""
    return {lane: {"ready": s.ready, "waiting": s.waiting,
                   "oldest_s": round(max(0, now - s.oldest_ms) / 1000, 1) if s.oldest_ms else 0.0}
            for lane, s in states.items() if s.ready or s.waiting}

