"""Session transcripts: an append-only list of entries per session, kept in Redis."""

from __future__ import annotations

import time
from typing import Any, Literal

import msgpack
from pydantic import BaseModel, ConfigDict, Field

from bus.keys import Keys
from bus.protocol import now_ms


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

    def to_llm(self) -> dict[str, Any]:
        """The entry as the LLM reads it: no timestamps or metadata."""
        return self.model_dump(include={"role", "content", "tool_calls", "tool_call_id", "name"}, exclude_none=True)


class SessionStore:
    def __init__(self, redis: Any, keys: Keys) -> None:
        self.redis, self.keys = redis, keys

    async def append(self, session_id: str, *entries: TranscriptEntry) -> None:
        if not entries:
            return
        packed = [msgpack.packb(e.model_dump(mode="json", exclude_none=True), use_bin_type=True) for e in entries]
        # Not a transaction: the keys live in different cluster slots; the index is a hint.
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.rpush(self.keys.transcript(session_id), *packed)
            pipe.zadd(self.keys.sessions, {session_id: time.time()})
            await pipe.execute()

    async def next_seq(self, session_id: str) -> int:
        """Number the session's next message (1, 2, ...): the order its Brains keep."""
        return int(await self.redis.incr(self.keys.session_seq(session_id)))

    async def load(self, session_id: str) -> list[TranscriptEntry]:
        raw = await self.redis.lrange(self.keys.transcript(session_id), 0, -1)
        return [TranscriptEntry.model_validate(msgpack.unpackb(item, raw=False)) for item in raw]

    async def exists(self, session_id: str) -> bool:
        return bool(await self.redis.exists(self.keys.transcript(session_id)))

    async def list_sessions(self) -> list[str]:
        return [s.decode() for s in await self.redis.zrevrange(self.keys.sessions, 0, -1)]

    async def delete(self, session_id: str) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.delete(self.keys.transcript(session_id), self.keys.session_seq(session_id),
                        self.keys.session_done(session_id))
            pipe.zrem(self.keys.sessions, session_id)
            await pipe.execute()
