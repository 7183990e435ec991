"""One chat turn: the model decides, Hands acts, results go back, until the model answers."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from brain.catalog import UNREAD, NoHandsAvailable, Unread
from brain.compaction import is_note, live, note_message, note_text, smaller, summarise
from brain.context import fit, limit_of, shaped
from brain.delegation import Delegations, child_session, is_delegate
from brain.deps import TurnDeps
from brain.hands_calls import HandsCalls, call_deadline_s
from brain.llm import (
    NOT_CONFIGURED,
    LLMError,
    ToolCall,
    resolve_model,
)
from brain.loop_detector import LoopDetector
from brain.model_calls import ModelCalls
from brain.model_table import context_window
from brain.pause import pause
from brain.plan import plan
from brain.prompt import context_prompt, system_prompt
from brain.resume import call_id_of, finished_answer
from brain.session_order import Lease
from brain.spend import BudgetExceeded
from brain.stream import Deltas
from brain.tokens import count, exceeds
from brain.tool_text import MAX_ARGS_DEPTH, depth, error_for_model, for_model, local_failure, summary
from brain.usage import TurnLimits, TurnUsage
from bus import trace
from bus.carry import together
from bus.log import kv
from bus.loops import ready
from bus.protocol import (
    ChatDelta,
    ChatError,
    ChatMessage,
    ChatReply,
    ChatTool,
    ErrorCode,
    Message,
    PriorResult,
    ToolResult,
    ToolSpec,
    now_ms,
)
from memory.flight import Step
from memory.longterm import Notes
from memory.sessions import Marks, TranscriptEntry

log = logging.getLogger("brain.turn")


NOTES_TOOL = "memory_read"  # a turn that offers it shows the model the names of the notes it may read


@dataclass(frozen=True)
class FirstReads:
    """What a turn reads before the model hears its message, when it was read with the session's taking:
    the transcript (None when the list moved under what this Brain held), the digest of Hands' tools, and
    the notes (None when not read: the tools last listed for the sender did not offer them)."""

    history: list[TranscriptEntry] | None = None
    digest: bytes | Unread | None = UNREAD
    notes: Notes | None = None

    @staticmethod
    def carried(deps: TurnDeps, message: ChatMessage) -> tuple[Callable[[Any], object],
                                                                Callable[[list[Any]], FirstReads]]:
        """The commands to send with the session's taking, and what reads their results."""
        notes = deps.memory.listing(message.agent_id, owner=message.sender) \
            if deps.catalog.offers(message.agent_id, message.sender, NOTES_TOOL) else None
        build, split = together([deps.sessions.reading(message.session_id), deps.catalog.digest_read(), notes])
        return build, lambda results: FirstReads(*split(results))


class Turn:
    """Runs one ``chat:message`` to its end; always finishes with a ``chat:reply`` or ``chat:error``.

    A turn redelivered after its Brain died picks up from the transcript: the
    calls already answered there are not sent again, and the ones that were in
    flight keep their call ids (derived from the message and the model's call),
    so Hands can answer them from its record instead of running them twice.
    """

    def __init__(self, deps: TurnDeps, message: ChatMessage, lease: Lease | None = None, *,
                 first: FirstReads | None = None) -> None:
        self.deps, self.message = deps, message
        self.first = first or FirstReads()  # what was read when the session was taken (the rest is read now)
        self.lease = lease or Lease(message.session_id)
        settings = deps.settings
        self.used, self.limits = TurnUsage(), TurnLimits.of(settings)
        big = 10**9  # a threshold of 0 is off
        self.loops = LoopDetector(warn_at=settings.loop_warn_at or big, stop_at=settings.loop_stop_at or big) \
            if settings.loop_warn_at or settings.loop_stop_at else None
        self.unanswered: list[ToolCall] = []  # the model's tool calls still without a result
        self.window_tokens = settings.context_window_tokens or context_window(resolve_model(settings.model) or "")
        self.call_ids: dict[str, str] = {}  # the model's call id -> ours, for the latest response
        self.hands = HandsCalls(deps.bus, deps.inbox, message, settings.tool_deadline_s, self._publish)
        self.delegations = Delegations(bus=deps.bus, sessions=deps.sessions, inbox=deps.inbox, settings=settings,
                                       message=message)
        self.deadline_ms = 0  # when the turn's time runs out (a sub-agent's: its tree's, if sooner)
        # Compaction (brain/compaction.py): the session's note, the earlier entries it does not cover yet, and
        # whether this turn has compacted (once at most) or retried after the provider said it was too long.
        self.system: dict[str, Any] = {}  # the stable head: the agent's instructions and skills
        self.context: list[dict[str, Any]] = []  # what may change between turns: the client's words, memory notes
        self.note: str | None = None
        self.head = 1  # the messages every request starts with: the instructions, the note (once made), the context
        self.live_before: list[TranscriptEntry] = []
        self.history_start = 0
        self.compacted = self.overflowed = False
        self.deltas = Deltas(self._stream_text, settings.stream_every_ms / 1000)
        self.model_calls = ModelCalls(deps, message, self.used, self.deltas)

    async def run(self) -> ChatReply | ChatError:
        """The final event; deltas and tool events are published as they happen."""
        msg, deps = self.message, self.deps
        before, turn, kept = await self._transcript()
        finished = finished_answer(msg, turn)
        if finished is not None:  # the Brain that ran it died before answering: answer from the record
            await kept
            return finished
        try:
            # The tools and notes, unless read with the session's taking (FirstReads), are read while
            # the message is on its way to the transcript; it is kept before anything answers it.
            first = self.first
            tools, skills = await deps.catalog.lookup(msg.agent_id, msg.sender, announced=first.digest)
            notes = (first.notes if first.notes is not None else
                     await deps.memory.list(msg.agent_id, owner=msg.sender)) \
                if any(t.name == NOTES_TOOL for t in tools) else []
        except NoHandsAvailable as exc:
            await kept
            return self._error(ErrorCode.SERVICE_UNAVAILABLE, str(exc))
        except BaseException:
            await asyncio.gather(kept, return_exceptions=True)  # heard, so its failure is not logged as lost
            raise
        await kept
        if deps.llm is None:
            return self._error(ErrorCode.MODEL_NOT_CONFIGURED, NOT_CONFIGURED)
        # The stable head first, byte for byte the same every turn (a provider's prompt cache reads it); what
        # changes between turns after it (brain/prompt.py).
        self.system = {"role": "system", "content": system_prompt(deps.settings.instructions, skills)}
        context = context_prompt(notes, client=msg.instructions)
        self.context = [{"role": "system", "content": context}] if context else []
        state = live(before, turn)
        self.note, self.live_before, self.compacted = state.note, state.entries, state.compacted_now
        self.history_start = len(before)
        messages = [self.system, *([note_message(state.note)] if state.note else []), *self.context]
        self.head = len(messages)  # the messages every request starts with: instructions, the note, the context
        messages += [entry.to_llm() for entry in state.entries]  # live() left the notes out of these
        messages += [entry.to_llm() for entry in turn if not is_note(entry)]
        alone = shaped([self.system, *self.context, turn[0].to_llm()], deps.settings.tool_result_max_tokens)
        if exceeds(alone, limit_of(self.window_tokens)):  # no summary or cut can help: say so before any model call
            return await self.stop(ErrorCode.BUDGET_EXHAUSTED, "the instructions and this message take "
                                   f"{count(alone):,} tokens, more than the {limit_of(self.window_tokens):,} the "
                                   "model's window leaves for them (brain.context_window_tokens, brain.instructions)")
        limit_s = deps.settings.max_turn_s
        if msg.delegation is not None:  # a sub-agent: its tree's time, if that ends sooner
            limit_s = min(limit_s, (msg.delegation.deadline - now_ms()) / 1000)
        self.deadline_ms = now_ms() + int(limit_s * 1000)
        delegations = self.delegations
        delegations.tool_name = next((t.name for t in tools if is_delegate(t)), None)
        if msg.delegation is not None:
            delegations.start_tree(self.deadline_ms)
        try:
            async with asyncio.timeout(max(0.0, limit_s)):
                final = await self._loop(messages, tools, self.head + len(state.entries), turn)
        except TimeoutError:
            whose = "" if limit_s == deps.settings.max_turn_s else ", shared with the turn that delegated"
            final = await self.stop(ErrorCode.BUDGET_EXHAUSTED, f"the turn ran out of time (brain.max_turn_s = "
                                    f"{deps.settings.max_turn_s:g}s{whose})")
        except LLMError as exc:
            final = self._error(exc.code, exc.message)
        await delegations.account(self.used.totals())  # the tree sees this turn's last model call
        return final

    async def _transcript(self) -> tuple[list[TranscriptEntry], list[TranscriptEntry], Awaitable[object]]:
        """The session before this message, this message's turn so far, and its keeping: a new message's
        append, queued (awaited by the caller before the model hears it)."""
        msg, sessions = self.message, self.deps.sessions
        history = self.first.history if self.first.history is not None else await sessions.load(msg.session_id)
        # The raw field first: a new message (the usual case) is then checked against no entry's typed marks.
        start = next((i for i in range(len(history) - 1, -1, -1) if history[i].role == "user"
                      and history[i].metadata.get("message_id") == msg.message_id
                      and history[i].marks.message_id == msg.message_id), None)
        if start is not None:
            log.info("turn resumed from the transcript %s",
                     kv(session=msg.session_id, message=msg.message_id, entries=len(history) - start))
            return history[:start], history[start:], ready()
        user = self._entry(role="user", content=msg.text, sender=msg.sender,
                           trace_id=trace.trace_id(trace.current.get()))
        kept = sessions.append(msg.session_id, user)
        await self._record("turn", text=msg.text, sender=msg.sender, agent=msg.agent_id,
                           instructions=msg.instructions, job=msg.job)
        return history, [user], kept

    async def _loop(self, messages: list[dict[str, Any]], tools: list[ToolSpec], turn_starts: int,
                    turn: list[TranscriptEntry]) -> ChatReply | ChatError:
        deps, msg = self.deps, self.message
        budget = deps.settings
        specs = {spec.name: spec for spec in tools}
        if not self.delegations.may_delegate:  # not offered past the depth limit (a call of it is refused, saying so)
            tools = [spec for spec in tools if not is_delegate(spec)]
        iteration = self._restore(turn)
        if self.unanswered:  # a resumed turn: the calls its last response made that have no result yet
            stop = await self._act(messages, specs)
            if stop:
                return stop
        while True:
            iteration += 1
            if over := self.limits.before_request(self.used, iteration) or await self._tree_exceeded():
                return await self.stop(ErrorCode.BUDGET_EXHAUSTED, over)
            self.lease.check()
            if not self.compacted and turn_starts > self.head and budget.compaction.enabled and \
                    exceeds(shaped(messages, budget.tool_result_max_tokens), limit_of(self.window_tokens)):
                turn_starts = await self._compact(messages, turn_starts)
            shown = fit(messages, window_tokens=self.window_tokens, result_tokens=budget.tool_result_max_tokens,
                        keep_from=turn_starts, pinned=self.head)
            try:
                try:
                    completion = await self.model_calls.call(shown, tools)
                except LLMError as exc:
                    if not exc.overflow or self.overflowed:
                        raise
                    # The provider counts more than we did: compact now (if not yet) and fit to half the window,
                    # once; a second overflow ends the turn with the provider's words.
                    self.overflowed = True
                    log.info("the provider says the conversation is too long %s", kv(session=msg.session_id))
                    if not self.compacted and turn_starts > self.head and budget.compaction.enabled:
                        turn_starts = await self._compact(messages, turn_starts)
                    shown = fit(messages, window_tokens=self.window_tokens // 2,
                                result_tokens=budget.tool_result_max_tokens // 2, keep_from=turn_starts,
                                pinned=self.head)
                    completion = await self.model_calls.call(shown, tools)
            except BudgetExceeded as exc:
                return await self.stop(ErrorCode.BUDGET_EXCEEDED, str(exc))
            final = not completion.tool_calls
            assistant = self._entry(role="assistant", content=completion.text or None,
                                    tool_calls=[call.to_openai() for call in completion.tool_calls] or None,
                                    **Marks(model=completion.model, iteration=iteration, usage=dict(self.used.tokens),
                                            final=final).metadata())
            await deps.sessions.append(msg.session_id, assistant)
            messages.append(assistant.to_llm())
            self.unanswered = list(completion.tool_calls)
            self._number(completion.tool_calls, iteration)
            await pause("answered", deps.pause_at)
            if final:
                log.info("turn done %s", kv(session=msg.session_id, message=msg.message_id, iterations=iteration))
                return ChatReply(session_id=msg.session_id, message_id=msg.message_id, text=completion.text,
                                 model=completion.model, usage=self.used.tokens)
            asking = len(completion.tool_calls)
            if over := self.limits.before_tools(self.used, asking) or await self._tree_exceeded(asking=asking):
                return await self.stop(ErrorCode.BUDGET_EXHAUSTED, over)
            self.used.add_calls(call.name for call in completion.tool_calls)
            stop = await self._act(messages, specs)
            if stop:
                return stop

    async def _compact(self, messages: list[dict[str, Any]], turn_starts: int) -> int:
        """Replace the earlier turns (``messages[:turn_starts]`` after the instructions) by a note the session
        keeps; where the turn starts now. Once per turn; a note no smaller than what it replaces is not kept."""
        self.compacted = True
        msg = self.message

        async def ask(shown: list[dict[str, Any]], budget: int) -> str:
            done = await self.model_calls.call(shown, [], quiet=True, max_output_tokens=budget)
            return str(done.text)

        summary, method = await summarise(ask, self.note, self.live_before, window=self.window_tokens,
                                          share=self.deps.settings.compaction.summary_share)
        if not smaller(summary, self.live_before, self.note):
            log.info("compaction not kept: no smaller %s", kv(session=msg.session_id, method=method))
            return turn_starts
        entry = self._entry(role="assistant", content=note_text(summary, method),
                            **Marks(summary_until=self.history_start, compaction=method).metadata())
        await self.deps.sessions.append(msg.session_id, entry)
        self.note, self.live_before = entry.content, []
        await self._record("compaction", method=method, replaced=self.history_start)
        messages[:turn_starts] = [self.system, note_message(entry.content or ""), *self.context]
        self.head = 2 + len(self.context)
        log.info("earlier turns compacted %s", kv(session=msg.session_id, entries=self.history_start, method=method))
        return self.head

    async def _tree_exceeded(self, *, asking: int = 0) -> str | None:
        """Why the delegation tree this turn is part of may not go on (None: it may, or there is none)."""
        tree = self.delegations.tree
        used = await self.delegations.account(self.used.totals(), asking=asking)  # the calls kept for us, if they fit
        return None if tree is None or used is None else tree.limits.exceeded(used)

    def _restore(self, turn: list[TranscriptEntry]) -> int:
        """Counters of a resumed turn, and the calls of its last response still without a result."""
        answered = {entry.tool_call_id for entry in turn if entry.role == "tool"}
        iteration = 0
        for entry in turn:
            if entry.role != "assistant" or is_note(entry):
                continue
            iteration = entry.marks.iteration if entry.marks.iteration is not None else iteration + 1
            calls = [ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                     for c in entry.tool_calls or ()]
            self.used.model_calls += 1
            self.used.add_calls(call.name for call in calls)
            self.unanswered = [call for call in calls if call.id not in answered]
            self._number(calls, iteration)
            self.used.tokens = dict(entry.marks.usage or self.used.tokens)
        return iteration

    def _number(self, calls: list[ToolCall], iteration: int) -> None:
        """Our ids for a response's calls: the same in every Brain that runs this turn."""
        self.call_ids = {call.id: call_id_of(self.message.message_id, iteration, index, call.id)
                         for index, call in enumerate(calls)}
        for call in calls:
            if call.name == self.delegations.tool_name:
                self.delegations.number(self.call_ids[call.id])

    async def _act(self, messages: list[dict[str, Any]], specs: dict[str, ToolSpec]) -> ChatError | None:
        """Run the unanswered calls of the last response: in parallel, or after the calls they depend on."""
        self.lease.check()
        calls, order = self.unanswered, plan(self.unanswered, specs)
        finished = [asyncio.Event() for _ in calls]
        results: list[ToolResult | None] = [None] * len(calls)
        stop: str | None = None

        async def run(index: int) -> None:
            nonlocal stop
            call = calls[index]
            for earlier in order.waits[index]:
                await finished[earlier].wait()
            call_id = self.call_ids[call.id]
            if index in order.refused:
                result = local_failure(call_id, call.name, ErrorCode.INVALID_ARGUMENTS, order.refused[index])
            else:
                prior = [PriorResult(call_id=r.call_id, tool=calls[i].name, success=r.success, data=r.data)
                         for i in sorted(order.waits[index]) if (r := results[i]) is not None]
                result = await self._call(call_id, call, specs, prior)
            entry = self._tool_entry(call, result)
            await self._record("tool", call_id=call_id, model_call_id=call.id, tool=call.name,
                               arguments=call.arguments, **{k: v for k, v in entry.metadata.items()
                                                            if k not in ("message_id", "call_id")},
                               result=entry.content)
            verdict = self.loops.observe(call, result) if self.loops else None
            if verdict and verdict.warning:
                entry.content = f"{entry.content}\n\n{verdict.warning}"
            stop = stop or (verdict.stop if verdict else None)
            await self.deps.sessions.append(self.message.session_id, entry)  # kept at once: a resumed turn skips it
            results[index] = result
            self.unanswered = [c for c in self.unanswered if c is not call]
            messages_by_index[index] = entry.to_llm()
            finished[index].set()

        messages_by_index: dict[int, dict[str, Any]] = {}
        # Waiting on sub-agents, the turn lends its slot out: with every slot held by a waiting parent,
        # the children could never start.
        aside = any(is_delegate(specs.get(call.name)) for call in calls) and self.deps.set_aside()
        await asyncio.gather(*(run(index) for index in range(len(calls))))
        if aside:
            await self.deps.take_back()
        messages.extend(messages_by_index[index] for index in range(len(calls)))
        if stop:
            return await self.stop(ErrorCode.LOOP_DETECTED, stop)
        await pause("results", self.deps.pause_at)
        return None

    async def _call(self, call_id: str, call: ToolCall, specs: dict[str, ToolSpec],
                    prior: list[PriorResult]) -> ToolResult:
        """Run one tool call in Hands; every path ends in a result, never a hang."""
        msg = self.message
        await self._publish(ChatTool(session_id=msg.session_id, message_id=msg.message_id, call_id=call_id,
                                     tool=call.name, status="started", summary=summary(call),
                                     arguments=(call.arguments or "{}")[:4000]))
        try:
            args = json.loads(call.arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError(f"expected a JSON object, got {type(args).__name__}")
            if depth(args) > MAX_ARGS_DEPTH:  # no tool takes such; the wire could not carry it anyway
                raise ValueError(f"they nest deeper than {MAX_ARGS_DEPTH} levels")
        except (ValueError, RecursionError) as exc:
            result = local_failure(call_id, call.name, ErrorCode.INVALID_ARGUMENTS,
                                    f"the arguments are not a JSON object ({exc}); send them as a JSON object")
        else:
            if call.name not in specs:
                result = local_failure(
                    call_id, call.name, ErrorCode.TOOL_NOT_FOUND,
                    f"no tool named {call.name!r}; available tools: {', '.join(sorted(specs)) or '(none)'}",
                )
            elif is_delegate(specs[call.name]):
                result = await self.delegations.run(call_id, args, specs[call.name], self.used.totals(), self._publish,
                                                    self.deadline_ms)
            else:
                result = await self.hands.execute(call_id, call.name, args, prior, deadline_s=call_deadline_s(
                    specs[call.name], self.hands.deadline_s, (self.deadline_ms - now_ms()) / 1000))
        error = result.error
        answered = result.data.get("answer") if error is None and isinstance(result.data, dict) and \
            is_delegate(specs.get(call.name)) else None
        await self._publish(ChatTool(
            session_id=msg.session_id, message_id=msg.message_id, call_id=call_id, tool=call.name,
            status="finished", summary="ok" if error is None else f"{error.code}: {error.message}"[:300],
            error_code=None if error is None else error.code.value, duration_ms=result.metadata.duration_ms,
            sandbox=result.metadata.sandbox, answer=str(answered)[:4000] if answered is not None else None,
        ))
        return result

    def cancelled(self, by: str) -> ChatError:
        """A turn cancelled before it started: nothing to stop, nothing recorded."""
        return ChatError(session_id=self.message.session_id, message_id=self.message.message_id,
                         code=ErrorCode.CANCELLED, message=f"the turn was cancelled by {by} before it started")

    async def cancel(self, by: str) -> ChatError:
        """End a turn the person stopped."""
        return await self.stop(ErrorCode.CANCELLED, f"the turn was cancelled by {by or 'the person'}")

    async def stop(self, code: ErrorCode, reason: str) -> ChatError:
        """End the turn early: stop its tool calls in Hands, close them in the transcript, say what was done."""
        deps, msg = self.deps, self.message
        await self.delegations.cancel(reason)
        await self.hands.stop(reason)
        stopped = [self._entry(role="tool", tool_call_id=call.id, name=call.name, cancelled=True,
                               content=error_for_model(ErrorCode.CANCELLED, reason))
                   for call in self.unanswered]
        told = (f"{reason}; {len(stopped)} tool call(s) stopped. Done so far: {self.used.said()}; "
                "the results are in the session transcript")
        note = self._entry(role="assistant", content=f"[{reason}]",
                           **Marks(cancelled=True, stopped=code.value, told=told).metadata())
        await deps.sessions.append(msg.session_id, *stopped, note)
        await self._record("stop", code=code.value, reason=reason, calls_stopped=len(stopped))
        log.info("turn stopped %s: %s", kv(session=msg.session_id, message=msg.message_id, code=code), reason)
        return ChatError(session_id=msg.session_id, message_id=msg.message_id, code=code, message=told)

    def _entry(self, *, role: Any, content: str | None = None, tool_calls: list[dict[str, Any]] | None = None,
               tool_call_id: str | None = None, name: str | None = None, **metadata: Any) -> TranscriptEntry:
        """A transcript entry of this turn (tagged with its message id, so a resumed turn finds it)."""
        return TranscriptEntry(role=role, content=content, tool_calls=tool_calls, tool_call_id=tool_call_id,
                               name=name, metadata={"message_id": self.message.message_id, **metadata})

    def _tool_entry(self, call: ToolCall, result: ToolResult) -> TranscriptEntry:
        child: dict[str, Any] = {"child_session": child_session(self.message.session_id, result.call_id)} \
            if result.metadata.worker_id.startswith("agent:") else {}  # a sub-agent ran: where to read it
        return self._entry(
            role="tool", tool_call_id=call.id, name=call.name, content=for_model(result),
            call_id=result.call_id, success=result.success, worker_id=result.metadata.worker_id,
            duration_ms=result.metadata.duration_ms, truncated=result.metadata.truncated,
            attempts=result.metadata.attempts, sandbox=result.metadata.sandbox,
            **child,
            **({"error_code": result.error.code.value} if result.error else {}),  # type: ignore[arg-type]  # metadata
        )

    async def _record(self, kind: Any, **data: Any) -> None:
        """A step of this turn in the session's flight record (when it is kept)."""
        if self.deps.recorder is not None:
            await self.deps.recorder.write(self.message.session_id,
                                           Step(kind=kind, message_id=self.message.message_id, data=data))

    def _stream_text(self, text: str) -> None:
        self._publish_now(ChatDelta(session_id=self.message.session_id, message_id=self.message.message_id,
                                    text=text))

    async def _publish(self, event: Message) -> None:
        self._publish_now(event)

    def _publish_now(self, event: Message) -> None:
        """Events to the person's Gateway go out in order, with the next write, not awaited one by one."""
        if self.message.job and isinstance(event, (ChatDelta, ChatTool)):
            return  # a job's turn has nobody watching it live: only its end is read (and recorded)
        if self.message.delegation and isinstance(event, ChatDelta):
            return  # a sub-agent's words go back as its answer; its parent shows its tool calls
        self.deps.bus.send(self.message.reply_to, event)

    def _error(self, code: ErrorCode, message: str) -> ChatError:
        log.warning("turn failed %s: %s", kv(session=self.message.session_id, code=code), message)
        return ChatError(session_id=self.message.session_id, message_id=self.message.message_id, code=code,
                         message=message)
