"""One chat turn: the model decides, Hands acts, results go back, until the model answers."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from brain.catalog import NoHandsAvailable, ToolCatalog
from brain.config import BrainSettings
from brain.llm import NOT_CONFIGURED, LLMClient, LLMError, ToolCall, cost_usd
from brain.loops import LoopDetector
from brain.prompt import system_prompt
from bus.log import kv
from bus.protocol import (
    ChatDelta,
    ChatError,
    ChatMessage,
    ChatReply,
    ChatTool,
    ErrorCode,
    Message,
    ResultMetadata,
    ToolCancel,
    ToolError,
    ToolExecute,
    ToolProgress,
    ToolResult,
    ToolSpec,
    new_id,
    now_ms,
)
from bus.streams import Bus, ReplyInbox
from memory.sessions import SessionStore, TranscriptEntry

log = logging.getLogger("brain.turn")


@dataclass
class TurnDeps:
    bus: Bus
    inbox: ReplyInbox
    sessions: SessionStore
    catalog: ToolCatalog
    settings: BrainSettings
    llm: LLMClient | None  # None: no model configured


class Turn:
    """Runs one ``chat:message`` to its end; always finishes with a ``chat:reply`` or ``chat:error``."""

    def __init__(self, deps: TurnDeps, message: ChatMessage) -> None:
        self.deps, self.message = deps, message
        self.usage: dict[str, int] = {}
        self.in_flight: set[str] = set()  # our call ids Hands is working on
        self.model_calls = self.tool_calls = 0
        settings = deps.settings
        big = 10**9  # a threshold of 0 is off
        self.loops = LoopDetector(warn_at=settings.loop_warn_at or big, stop_at=settings.loop_stop_at or big) \
            if settings.loop_warn_at or settings.loop_stop_at else None
        self.tools_used: list[str] = []
        self.cost_usd = 0.0
        self.unanswered: list[ToolCall] = []  # the model's tool calls still without a result

    async def run(self) -> ChatReply | ChatError:
        """The final event; deltas and tool events are published as they happen."""
        msg, deps = self.message, self.deps
        history = await deps.sessions.load(msg.session_id)
        user = TranscriptEntry(role="user", content=msg.text, metadata={"message_id": msg.message_id})
        await deps.sessions.append(msg.session_id, user)
        if deps.llm is None:
            return self._error(ErrorCode.MODEL_NOT_CONFIGURED, NOT_CONFIGURED)
        try:
            tools, skills = await deps.catalog.lookup(msg.agent_id, msg.sender)
        except NoHandsAvailable as exc:
            return self._error(ErrorCode.SERVICE_UNAVAILABLE, str(exc))
        messages = [{"role": "system", "content": system_prompt(deps.settings.instructions, skills)}]
        messages += [entry.to_llm() for entry in [*history, user]]
        try:
            async with asyncio.timeout(deps.settings.max_turn_s):
                return await self._loop(messages, tools)
        except TimeoutError:
            return await self.stop(ErrorCode.BUDGET_EXHAUSTED,
                                   f"the turn ran out of time (brain.max_turn_s = {deps.settings.max_turn_s:g}s)")
        except LLMError as exc:
            return self._error(exc.code, exc.message)

    async def _loop(self, messages: list[dict[str, Any]], tools: list[ToolSpec]) -> ChatReply | ChatError:
        deps, msg = self.deps, self.message
        budget = deps.settings
        for iteration in range(1, deps.settings.max_iterations + 1):
            if self.usage.get("total_tokens", 0) >= budget.max_tokens:
                return await self.stop(ErrorCode.BUDGET_EXHAUSTED,
                                       f"the turn used its tokens (brain.max_tokens = {budget.max_tokens:,})")
            if budget.max_cost_usd is not None and self.cost_usd >= budget.max_cost_usd:
                return await self.stop(ErrorCode.BUDGET_EXHAUSTED,
                                       f"the turn spent its money (brain.max_cost_usd = {budget.max_cost_usd:g})")
            completion = await deps.llm.complete(messages, tools, self._stream_text)  # type: ignore[union-attr]
            self.model_calls += 1
            self._count(completion.usage)
            if budget.max_cost_usd is not None:  # pricing needs litellm's table: only when a cost budget is set
                self.cost_usd += cost_usd(completion.model, completion.usage) or 0.0
            assistant = TranscriptEntry(
                role="assistant", content=completion.text or None,
                tool_calls=[call.to_openai() for call in completion.tool_calls] or None,
                metadata={"model": completion.model, "iteration": iteration},
            )
            await deps.sessions.append(msg.session_id, assistant)
            messages.append(assistant.to_llm())
            self.unanswered = list(completion.tool_calls)
            if not completion.tool_calls:
                log.info("turn done %s", kv(session=msg.session_id, message=msg.message_id, iterations=iteration))
                return ChatReply(session_id=msg.session_id, message_id=msg.message_id, text=completion.text,
                                 model=completion.model, usage=self.usage)
            if self.tool_calls + len(completion.tool_calls) > budget.max_tool_calls:
                return await self.stop(ErrorCode.BUDGET_EXHAUSTED, f"the model asked for more tool calls than the "
                                       f"turn allows (brain.max_tool_calls = {budget.max_tool_calls})")
            self.tool_calls += len(completion.tool_calls)
            self.tools_used.extend(call.name for call in completion.tool_calls)
            known = {spec.name for spec in tools}
            results = await asyncio.gather(*(self._call(call, known) for call in completion.tool_calls))
            entries, stop = [], None
            for call, result in zip(completion.tool_calls, results):
                entry = self._tool_entry(call, result)
                verdict = self.loops.observe(call, result) if self.loops else None
                if verdict and verdict.warning:
                    entry.content = f"{entry.content}\n\n{verdict.warning}"
                stop = stop or (verdict.stop if verdict else None)
                entries.append(entry)
            await deps.sessions.append(msg.session_id, *entries)
            self.unanswered = []
            messages.extend(entry.to_llm() for entry in entries)
            if stop:
                return await self.stop(ErrorCode.LOOP_DETECTED, stop)
        return await self.stop(ErrorCode.BUDGET_EXHAUSTED, f"the model made {deps.settings.max_iterations} calls "
                               "without a final answer (brain.max_iterations)")

    async def _call(self, call: ToolCall, known: set[str]) -> ToolResult:
        """Run one tool call in Hands; every path ends in a result, never a hang."""
        msg = self.message
        call_id = new_id()
        await self._publish(ChatTool(session_id=msg.session_id, message_id=msg.message_id, call_id=call_id,
                                     tool=call.name, status="started", summary=_summary(call)))
        try:
            args = json.loads(call.arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError(f"expected a JSON object, got {type(args).__name__}")
        except ValueError as exc:
            result = _local_failure(call_id, call.name, ErrorCode.INVALID_ARGUMENTS,
                                    f"the arguments are not a JSON object ({exc}); send them as a JSON object")
        else:
            if call.name not in known:
                result = _local_failure(
                    call_id, call.name, ErrorCode.TOOL_NOT_FOUND,
                    f"no tool named {call.name!r}; available tools: {', '.join(sorted(known)) or '(none)'}",
                )
            else:
                result = await self._execute(call_id, call.name, args)
        await self._publish(ChatTool(
            session_id=msg.session_id, message_id=msg.message_id, call_id=call_id, tool=call.name,
            status="finished", summary="ok" if result.success else f"{result.error.code}: {result.error.message}"[:300],  # type: ignore[union-attr]
        ))
        return result

    async def _execute(self, call_id: str, tool: str, args: dict[str, Any]) -> ToolResult:
        deps, msg = self.deps, self.message
        deadline_s = deps.settings.tool_deadline_s
        request = ToolExecute(call_id=call_id, tool=tool, args=args, session_id=msg.session_id,
                              agent_id=msg.agent_id, sender=msg.sender, reply_to=deps.inbox.stream,
                              approvals_to=msg.reply_to, message_id=msg.message_id,
                              deadline=now_ms() + int(deadline_s * 1000))
        log.info("tool call sent %s", kv(session=msg.session_id, call=call_id, tool=tool))

        async def relay(event: Message) -> None:
            if isinstance(event, ToolProgress):
                await self._publish(ChatTool(session_id=msg.session_id, message_id=msg.message_id, call_id=call_id,
                                             tool=tool, status="progress", summary=event.message[:300]))

        self.in_flight.add(call_id)  # left in place if we are cancelled: cancel() stops it in Hands
        try:
            reply: Message = await deps.inbox.request(deps.bus.keys.hands_requests, request, call_id,
                                                      timeout=deadline_s + 1, final=(ToolResult,), on_event=relay)
        except TimeoutError:
            self.in_flight.discard(call_id)
            return _local_failure(
                call_id, tool, ErrorCode.TIMEOUT,
                f"no Hands worker answered within {deadline_s:g}s; the tool may not have run. "
                "Is a Hands worker running (`pincer hands`)?",
                recoverable=True,
            )
        self.in_flight.discard(call_id)
        assert isinstance(reply, ToolResult)
        return reply

    async def cancel(self, by: str) -> ChatError:
        """End a turn the person stopped."""
        return await self.stop(ErrorCode.CANCELLED, f"the turn was cancelled by {by or 'the person'}")

    async def stop(self, code: ErrorCode, reason: str) -> ChatError:
        """End the turn early: stop its tool calls in Hands, close them in the transcript, say what was done."""
        deps, msg = self.deps, self.message
        for call_id in list(self.in_flight):
            await deps.bus.publish(deps.bus.keys.hands_control, ToolCancel(call_id=call_id, reason=reason))
        stopped = [TranscriptEntry(role="tool", tool_call_id=call.id, name=call.name, metadata={"cancelled": True},
                                   content=json.dumps({"error": "CANCELLED", "message": reason}))
                   for call in self.unanswered]
        note = TranscriptEntry(role="assistant", content=f"[{reason}]", metadata={"cancelled": True})
        await deps.sessions.append(msg.session_id, *stopped, note)
        log.info("turn stopped %s: %s", kv(session=msg.session_id, message=msg.message_id, code=code), reason)
        done = (f"{self.model_calls} model call(s), {self.tool_calls} tool call(s)"
                + (f" ({', '.join(sorted(set(self.tools_used)))})" if self.tools_used else "")
                + f", {self.usage.get('total_tokens', 0):,} tokens")
        return ChatError(session_id=msg.session_id, message_id=msg.message_id, code=code,
                         message=f"{reason}; {len(stopped)} tool call(s) stopped. Done so far: {done}; "
                                 "the results are in the session transcript")

    def _tool_entry(self, call: ToolCall, result: ToolResult) -> TranscriptEntry:
        return TranscriptEntry(
            role="tool", tool_call_id=call.id, name=call.name, content=_for_model(result),
            metadata={"call_id": result.call_id, "success": result.success,
                      "worker_id": result.metadata.worker_id, "duration_ms": result.metadata.duration_ms,
                      "truncated": result.metadata.truncated,
                      **({"error_code": result.error.code.value} if result.error else {})},
        )

    async def _stream_text(self, text: str) -> None:
        await self._publish(ChatDelta(session_id=self.message.session_id, message_id=self.message.message_id,
                                      text=text))

    async def _publish(self, event: Message) -> None:
        await self.deps.bus.publish(self.message.reply_to, event)

    def _count(self, usage: dict[str, Any]) -> None:
        for key, value in usage.items():
            if isinstance(value, int):
                self.usage[key] = self.usage.get(key, 0) + value

    def _error(self, code: ErrorCode, message: str) -> ChatError:
        log.warning("turn failed %s: %s", kv(session=self.message.session_id, code=code), message)
        return ChatError(session_id=self.message.session_id, message_id=self.message.message_id, code=code,
                         message=message)


def _for_model(result: ToolResult) -> str:
    """The result as the model reads it: the data, or the error with what to do next."""
    if result.success:
        data = result.data
        return data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)
    error = result.error
    assert error is not None
    shown: dict[str, Any] = {"error": error.code.value, "message": error.message, "recoverable": error.recoverable}
    if error.suggestions:
        shown["suggestions"] = error.suggestions
    return json.dumps(shown, ensure_ascii=False)


def _local_failure(call_id: str, tool: str, code: ErrorCode, message: str, *, recoverable: bool = True) -> ToolResult:
    return ToolResult(call_id=call_id, success=False, error=ToolError(code=code, message=message,
                      recoverable=recoverable), metadata=ResultMetadata(tool_name=tool, worker_id="brain"))


def _summary(call: ToolCall) -> str:
    return f"{call.name}({call.arguments[:200]})"
