"""Replay: a recorded session's messages run again through the current code, config and tool policy.

Each turn is a real ``Turn`` in a scratch session, with its tools listed by the pool's Hands as they
are now. Its model is the record (``RecordedModel``): a request equal to the one recorded at that
step is answered with the recorded response, so nothing is spent; the first that differs is
reported with a readable diff of the two requests, then answered live (``live``) or the replay
stops there. Tool calls are answered from the record (nothing runs): by the model's call id at the
same step, else by the same tool and arguments; or, given ``run_tool`` (hands/scratch.py: a scratch
copy of the workspace), they run again, and what they return now is what the next request carries.

What is compared is what the provider would read: the messages and the tool list. Call ids are the
recorded model's own (replayed responses carry them), so they match without normalising; no
timestamp reaches a request.
"""

from __future__ import annotations

import difflib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from brain.catalog import ToolCatalog
from brain.config import BrainSettings
from brain.deps import TurnDeps
from brain.llm import Attempt, Completion, LLMClient, LLMError, OnText, ToolCall, tool_param
from brain.turn import Turn
from bus.errors import PincerError
from bus.protocol import (
    ChatMessage,
    ChatReply,
    ErrorCode,
    PriorResult,
    ResultMetadata,
    ToolError,
    ToolExecute,
    ToolResult,
    ToolSpec,
    now_ms,
)
from bus.replies import ReplyInbox
from bus.streams import Bus
from memory.flight import Step, resolved
from memory.longterm import LongTermMemory
from memory.record_parts import canonical
from memory.sessions import SessionStore, TranscriptEntry

SCRATCH = "replay"  # the owner part of a replay's scratch session
RunTool = Callable[[ToolExecute], Awaitable[ToolResult]]  # a tool call run now (tools live), not by the pool


class Diverged(PincerError):
    """The run asked the model something the recording never did, and the replay does not go live."""


@dataclass
class Divergence:
    turn: int
    step: int  # the model call of that turn, from 1
    diff: str  # recorded (---) against now (+++)


@dataclass
class TurnReport:
    text: str
    recorded_answer: str | None
    answer: str | None = None
    error: str | None = None
    model_steps: int = 0  # recorded model calls
    matched: int = 0  # answered from the record
    live: int = 0  # asked of the live model
    recorded_tools: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return self.answer == self.recorded_answer and self.tools == self.recorded_tools


@dataclass
class Report:
    turns: list[TurnReport] = field(default_factory=list)
    diverged: Divergence | None = None
    recorded: dict[str, float] = field(default_factory=dict)  # tokens, cache, cost and time of the recording
    seconds: float = 0.0
    tools_live: bool = False  # the tools ran again (in a scratch workspace), not answered from the record

    def as_json(self) -> dict[str, Any]:
        return {"turns": [{**t.__dict__, "same": t.same} for t in self.turns],
                "diverged": None if self.diverged is None else self.diverged.__dict__,
                "recorded": self.recorded, "seconds": round(self.seconds, 3), "tools_live": self.tools_live,
                "model_calls_matched": sum(t.matched for t in self.turns),
                "model_calls_live": sum(t.live for t in self.turns)}


def turns_of(steps: list[Step]) -> list[tuple[Step, list[Step]]]:
    """The record cut into turns: each ``turn`` step with the steps of its message."""
    found: list[tuple[Step, list[Step]]] = []
    for step in steps:
        if step.kind == "turn":
            found.append((step, []))
        elif found and step.message_id == found[-1][0].message_id:
            found[-1][1].append(step)
    return found


def totals(steps: list[Step]) -> dict[str, float]:
    """What the recording cost: model calls, tokens (cached), money and time."""
    responses = [s.data.get("response") or {} for s in steps if s.kind == "model"]
    usage = [r.get("usage") or {} for r in responses]
    prompt = sum(int(u.get("prompt_tokens") or 0) for u in usage)
    cached = sum(int(u.get("cached_tokens") or 0) for u in usage)
    return {"model_calls": len(responses), "prompt_tokens": prompt, "cached_tokens": cached,
            "completion_tokens": sum(int(u.get("completion_tokens") or 0) for u in usage),
            "cache_hit": round(cached / prompt, 3) if prompt else 0.0,
            "cost_usd": round(sum(float(r.get("cost_usd") or 0) for r in responses), 6),
            "model_ms": round(sum(float(r.get("total_ms") or 0) for r in responses), 1)}


def request_diff(then: dict[str, Any], now: dict[str, Any]) -> str:
    """Two requests diffed as a person reads them (each message's text on its own lines): where they
    part is what changed."""
    return "\n".join(difflib.unified_diff(readable(then), readable(now), "recorded", "now", lineterm="", n=2))


def readable(request: dict[str, Any]) -> list[str]:
    lines = []
    for number, message in enumerate(request.get("messages") or (), 1):
        extra = {k: v for k, v in message.items() if k not in ("role", "content")}
        lines.append(f"[{number}] {message.get('role')}" + (f" {canonical(extra)}" if extra else ""))
        lines += [f"    {line}" for line in str(message.get("content") or "").splitlines()]
    lines += [f"tool {canonical(tool)}" for tool in request.get("tools") or ()]
    return lines


class RecordedModel:
    """An ``LLMClient`` answering from the record while the requests match it; then live, or ``Diverged``."""

    def __init__(self, parts: dict[str, Any], live: LLMClient | None) -> None:
        self.parts, self.live = parts, live
        self.pending: list[Step] = []
        self.turn, self.step = 0, 0
        self.diverged: Divergence | None = None
        self.report = TurnReport(text="", recorded_answer=None)

    def expect(self, turn: int, steps: list[Step], report: TurnReport) -> None:
        self.turn, self.step, self.report = turn, 0, report
        self.pending = [] if self.diverged else [s for s in steps if s.kind == "model"]

    async def complete(self, messages: list[dict[str, Any]], tools: list[ToolSpec], on_text: OnText, *,
                       max_output_tokens: int | None = None, attempts: list[Attempt] | None = None) -> Completion:
        self.step += 1
        expected = self.pending.pop(0) if self.pending else None
        now = {"messages": messages, "tools": [tool_param(spec) for spec in tools]}
        if expected is not None and self.diverged is None:
            then = {key: value for key, value in resolved(expected, self.parts).items() if key in now}
            if canonical(then) == canonical(now):
                self.report.matched += 1
                return _completion(expected)
            self.diverged = Divergence(self.turn, self.step, request_diff(then, now))
        elif self.diverged is None:
            self.diverged = Divergence(self.turn, self.step, "the recording made no model call here "
                                       "(it ended the turn, or stopped it, sooner)")
        if self.live is None:
            raise Diverged(f"turn {self.turn}, model call {self.step}: the request differs from the recording")
        self.report.live += 1
        return await self.live.complete(messages, tools, on_text, max_output_tokens=max_output_tokens,
                                        attempts=attempts)


def _completion(step: Step) -> Completion:
    response = step.data.get("response") or {}
    if "error" in response:
        raise LLMError(ErrorCode.SERVICE_UNAVAILABLE, f"(as recorded) {response['error']}")
    calls = [ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
             for c in response.get("tool_calls") or ()]
    return Completion(text=str(response.get("text") or ""), tool_calls=calls, model=str(response.get("model") or ""),
                      usage=dict(response.get("usage") or {}), finish_reason=str(response.get("finish_reason") or ""))


class ReplayTurn(Turn):
    """A turn whose tool calls are answered from the record instead of by Hands."""

    def __init__(self, deps: TurnDeps, message: ChatMessage, model: RecordedModel, recorded: list[Step], *,
                 run_tool: RunTool | None = None) -> None:
        super().__init__(deps, message)
        self.model, self.recorded = model, recorded
        self.scratch = None if run_tool is None else ScratchCalls(run_tool, message, deps.settings.tool_deadline_s)
        if self.scratch is not None:
            self.hands = self.scratch  # type: ignore[assignment]  # the same seam: execute(call_id, tool, args, prior)
        self.answers: dict[str, dict[str, Any]] = {}  # our call id -> the recorded tool step's data

    def _recorded_result(self, call: ToolCall) -> dict[str, Any] | None:
        """The recorded tool step for this call: after the same model call, with the model's call id; else
        anywhere in the turn with the same tool and arguments."""
        steps, models = [], 0
        for step in self.recorded:
            models += step.kind == "model"
            if step.kind == "tool":
                steps.append((models, step.data))
        for model_step, data in steps:
            if model_step == self.model.step and data.get("model_call_id") == call.id:
                return data
        return next((data for _, data in steps if data.get("tool") == call.name
                     and data.get("arguments") == call.arguments), None)

    async def _call(self, call_id: str, call: ToolCall, specs: dict[str, ToolSpec],
                    prior: list[PriorResult]) -> ToolResult:
        self.model.report.tools.append(call.name)
        if self.scratch is not None:
            return await super()._call(call_id, call, specs, prior)
        data = self._recorded_result(call)
        if data is None:
            data = {"success": False, "error_code": ErrorCode.TOOL_NOT_FOUND.value,
                    "result": "replay: the recording has no result for this call, and tools are not run in a replay"}
        self.answers[call_id] = data
        error = None if data.get("success") else ToolError(code=ErrorCode(data.get("error_code") or "INTERNAL_ERROR"),
                                                           message=str(data.get("result") or ""))
        return ToolResult(call_id=call_id, success=bool(data.get("success")), data=None, error=error,
                          metadata=ResultMetadata(tool_name=call.name, worker_id="replay",
                                                  duration_ms=int(data.get("duration_ms") or 0)))

    def _tool_entry(self, call: ToolCall, result: ToolResult) -> TranscriptEntry:
        entry = super()._tool_entry(call, result)
        if result.call_id in self.answers:
            entry.content = str(self.answers[result.call_id].get("result") or "")  # exactly what the model read then
        return entry


class ScratchCalls:
    """The turn's tool calls run by ``run_tool`` (in a scratch workspace) instead of by the pool's Hands."""

    def __init__(self, run_tool: RunTool, message: ChatMessage, deadline_s: float) -> None:
        self.run_tool, self.message, self.deadline_s = run_tool, message, deadline_s

    async def execute(self, call_id: str, tool: str, args: dict[str, Any], prior: list[PriorResult], *,
                      deadline_s: float | None = None) -> ToolResult:
        msg = self.message
        return await self.run_tool(ToolExecute(call_id=call_id, tool=tool, args=args, session_id=msg.session_id,
                                               agent_id=msg.agent_id, sender=msg.sender, reply_to="replay",
                                               message_id=msg.message_id, prior=prior, approvals_to="",
                                               deadline=now_ms() + int((deadline_s or self.deadline_s) * 1000)))


class Replayer:
    """Replays that share one reply inbox and tool catalog: a run of many (evals) lists the tools once."""

    def __init__(self, bus: Bus, settings: BrainSettings) -> None:
        self.bus, self.settings = bus, settings
        self.inbox = ReplyInbox(bus, f"replay-{uuid.uuid4().hex[:12]}")
        self.sessions = SessionStore(bus.redis, bus.keys)
        self.memory = LongTermMemory(bus.redis, bus.keys)
        self.catalog = ToolCatalog(bus, self.inbox, timeout_s=settings.tools_list_timeout_s)

    async def __aenter__(self) -> Replayer:
        await self.inbox.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.inbox.close()

    async def replay(self, steps: list[Step], parts: dict[str, Any], *, live: LLMClient | None = None,
                     run_tool: RunTool | None = None) -> Report:
        """Run the recorded session's messages again in a scratch session (deleted after). ``run_tool``: tools
        run again by it (their results now, not the recorded ones)."""
        started = time.perf_counter()
        bus, settings = self.bus, self.settings
        report = Report(recorded=totals(steps), tools_live=run_tool is not None)
        scratch = f"{SCRATCH}/{uuid.uuid4().hex[:12]}"
        model = RecordedModel(parts, live)
        deps = TurnDeps(bus=bus, inbox=self.inbox, sessions=self.sessions, memory=self.memory, catalog=self.catalog,
                        settings=settings, llm=model)
        events = f"{bus.keys.prefix}replay:{scratch}:events"
        try:
            for number, (start, recorded) in enumerate(turns_of(steps), 1):
                turn = _turn_report(start, recorded)
                report.turns.append(turn)
                model.expect(number, recorded, turn)
                message = ChatMessage(session_id=scratch, text=turn.text, reply_to=events,
                                      sender=str(start.data.get("sender") or "user"),
                                      agent_id=str(start.data.get("agent") or "main"),
                                      instructions=start.data.get("instructions"))
                try:
                    outcome = await ReplayTurn(deps, message, model, recorded, run_tool=run_tool).run()
                except Diverged as exc:
                    turn.error = str(exc)
                    break
                if isinstance(outcome, ChatReply):
                    turn.answer = outcome.text
                else:
                    turn.error = f"{outcome.code.value}: {outcome.message}"
        finally:
            report.diverged = model.diverged
            await self.sessions.delete(scratch)
            await bus.redis.delete(events)
            report.seconds = time.perf_counter() - started
        return report


def _turn_report(start: Step, recorded: list[Step]) -> TurnReport:
    models = [s for s in recorded if s.kind == "model"]
    final = (models[-1].data.get("response") or {}).get("text") if models else None
    return TurnReport(text=str(start.data.get("text") or ""), recorded_answer=final, model_steps=len(models),
                      recorded_tools=[str(s.data.get("tool")) for s in recorded if s.kind == "tool"])


async def replay(bus: Bus, settings: BrainSettings, steps: list[Step], parts: dict[str, Any], *,
                 live: LLMClient | None = None, run_tool: RunTool | None = None) -> Report:
    """One replay (``Replayer.replay``) with an inbox and tool catalog of its own."""
    async with Replayer(bus, settings) as replayer:
        return await replayer.replay(steps, parts, live=live, run_tool=run_tool)
