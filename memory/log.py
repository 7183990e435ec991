"""The memory log's writes: what memory search finds, added to ``memory:log``, and its earlier copies removed.

Every findable thing (a note's content, a person's message, the agent's words) is an
entry of one stream that each Hands worker indexes (``memory/recall.py``). A note's
new version or its deletion, and a session's deletion, remove the entries they make
stale from the stream in the same script that writes the new entry: the log keeps
one copy of a note (its latest) and none of a deleted note or session, so a worker
started later never indexes them again. Workers already running read the ``drop`` or
``forget`` entry and forget the text from their index.

Which entries to remove is kept beside the log, in its cluster slot: a note's live
entry id (``memory_log_notes``) and a session's entry ids (``memory_log_session``).
"""

from __future__ import annotations

import time

from redis.asyncio.client import Pipeline

from bus.keys import Keys
from bus.scripts import ScriptCall, lua
from bus.store import RedisStore
from memory.session_ids import owner_in

Fields = dict[str, str]

# KEYS: the log, the notes' live entries. ARGV: the note's ref, "put" or "drop", then the entry's fields.
# The note's earlier entry leaves the log as its new one (or its drop) arrives.
NOTE = lua("memory.log.note", """
local old = redis.call('hget', KEYS[2], ARGV[1])
local id = redis.call('xadd', KEYS[1], '*', unpack(ARGV, 3))
if old then redis.call('xdel', KEYS[1], old) end
if ARGV[2] == 'put' then redis.call('hset', KEYS[2], ARGV[1], id) else redis.call('hdel', KEYS[2], ARGV[1]) end
return id
""")

# KEYS: the log, the session's entries. ARGV: the entry's fields. The session's ids the log no longer holds
# (trimmed after hands.recall.log_keep_s) leave its list from the head, looked for at every 32nd entry (the
# look reads the log's first entry: ~15 µs of Redis each time, measured), up to 64 at a time, so a session
# spoken in for months keeps about a day's ids, not every one it ever had.
SAID = lua("memory.log.said", """
local id = redis.call('xadd', KEYS[1], '*', unpack(ARGV))
local length = redis.call('rpush', KEYS[2], id)
if length % 32 ~= 0 then return id end
local first = redis.call('xrange', KEYS[1], '-', '+', 'COUNT', 1)[1]
if not first then return id end
local fms, fseq = string.match(first[1], '^(%d+)-(%d+)$')
fms, fseq = tonumber(fms), tonumber(fseq)
for _ = 1, 64 do
  local head = redis.call('lindex', KEYS[2], 0)
  local hms, hseq = string.match(head or '', '^(%d+)-(%d+)$')
  if not hms then break end
  hms, hseq = tonumber(hms), tonumber(hseq)
  if hms > fms or (hms == fms and hseq >= fseq) then break end
  redis.call('lpop', KEYS[2])
end
return id
""")

# KEYS: the log, the session's entries. ARGV: the forget entry's fields. Every entry of the session leaves
# the log (in slices: Lua's unpack has a limit), then the forget entry tells running workers.
FORGET = lua("memory.log.forget", """
local ids = redis.call('lrange', KEYS[2], 0, -1)
for i = 1, #ids, 1000 do redis.call('xdel', KEYS[1], unpack(ids, i, math.min(i + 999, #ids))) end
redis.call('del', KEYS[2])
return redis.call('xadd', KEYS[1], '*', unpack(ARGV))
""")


def note_ref(agent_id: str, owner: str, key: str) -> str:
    return f"note:{agent_id}/{owner}/{key}"


def note_written(agent_id: str, owner: str, key: str, content: str) -> Fields:
    """The log entry of a note's new content (it replaces the note's earlier one in the index)."""
    return {"op": "put", "kind": "note", "ref": note_ref(agent_id, owner, key), "owner": owner, "agent": agent_id,
            "place": key, "at": str(int(time.time() * 1000)), "text": content}


def note_deleted(agent_id: str, owner: str, key: str) -> Fields:
    return {"op": "drop", "ref": note_ref(agent_id, owner, key)}


def said(session_id: str, role: str, content: str | None, at: int, index: str, turn: str = "") -> Fields | None:
    """The log entry of words said in a session, in turn ``turn`` (a message id). None for what is not
    findable: no text, or a session without an owner, which only raw bus clients make."""
    owner = owner_in(session_id)
    if not owner or not content or not content.strip() or role not in ("user", "assistant"):
        return None
    return {"op": "put", "kind": "conversation", "ref": f"turn:{session_id}:{index}", "owner": owner, "agent": "",
            "place": session_id, "role": role, "at": str(at), "turn": turn, "text": content}


def session_forgotten(session_id: str) -> Fields:
    return {"op": "forget", "place": session_id}


def _flat(fields: Fields) -> tuple[str, ...]:
    return tuple(part for pair in fields.items() for part in pair)


class MemoryLog:
    """Queues the log's writes on a caller's pipeline (they ride with the write they index), or runs one.

    Queued as EVAL, the script's text with it: a registered script on a pipeline costs a SCRIPT EXISTS
    round trip before every execute (redis-py checks each time), and Redis keeps the compiled script
    by its digest either way."""

    def __init__(self, redis: RedisStore, keys: Keys) -> None:
        self.redis, self.keys = redis, keys

    def note_written(self, pipe: Pipeline, agent_id: str, owner: str, key: str, content: str) -> None:
        self._note_entry(pipe, note_written(agent_id, owner, key, content), "put")

    def note_deleted(self, pipe: Pipeline, agent_id: str, owner: str, key: str) -> None:
        self._note_entry(pipe, note_deleted(agent_id, owner, key), "drop")

    def said(self, pipe: Pipeline, session_id: str, fields: Fields) -> None:
        ScriptCall(SAID, (self.keys.memory_log, self.keys.memory_log_session(session_id)), _flat(fields)).add(pipe)

    def forgotten(self, pipe: Pipeline, session_id: str) -> None:
        ScriptCall(FORGET, (self.keys.memory_log, self.keys.memory_log_session(session_id)),
                   _flat(session_forgotten(session_id))).add(pipe)

    async def forget(self, *sessions: str) -> None:
        """Remove these sessions' words from the log (sessions found lapsed)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for session_id in sessions:
                self.forgotten(pipe, session_id)
            await pipe.execute()

    def _note_entry(self, pipe: Pipeline, fields: Fields, op: str) -> None:
        ScriptCall(NOTE, (self.keys.memory_log, self.keys.memory_log_notes),
                   (fields["ref"], op, *_flat(fields))).add(pipe)
