"""A session's live events: one ordered, capped log per session in Redis, any Gateway serves it.

The Gateway that runs a turn sees every event of it (the Brain's deltas and
tool events, Hands' approval requests, the end) and appends each one here
as it passes; SSE and WebSocket clients of any Gateway read the log from the
id they last saw, so a reconnect gets exactly what it missed. A client that
falls behind the cap is told to resync (reload the transcript) instead of
being sent a log with a hole in it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bus.log import kv
from bus.outcome import log_failure
from bus.protocol import (
    ApprovalDecision,
    ApprovalRequest,
    ChatDelta,
    ChatError,
    ChatMessage,
    ChatReply,
    ChatTool,
    ErrorCode,
    Message,
    QuestionAnswer,
    QuestionRequest,
)
from bus.scripts import ScriptCall, lua
from bus.streams import Bus
from bus.text import text

# The event types a client sees, in order within a turn: message, then deltas, tool events and
# approvals and questions as they happen, then exactly one of reply, error or cancelled.
KINDS = ("message", "delta", "tool", "approval", "approval_decided", "question", "question_answered", "reply",
         "error", "cancelled")


@dataclass(frozen=True)
class Event:
    id: str
    kind: str
    data: dict[str, Any]

    def sse(self) -> dict[str, str]:
        return {"id": self.id, "event": self.kind, "data": json.dumps(self.data, ensure_ascii=False)}

    def frame(self) -> dict[str, Any]:
        return {"type": "event", "id": self.id, "event": self.kind, **self.data}


@dataclass(frozen=True)
class Resync:
    """The log no longer holds what follows the client's last id: reload the transcript, then follow from ``now``."""

    now: str

    def sse(self) -> dict[str, str]:
        return {"event": "resync", "data": json.dumps({"after": self.now})}


def describe(message: Message) -> tuple[str, dict[str, Any]] | None:
    """A bus message of a turn as a client event, or None for what clients are not shown."""
    match message:
        case ChatMessage():
            return "message", {"message_id": message.message_id, "sender": message.sender, "text": message.text,
                               "agent_id": message.agent_id, "seq": message.seq}
        case ChatDelta():
            return "delta", {"message_id": message.message_id, "text": message.text}
        case ChatTool():
            extra = {k: v for k, v in (("arguments", message.arguments), ("error_code", message.error_code),
                                       ("duration_ms", message.duration_ms), ("sandbox", message.sandbox),
                                       ("parent_call_id", message.parent_call_id), ("answer", message.answer))
                     if v is not None}
            return "tool", {"message_id": message.message_id, "call_id": message.call_id, "tool": message.tool,
                            "status": message.status, "summary": message.summary, **extra}
        case ApprovalRequest():
            return "approval", {"message_id": message.message_id, "approval_id": message.approval_id,
                                "call_id": message.call_id, "tool": message.tool, "summary": message.summary,
                                "expires_at": message.expires_at, "always_allowed": message.always_allowed}
        case ApprovalDecision():
            return "approval_decided", {"approval_id": message.approval_id, "decision": message.decision,
                                        "by": message.by}
        case QuestionRequest():
            return "question", {"message_id": message.message_id, "question_id": message.question_id,
                                "call_id": message.call_id, "expires_at": message.expires_at,
                                "questions": [q.model_dump() for q in message.questions]}
        case QuestionAnswer():
            return "question_answered", {"question_id": message.question_id, "answers": message.answers,
                                         "by": message.by}
        case ChatReply():
            return "reply", {"message_id": message.message_id, "text": message.text, "model": message.model,
                             "usage": message.usage}
        case ChatError():
            kind = "cancelled" if message.code is ErrorCode.CANCELLED else "error"
            return kind, {"message_id": message.message_id, "code": message.code.value, "message": message.message}
    return None


# Event n of a session gets the id "n-0": consecutive, so whether anything between a client's last
# id and the oldest kept was trimmed is plain arithmetic (Redis records no trimmed ids).
# The log lives keep_s past its last event, but never longer than its session's transcript when that
# is set to lapse (a session a client did not name): the log goes with the session it tells of.
APPEND = lua("gateway.turns.events.append", """
local n = redis.call('INCR', KEYS[2])
local id = redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[1], n .. '-0', 'k', ARGV[2], 'd', ARGV[3])
local life = tonumber(ARGV[4])
local left = redis.call('PTTL', KEYS[3])
if left > 0 and left < life then life = left end
redis.call('PEXPIRE', KEYS[1], life)
redis.call('PEXPIRE', KEYS[2], life)
return id
""")


class SessionEvents:
    def __init__(self, bus: Bus, *, keep: int, keep_s: float) -> None:
        self.bus, self.keep, self.keep_ms = bus, keep, int(keep_s * 1000)

    async def append(self, session_id: str, message: Message) -> str | None:
        """The event in the log (with the bus's writes, so the events of the turns in flight share round
        trips); its id, or None for a message the log does not keep."""
        build = self._build(session_id, message)
        if build is None:
            return None
        added = (await self.bus.batcher.run(build))[0]
        return text(added)

    def send(self, session_id: str, message: Message) -> None:
        """The event queued for the log with the bus's next write, not waited for: it keeps its place
        among the writes before and after it; a failure is logged (live followers miss the event)."""
        build = self._build(session_id, message)
        if build is not None:
            self.bus.batcher.send(
                build, done=lambda outcome: log_failure(outcome, f"session event {kv(session=session_id)}"))

    def _build(self, session_id: str, message: Message) -> Callable[[Any], object] | None:
        described = describe(message)
        if described is None:
            return None
        kind, data = described
        payload = json.dumps({**data, "ts": int(time.time() * 1000)}, ensure_ascii=False)
        keys = (self.bus.keys.session_events(session_id), self.bus.keys.session_events_seq(session_id),
                self.bus.keys.transcript(session_id))
        return ScriptCall(APPEND, keys, (self.keep, kind, payload, self.keep_ms)).add

    async def last_id(self, session_id: str) -> str:
        """The id of the session's newest event ("0-0" when it has none): follow from here for new ones only."""
        newest: Any = await self.bus.redis.xrevrange(self.bus.keys.session_events(session_id), count=1)
        return newest[0][0].decode() if newest else "0-0"

    async def read(self, session_id: str, after: str, *, block_ms: int, count: int = 100) -> list[Event] | Resync:
        """Events after ``after`` (waiting up to ``block_ms`` for one), or ``Resync`` when some are gone."""
        key = self.bus.keys.session_events(session_id)
        if after != "0-0" and await self._trimmed_past(key, after):
            return Resync(await self.last_id(session_id))
        found: Any = await self.bus.redis.xread({key: after}, count=count, block=block_ms or None)
        events = []
        for _, entries in found or []:
            for entry_id, fields in entries:
                events.append(entry_event(entry_id, fields))
        return events

    async def _trimmed_past(self, key: str, after: str) -> bool:
        """Whether the client would miss events: some after ``after`` were trimmed, or the log it knew
        expired and began again (its id is past the newest)."""
        async with self.bus.redis.pipeline(transaction=False) as pipe:
            pipe.xrange(key, count=1)
            pipe.xrevrange(key, count=1)
            oldest, newest = await pipe.execute()
        if not oldest:
            return False
        first, last, seen = event_order(oldest[0][0].decode()), event_order(newest[0][0].decode()), event_order(after)
        return seen[0] + 1 < first[0] or seen > last


def parse_after(value: str | None) -> str | None:
    """A client's Last-Event-ID (or ``after``): a stream id, ``0`` for everything kept; None when bad."""
    if value is None or value == "":
        return None
    if value == "0":
        return "0-0"
    try:
        event_order(value)
    except ValueError:
        return None
    return value


def event_order(value: str) -> tuple[int, int]:
    """An event id as something that sorts: ``12-0`` -> (12, 0)."""
    ms, _, seq = value.partition("-")
    return int(ms), int(seq or 0)


def entry_event(entry_id: Any, fields: Mapping[bytes, bytes]) -> Event:
    data = json.loads(fields[b"d"])
    return Event(id=text(entry_id), kind=fields[b"k"].decode(),
                 data=data)
