"""Session transcripts: an append-only list of entries per session, kept in Redis."""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

import msgpack
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bus.carry import Carried
from bus.codec import pack
from bus.errors import PincerError
from bus.identity import Keeping
from bus.keys import Keys
from bus.loops import ready
from bus.protocol import now_ms
from bus.scripts import ScriptCall, lua
from bus.store import RedisStore
from memory.log import MemoryLog, said
from memory.session_index import Caught, SessionIndex
from memory.transcript_cache import Held, TranscriptCache, held_bytes

if TYPE_CHECKING:
    from bus.batching import Batcher


class ForkRefused(PincerError):
    """A fork that cannot be made as asked: says why (``taken``: the new session's name is in use)."""

    def __init__(self, message: str, *, taken: bool = False) -> None:
        super().__init__(message)
        self.taken = taken


class Marks(BaseModel):
    """What an entry's metadata says of its turn: the protocol by which a Brain resumes a dead
    Brain's turn (where it was, what it cost, whether it ended). One home for writer and reader."""

    model_config = ConfigDict(extra="allow")  # tool entries add their result's facts

    message_id: str | None = None  # every entry of a turn carries its message's id
    iteration: int | None = None  # an assistant entry: which model call of the turn
    model: str = ""
    usage: dict[str, Any] = Field(default_factory=dict)  # tokens so far in the turn
    final: bool = False  # the turn's answer
    stopped: str | None = None  # the turn ended early with this error code ...
    told: str | None = None  # ... and the person was told this
    cancelled: bool = False  # a tool call (or the note) closed by a stop
    summary_until: int | None = None  # a compaction note: it stands for the session's entries before this index
    compaction: str | None = None  # ... and how it was made (by the model, or truncated and why)

    def metadata(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_defaults=True)


class TranscriptEntry(BaseModel):
    """One turn piece in OpenAI chat shape, plus when and where it happened."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    timestamp: int = Field(default_factory=now_ms)
    metadata: dict[str, Any] = Field(default_factory=dict)

    # Read once: an entry's metadata is written when it is made and never changed after, and a turn reads
    # every entry's. (A cached_property, not a private attribute: pydantic reads those through __getattr__.)
    @functools.cached_property
    def marks(self) -> Marks:
        """The metadata, typed (an entry with a malformed mark reads as unmarked)."""
        try:
            return Marks.model_validate(self.metadata)
        except ValidationError:
            return Marks()

    def to_llm(self) -> dict[str, Any]:
        """The entry as the LLM reads it: no timestamps or metadata. Made once and the same object after (its
        readers never change it; a transcript's entries are held from turn to turn), so a turn does not dump
        the whole history again, nor count or name it again (``Keeping``); made again if the entry was
        changed since (a tool result given its loop warning)."""
        made = self.__dict__.get("_llm")
        if made is not None and made[0] is self.content:
            return made[1]  # type: ignore[no-any-return]
        llm = Keeping(self.model_dump(include={"role", "content", "tool_calls", "tool_call_id", "name"},
                                      exclude_none=True))
        self.__dict__["_llm"] = (self.content, llm)  # as cached_property stores (pydantic compares fields only)
        return llm


# A session's first message makes its owner (``ARGV[1]``) the owner of record; later messages are
# numbered only when their sender (``ARGV[2]``) owns it, or is an operator. A transcript older than
# owners belongs to operators.
CLAIM_AND_NUMBER = lua("memory.sessions.claim_and_number", """
local owner = redis.call('get', KEYS[1])
if not owner then
  if redis.call('exists', KEYS[2]) == 1 then owner = '' else redis.call('set', KEYS[1], ARGV[1]); owner = ARGV[1] end
end
if owner ~= ARGV[2] and ARGV[3] ~= '1' then return -1 end
local seq = redis.call('incr', KEYS[3])
local ttl = tonumber(ARGV[4])
if ttl > 0 then
  for i = 1, 4 do if redis.call('exists', KEYS[i]) == 1 then redis.call('pexpire', KEYS[i], ttl) end end
end
return seq
""")


def _numbered(seq: Any) -> int | None:
    return None if int(seq) < 0 else int(seq)


# KEYS: the parent's owner, the child's owner. A sub-agent's session is its parent's owner's.
ADOPT = lua("memory.sessions.adopt", """
local owner = redis.call('get', KEYS[1])
if owner then redis.call('set', KEYS[2], owner, 'NX') end
return 1
""")


# KEYS: the session's about hash, its transcript. ARGV: "first" (a title if it has none) or "name" (a person's),
# the title. The hash lapses when the transcript does (a session that expires leaves nothing behind).
ABOUT = lua("memory.sessions.about", """
if ARGV[1] == 'name' then
  redis.call('HSET', KEYS[1], 'title', ARGV[2], 'named', '1')
else
  redis.call('HSETNX', KEYS[1], 'title', ARGV[2])
end
local left = redis.call('PTTL', KEYS[2])
if left > 0 then redis.call('PEXPIRE', KEYS[1], left) elseif left == -1 then redis.call('PERSIST', KEYS[1]) end
return 1
""")
TITLE_CHARS = 80
# KEYS: the transcript, the owner, the session's other keys. A session found without its transcript: 0, it
# has one after all (a message came); 1, it has an owner still (it is being made: the owner comes before
# the first message); 2, it lapsed, and what was left of it is deleted now.
LAPSED = lua("memory.sessions.lapsed", """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 1 end
redis.call('DEL', unpack(KEYS, 3))
return 2
""")


def stored_bytes(entries: list[TranscriptEntry]) -> int:
    """What the entries take as stored (UTF-8 JSON): what they count in an identity's text a day."""
    return sum(len(entry.model_dump_json().encode()) for entry in entries)


def title_of(text: str, *, most: int = TITLE_CHARS) -> str:
    """A title from a message: its first words on one line, at most ``most`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= most else line[:most - 1].rstrip() + "…"


def _parsed(raw: list[bytes]) -> list[TranscriptEntry]:
    return [TranscriptEntry.model_validate(msgpack.unpackb(item, raw=False)) for item in raw]


def session_keys(keys: Keys, session_id: str) -> list[str]:
    """Every key of a session but its transcript: what deleting it removes, and what lapses with it (one
    hash tag, so a script may take them all)."""
    return [keys.session_seq(session_id), keys.session_done(session_id), keys.session_owner(session_id),
            keys.session_events(session_id), keys.session_events_seq(session_id), keys.session_record(session_id),
            keys.session_record_parts(session_id), keys.session_about(session_id), keys.session_processes(session_id)]


class SessionStore:
    def __init__(self, redis: RedisStore, keys: Keys, *, cache_bytes: int = 0, batcher: Batcher | None = None) -> None:
        """``cache_bytes``: keep transcripts read, up to about that much memory, and read only what each
        gained since (memory/transcript_cache.py); 0 reads each whole every time. ``batcher``: numbering
        and appends go with the process's other writes (a Gateway's, a Brain's), awaited, so turns that
        write together share round trips."""
        self.redis, self.keys, self.batcher = redis, keys, batcher
        self.cache: TranscriptCache[TranscriptEntry] | None = TranscriptCache(cache_bytes) if cache_bytes else None
        self._claim = redis.register_script(CLAIM_AND_NUMBER)
        self._adopt = redis.register_script(ADOPT)
        self._about = redis.register_script(ABOUT)
        self.log = MemoryLog(redis, keys)
        self.index = SessionIndex(redis, keys)

    def append(self, session_id: str, *entries: TranscriptEntry) -> Awaitable[object]:
        """Add entries to the transcript: kept once what this returns is awaited. With a batcher they are
        queued at once, in order with the process's other writes, so a caller may read meanwhile."""
        if not entries:
            return ready()
        packed = [pack(e.model_dump(mode="json", exclude_none=True)) for e in entries]
        findable = [f for n, e in enumerate(entries)
                    if (f := said(session_id, e.role, e.content, e.timestamp, f"{e.timestamp}-{n}",
                                  str(e.metadata.get("message_id") or ""))) is not None]
        asked = next((e.content for e in entries if e.role == "user" and e.content), None)

        def build(pipe: Any) -> None:
            pipe.rpush(self.keys.transcript(session_id), *packed)
            self.index.touch(pipe, session_id, time.time())
            if asked is not None:  # titled by its first message, until someone names it
                ScriptCall(ABOUT, (self.keys.session_about(session_id), self.keys.transcript(session_id)),
                           ("first", title_of(asked))).add(pipe)
            for fields in findable:  # memory search finds it (memory/recall.py), in the same round trip
                self.log.said(pipe, session_id, fields)

        if self.batcher is not None:
            return self.batcher.queue(build)
        return self._pooled(build)

    async def _pooled(self, build: Callable[[Any], None]) -> None:
        # Not a transaction: the keys live in different cluster slots; the index is a hint.
        async with self.redis.pipeline(transaction=False) as pipe:
            build(pipe)
            await pipe.execute()

    async def next_seq(self, session_id: str) -> int:
        """Number the session's next message (1, 2, ...): the order its Brains keep."""
        return int(await self.redis.incr(self.keys.session_seq(session_id)))

    async def claim_and_number(self, session_id: str, sender: str, *, owner: str | None = None,
                               operator: bool = False, ttl_s: int = 0) -> int | None:
        """Number the sender's next message in the session, making ``owner`` (the sender unless
        said) its owner if it is new; None when the session belongs to someone else. ``ttl_s``: the
        session expires that long after its last message."""
        claim = self.claim_call(session_id, sender, owner=owner, operator=operator, ttl_s=ttl_s)
        if self.batcher is not None:  # EVAL: a pipeline would first ask SCRIPT EXISTS (bus/scripts.py)
            return claim.read((await self.batcher.run(claim.add))[0])  # type: ignore[no-any-return]
        return claim.read(await self._claim(keys=list(claim.keys), args=list(claim.args)))  # type: ignore[no-any-return]

    def claim_call(self, session_id: str, sender: str, *, owner: str | None = None, operator: bool = False,
                   ttl_s: int = 0) -> ScriptCall:
        """``claim_and_number`` as a script to run (after a gate, say): it reads as the number or None."""
        keys = (self.keys.session_owner(session_id), self.keys.transcript(session_id),
                self.keys.session_seq(session_id), self.keys.session_done(session_id))
        return ScriptCall(CLAIM_AND_NUMBER, keys, (owner or sender, sender, "1" if operator else "0", ttl_s * 1000),
                          _numbered)

    async def adopt(self, session_id: str, *, like: str) -> None:
        """Give a session the owner of another (a sub-agent's, its parent's): the same people may read it."""
        await self._adopt(keys=[self.keys.session_owner(like), self.keys.session_owner(session_id)])

    async def follow_expiry(self, session_id: str, *, like: str) -> None:
        """A session that lapses takes its sub-agents' sessions with it."""
        left_ms = await self.redis.pttl(self.keys.transcript(like))
        if left_ms > 0:
            await self.expire(session_id, max(1, left_ms // 1000))

    async def owner(self, session_id: str) -> str | None:
        """Who owns the session: a token name, "" for one from before owners, None when there is none."""
        return (await self.ownership(session_id))[0]

    async def ownership(self, session_id: str) -> tuple[str | None, bool]:
        """The session's owner (as ``owner`` says it) and whether it has a transcript yet: one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.session_owner(session_id))
            pipe.exists(self.keys.transcript(session_id))
            owner, exists = await pipe.execute()
        if owner is not None:
            return owner.decode(), bool(exists)
        return ("" if exists else None), bool(exists)

    async def expire(self, session_id: str, ttl_s: int) -> None:
        """Let every key of the session lapse ``ttl_s`` from now (a session a client did not name), its
        event log too."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in (self.keys.transcript(session_id), *session_keys(self.keys, session_id)):
                pipe.expire(key, ttl_s)
            await pipe.execute()

    async def load(self, session_id: str) -> list[TranscriptEntry]:
        read = self.reading(session_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            read.build(pipe)
            got = await pipe.execute()
        entries = read.read(got)
        if entries is None:  # the list is not what this process held: read it whole
            entries = self._whole(session_id, await self.redis.lrange(self.keys.transcript(session_id), 0, -1))
        return entries

    def reading(self, session_id: str) -> Carried[list[TranscriptEntry] | None]:
        """The transcript's read as pipeline commands, for a caller that sends them with its own (the Brain,
        with the session's lease). Held from an earlier read: is it still the list's head, and what came
        after it; else the whole list. Reads as None when the list moved under what was held (read it whole)."""
        key = self.keys.transcript(session_id)
        held = self.cache.get(session_id) if self.cache is not None else None
        if held is None:
            return Carried(lambda pipe: pipe.lrange(key, 0, -1), 1, lambda got: self._whole(session_id, got[0]))
        count = len(held.entries)

        def build(pipe: Any) -> None:
            pipe.lindex(key, 0)
            pipe.lindex(key, count - 1)
            pipe.lrange(key, count, -1)

        def entries(got: list[Any]) -> list[TranscriptEntry] | None:
            first, last, added = got
            if first != held.first or last != held.last:
                return None
            found = [*held.entries, *_parsed(added)]
            if added:
                self._hold(session_id, found, held.first, added[-1], held.size + held_bytes(added))
            return found

        return Carried(build, 3, entries)

    def _whole(self, session_id: str, raw: list[bytes]) -> list[TranscriptEntry]:
        entries = _parsed(raw)
        if self.cache is not None:
            if raw:
                self._hold(session_id, entries, raw[0], raw[-1], held_bytes(raw))
            else:
                self.cache.drop(session_id)
        return entries

    def _hold(self, session_id: str, entries: list[TranscriptEntry], first: bytes, last: bytes, size: int) -> None:
        assert self.cache is not None
        self.cache.put(session_id, Held(tuple(entries), first, last, size))

    async def exists(self, session_id: str) -> bool:
        return bool(await self.redis.exists(self.keys.transcript(session_id)))

    async def list_sessions(self, *, owner: str | None = None) -> list[str]:
        """Sessions newest first; only ``owner``'s when given. Ids whose transcript lapsed are dropped."""
        ids = await self.index.newest(owner)
        async with self.redis.pipeline(transaction=False) as pipe:
            for session_id in ids:
                pipe.exists(self.keys.transcript(session_id))
                pipe.get(self.keys.session_owner(session_id))
            found = await pipe.execute()
        gone = [i for n, i in enumerate(ids) if not found[2 * n]]
        await self.drop_lapsed(gone)
        return [i for n, i in enumerate(ids) if found[2 * n]
                and (owner is None or (found[2 * n + 1] or b"").decode() == owner)]

    async def about(self, session_ids: list[str]) -> list[dict[str, Any]]:
        """Each session as a list shows it: its title, when it last changed, its messages and its spend."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for session_id in session_ids:
                pipe.hgetall(self.keys.session_about(session_id))
                pipe.get(self.keys.session_seq(session_id))
                pipe.zscore(self.keys.sessions, session_id)
            found = await pipe.execute()
        shown = []
        for n, session_id in enumerate(session_ids):
            about, seq, updated = found[3 * n], found[3 * n + 1], found[3 * n + 2]
            shown.append({"id": session_id, "title": (about.get(b"title") or b"").decode(),
                          "named": about.get(b"named") == b"1", "messages": int(seq or 0),
                          "updated_at": round(float(updated or 0), 3),
                          "spend_usd": int(about.get(b"spend_micro") or 0) / 1_000_000})
        return shown

    async def rename(self, session_id: str, title: str) -> None:
        """A title a person chose, kept over the first message's."""
        await self._about(keys=[self.keys.session_about(session_id), self.keys.transcript(session_id)],
                          args=["name", title])

    def count_spend(self, session_id: str, micro: int) -> Callable[[Any], object]:
        """Commands adding ``micro`` micro-dollars to the session's spend (for the bus's batcher)."""
        key = self.keys.session_about(session_id)
        return lambda pipe: pipe.hincrby(key, "spend_micro", micro)

    async def fork(self, source: str, target: str, *, at: int,
                   charge: Callable[[int], Awaitable[object]] | None = None) -> list[TranscriptEntry]:
        """A new session holding ``source``'s first ``at`` messages and everything that answered them, owned
        as ``source`` is; the entries copied. ``ForkRefused`` when ``at`` is out of range or ``target`` exists.
        ``charge`` is told the bytes about to be copied, before anything is written (it may refuse)."""
        entries = await self.load(source)
        starts = [n for n, entry in enumerate(entries) if entry.role == "user"]
        if not 1 <= at <= len(starts):
            raise ForkRefused(f"the session has messages 1 to {len(starts)}; fork at one of them" if starts
                              else "the session has no messages to fork from")
        if await self.exists(target):
            raise ForkRefused("a session of that name exists already: choose another name", taken=True)
        kept = entries[:starts[at] if at < len(starts) else len(entries)]
        if charge is not None:
            await charge(stored_bytes(kept))
        owner = await self.redis.get(self.keys.session_owner(source))
        if owner is not None:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.set(self.keys.session_owner(target), owner, nx=True)
                await pipe.execute()
        title = await self.redis.hget(self.keys.session_about(source), "title")
        await self.append(target, *kept)
        if title:
            suffix = f" (from message {at})"
            await self.rename(target, title_of(title.decode(), most=TITLE_CHARS - len(suffix)) + suffix)
        return kept

    async def delete(self, session_id: str) -> None:
        """The session's transcript, events, flight record and state, and its words in the memory log."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.delete(self.keys.transcript(session_id), *session_keys(self.keys, session_id))
            self.index.forget(pipe, session_id)
            self.log.forgotten(pipe, session_id)  # its words leave the memory log and every worker's index
            await pipe.execute()

    async def drop_lapsed(self, session_ids: list[str]) -> int:
        """Sessions found without a transcript taken off the lists; those that lapsed (no owner either)
        also lose what was left of them: their state, events, record and words in the memory log. One that
        is being made again meanwhile keeps all it has. How many were deleted."""
        if not session_ids:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for session_id in session_ids:
                owner = self.keys.session_owner(session_id)
                rest = [k for k in session_keys(self.keys, session_id) if k != owner]
                ScriptCall(LAPSED, (self.keys.transcript(session_id), owner, *rest), ()).add(pipe)
            found = await pipe.execute()
        lapsed = [s for s, state in zip(session_ids, found, strict=True) if int(state) == 2]
        async with self.redis.pipeline(transaction=False) as pipe:
            self.index.forget(pipe, *[s for s, state in zip(session_ids, found, strict=True) if int(state)])
            for session_id in lapsed:
                self.log.forgotten(pipe, session_id)  # its words leave the memory log and every worker's index
            await pipe.execute()
        return len(lapsed)

    async def catch_up(self) -> Caught:
        """The owners' lists brought up to the pool's, and what lapsed deleted (``SessionIndex.catch_up``)."""
        return await self.index.catch_up(drop=self.drop_lapsed)
