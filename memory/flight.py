"""The flight recorder: every step of every turn, kept beside the session's transcript.

The transcript keeps the conversation; the record keeps what it took: each model request as it was
sent (the messages after fitting, the tools, the parameters) and its response (text, tool calls,
finish reason, usage with cached tokens, cost, time to the first token and in all), each tool call
with its result and where it ran, compactions and early stops. It is what a turn is replayed,
forked and compared from.

A request's messages and tool list are stored once each by digest in the session's parts hash and
referenced from the entry, so a long conversation costs one copy of each message, not one per step, and
each is sent once per session (memory/record_parts.py).
The record's keys share the session's hash tag, its owner and its fate (deleted with the session,
lapsing with it), and live ``keep_s`` past their last write; each step leaves ``keep_s`` after it was
written, so a session that never goes quiet does not keep every step it ever took.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bus.errors import PincerError
from bus.keys import Keys
from bus.log import kv
from bus.outcome import Done, failure, log_failure
from bus.protocol import now_ms
from bus.scripts import ScriptCall, lua
from bus.store import RedisStore
from memory.record_parts import STORE_PARTS, Parts, StoredParts, canonical, digest

FORMAT = 1  # the export's version: a reader refuses a newer one by name
KEEP_DAYS = 30.0  # a record lapses this long after its last step, unless brain.record.keep_days says
Kind = Literal["turn", "model", "tool", "compaction", "stop", "approval", "question"]


# KEYS: the session's record. ARGV: the step's JSON. A step added only to a record being kept (its first
# step, the turn's, is the Brain's): a process that does not know brain.record's settings (Hands) never
# starts one, nor one without an expiry.
ADD_IF_KEPT = lua("memory.flight.add_if_kept", """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('XADD', KEYS[1], '*', 'e', ARGV[1])
return 1
""")


# KEYS: the session's record. ARGV: the step's JSON, how long a step is kept (ms). Trimmed by the new
# entry's own id (Redis's clock): a writer whose clock runs ahead could otherwise trim its own step.
ADD_STEP = lua("memory.flight.add_step", """
local id = redis.call('XADD', KEYS[1], '*', 'e', ARGV[1])
local ms = tonumber(string.match(id, '^(%d+)-'))
redis.call('XTRIM', KEYS[1], 'MINID', string.format('%.0f', ms - tonumber(ARGV[2])))
return id
""")


class RecordError(PincerError):
    """A record that cannot be read or imported: says which line and what is wrong with it."""


class Step(BaseModel):
    """One entry of the record. Readers accept fields they do not know (a newer writer's)."""

    model_config = ConfigDict(extra="allow")

    kind: Kind
    at: int = Field(default_factory=now_ms)
    message_id: str = ""
    data: dict[str, Any] = Field(default_factory=dict)


class Send(Protocol):
    """Queue pipeline commands, not waiting; ``done`` hears their outcome (the bus's batcher)."""

    def __call__(self, build: Callable[[Any], object], *, done: Done = ...) -> None: ...


class FlightRecorder:
    def __init__(self, redis: RedisStore, keys: Keys, *, keep_s: int, send: Send | None = None) -> None:
        self.redis, self.keys, self.keep_s = redis, keys, keep_s
        self.send = send  # given: steps go out with the process's next writes, in order, not awaited one by one
        self.shared = Parts()  # the tool lists: the same object turn after turn, so named once for all turns
        self.stored = StoredParts()

    async def write(self, session_id: str, step: Step | None, parts: dict[str, str] | None = None) -> None:
        """One step (and parts: each name's canonical JSON), or parts alone: queued, or one round trip."""
        await self._send(session_id, self._commands(session_id, step, parts or {}))

    async def _send(self, session_id: str, build: Callable[[Any], object],
                    then: Callable[[list[Any]], Callable[[Any], object] | None] = lambda results: None) -> None:
        """``build``'s commands queued with the process's next writes (``send``), or one round trip now (raising
        what fails it); ``then`` may make a second write from their results, sent the same way."""
        if self.send is None:
            try:
                follow = then(await self._execute(build))
                if follow is not None:
                    await self._execute(follow)
            except Exception:
                self.stored.forget(session_id)
                raise
            return
        send = self.send

        def resent(outcome: list[Any] | Exception) -> None:
            self._lost(session_id, outcome)

        def sent(outcome: list[Any] | Exception) -> None:
            if not self._lost(session_id, outcome) and not isinstance(outcome, Exception):
                follow = then(outcome)
                if follow is not None:
                    send(follow, done=resent)

        send(build, done=sent)

    async def _execute(self, build: Callable[[Any], object]) -> list[Any]:
        async with self.redis.pipeline(transaction=False) as pipe:
            build(pipe)
            return await pipe.execute()

    def _commands(self, session_id: str, step: Step | None, parts: dict[str, str] | None = None
                  ) -> Callable[[Any], object]:
        record, stored = self.keys.session_record(session_id), self.keys.session_record_parts(session_id)
        entry = step.model_dump_json() if step is not None else None

        def build(pipe: Any) -> None:
            for name, text in (parts or {}).items():
                pipe.hsetnx(stored, name, text)
            if entry is not None:  # a step older than keep_s leaves, however busy the session stays
                ScriptCall(ADD_STEP, (record,), (entry, self.keep_s * 1000)).add(pipe)
                pipe.expire(record, self.keep_s)
            pipe.expire(stored, self.keep_s)
        return build

    async def add_if_kept(self, session_id: str, step: Step) -> bool:
        """``step`` added to the session's record if it keeps one (see ADD_IF_KEPT)."""
        added = await self.redis.register_script(ADD_IF_KEPT)(keys=[self.keys.session_record(session_id)],
                                                                args=[step.model_dump_json()])
        return bool(added)

    async def model_call(self, session_id: str, message_id: str, *, messages: list[dict[str, Any]],
                         tools: list[dict[str, Any]], params: dict[str, Any], response: dict[str, Any],
                         seen: Parts | None = None) -> None:
        """A model request as sent (its messages and tools by digest) and what came back (or the error).
        ``seen``: the turn's parts, so each is hashed once per turn; the parts the session's hash holds
        already are named, not sent."""
        seen = seen or Parts()
        names = seen.names(messages)
        if len(self.shared) >= 64:  # tool lists of agents and senders long gone
            self.shared = Parts()
        tools_name = self.shared.digest(tools)
        texts: dict[str, tuple[Parts, Any]] = {name: (seen, part) for name, part in zip(names, messages, strict=True)}
        texts[tools_name] = (self.shared, tools)
        held = self.stored.of(session_id)
        new = {name: parts.text(part) for name, (parts, part) in texts.items() if name not in held}
        told = [name for name in texts if name in held]
        self.stored.add(session_id, new)  # after reading ``held``: it is the live set
        request = {"messages": names, "tools": tools_name, **params}
        step = Step(kind="model", message_id=message_id, data={"request": request, "response": response})
        call = ScriptCall(STORE_PARTS, (self.keys.session_record_parts(session_id),),
                          (len(new), *(x for pair in new.items() for x in pair), *told))
        steps = self._commands(session_id, step)

        def build(pipe: Any) -> None:
            call.add(pipe)
            steps(pipe)

        def resend(results: list[Any]) -> Callable[[Any], object] | None:
            missing = results[0]  # the parts the hash lacks after all: sent whole
            if not missing:
                return None
            return self._commands(session_id, None, {
                name: parts.text(part) for name in (m.decode() for m in missing) for parts, part in [texts[name]]})

        await self._send(session_id, build, resend)

    def _lost(self, session_id: str, outcome: list[Any] | Exception) -> bool:
        """Whether a write of parts failed; then what was sent may not be there, and the next request sends all."""
        if failure(outcome) is None:
            return False
        self.stored.forget(session_id)
        log_failure(outcome, f"flight record step {kv(session=session_id)}")
        return True

    async def steps(self, session_id: str) -> list[Step]:
        """The record in the order it happened (an entry that does not read is skipped, not fatal)."""
        raw = await self.redis.xrange(self.keys.session_record(session_id))
        found = []
        for _, fields in raw:
            try:
                found.append(Step.model_validate_json(fields[b"e"]))
            except (KeyError, ValidationError):
                continue
        return found

    async def parts(self, session_id: str) -> dict[str, Any]:
        stored = await self.redis.hgetall(self.keys.session_record_parts(session_id))
        return {name.decode(): json.loads(value) for name, value in stored.items()}

    async def request(self, session_id: str, step: Step) -> dict[str, Any]:
        """A model step's request whole again: its messages and tools in place of their digests."""
        parts = await self.parts(session_id)
        return resolved(step, parts)

    async def export(self, session_id: str) -> list[str]:
        """The session's record as JSONL lines: a header, then each part before the first step that uses it."""
        return list(export_lines(session_id, await self.steps(session_id), await self.parts(session_id)))

    async def import_lines(self, session_id: str, lines: Iterable[str]) -> int:
        """A record exported before, written as ``session_id``'s (replacing any record it had); its step count."""
        steps, parts = read_lines(lines)
        record, stored = self.keys.session_record(session_id), self.keys.session_record_parts(session_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.delete(record, stored)
            for name, part in parts.items():
                pipe.hset(stored, name, canonical(part))
            for step in steps:
                pipe.xadd(record, {"e": step.model_dump_json()})
            pipe.expire(record, self.keep_s)
            pipe.expire(stored, self.keep_s)
            await pipe.execute()
        return len(steps)


    async def copy(self, source: str, target: str, message_ids: set[str]) -> int:
        """The steps of these turns (and the parts they use) into ``target``'s record, lapsing when the
        source's does: a fork's history."""
        steps = [step for step in await self.steps(source) if step.message_id in message_ids]
        if not steps:
            return 0
        parts = await self.parts(source)
        used = {name for step in steps for name in _parts_of(step)}
        left_ms = await self.redis.pttl(self.keys.session_record(source))
        copier = FlightRecorder(self.redis, self.keys, keep_s=max(1, left_ms // 1000) if left_ms > 0 else self.keep_s)
        await copier.import_lines(target, export_lines(target, steps, {k: v for k, v in parts.items() if k in used}))
        return len(steps)


def _parts_of(step: Step) -> list[str]:
    request = step.data.get("request") or {}
    return [*(request.get("messages") or []), *([request["tools"]] if "tools" in request else [])]


def resolved(step: Step, parts: dict[str, Any]) -> dict[str, Any]:
    request = dict(step.data.get("request") or {})
    request["messages"] = [parts.get(name, {"missing": name}) for name in request.get("messages") or []]
    request["tools"] = parts.get(str(request.get("tools")), [])
    return request


def export_lines(session_id: str, steps: list[Step], parts: dict[str, Any]) -> Iterator[str]:
    yield canonical({"pincer_record": FORMAT, "session": session_id, "exported_at": now_ms(), "steps": len(steps)})
    written: set[str] = set()
    for step in steps:
        for name in _parts_of(step):
            if name not in written and name in parts:
                written.add(name)
                yield canonical({"part": name, "value": parts[name]})
        yield canonical({"step": step.model_dump(mode="json")})


def read_lines(lines: Iterable[str]) -> tuple[list[Step], dict[str, Any]]:
    """Steps and parts from an export, each part checked against its digest."""
    steps: list[Step] = []
    parts: dict[str, Any] = {}
    header = False
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise RecordError(f"line {number}: not JSON ({exc})") from None
        if not isinstance(item, dict):
            raise RecordError(f"line {number}: expected a JSON object")
        if "pincer_record" in item:
            if item["pincer_record"] != FORMAT:
                raise RecordError(f"line {number}: record format {item['pincer_record']!r}; this Pincer reads "
                                  f"format {FORMAT} (export it again with this release, or upgrade)")
            header = True
        elif not header:
            raise RecordError(f"line {number}: a record export starts with its header line "
                              "(made by `pincer record export`)")
        elif "part" in item:
            name = str(item["part"])
            if digest(item.get("value")) != name:
                raise RecordError(f"line {number}: part {name} does not match its content (the file was edited)")
            parts[name] = item["value"]
        elif "step" in item:
            try:
                steps.append(Step.model_validate(item["step"]))
            except ValidationError as exc:
                raise RecordError(f"line {number}: not a step ({exc.errors()[0]['msg']})") from None
        else:
            raise RecordError(f"line {number}: neither a part nor a step")
    if not header:
        raise RecordError("empty: no header line (is it a `pincer record export` file?)")
    return steps, parts
