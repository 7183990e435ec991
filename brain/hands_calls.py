"""A turn's tool calls in Hands: each request sent, its progress shown, its result awaited (never a hang), and
the ones still running stopped when the turn ends early."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from brain.tool_text import local_failure
from bus.log import kv
from bus.protocol import (
    ChatMessage,
    ChatTool,
    ErrorCode,
    Message,
    PriorResult,
    ToolCancel,
    ToolExecute,
    ToolProgress,
    ToolResult,
    ToolSpec,
    now_ms,
)
from bus.streams import Bus

log = logging.getLogger("brain.turn")

PERSON = "person_interaction"  # ask_user's category in Hands' listing: its call waits for a person
PERSON_MARGIN_S = 5.0  # past the question's own wait: its no_answer still reaches the turn


def call_deadline_s(spec: ToolSpec | None, tool_deadline_s: float, turn_left_s: float) -> float:
    """How long a call may take: ``brain.tool_deadline_s``, or for a tool that waits for a person, as long as
    Hands says it waits (within what is left of the turn), never less."""
    meta = spec.meta if spec is not None else None
    if meta is None or meta.category != PERSON or meta.timeout_s is None:
        return tool_deadline_s
    return max(tool_deadline_s, min(meta.timeout_s + PERSON_MARGIN_S, turn_left_s))


class HandsCalls:
    def __init__(self, bus: Bus, inbox: Any, message: ChatMessage, deadline_s: float,
                 publish: Callable[[Message], Awaitable[None]]) -> None:
        self.bus, self.inbox, self.message, self.deadline_s, self.publish = bus, inbox, message, deadline_s, publish
        self.in_flight: set[str] = set()  # our call ids Hands is working on

    async def execute(self, call_id: str, tool: str, args: dict[str, Any], prior: list[PriorResult], *,
                      deadline_s: float | None = None) -> ToolResult:
        msg, deadline_s = self.message, deadline_s or self.deadline_s
        # A job's turn has nobody to ask: a command that needs a person's approval is refused at once.
        request = ToolExecute(call_id=call_id, tool=tool, args=args, session_id=msg.session_id,
                              agent_id=msg.agent_id, sender=msg.sender, agents=msg.agents,
                              reply_to=self.inbox.stream,
                              approvals_to="" if msg.job else msg.reply_to, message_id=msg.message_id, prior=prior,
                              deadline=now_ms() + int(deadline_s * 1000))
        log.info("tool call sent %s", kv(session=msg.session_id, call=call_id, tool=tool))

        async def relay(event: Message) -> None:
            if isinstance(event, ToolProgress):
                await self.publish(ChatTool(session_id=msg.session_id, message_id=msg.message_id, call_id=call_id,
                                            tool=tool, status="progress", summary=event.message[:300]))

        self.in_flight.add(call_id)  # left in place if the turn is cancelled: stop() stops it in Hands
        try:
            reply: Message = await self.inbox.request(self.bus.keys.hands_requests, request, call_id,
                                                      timeout=deadline_s + 1, final=(ToolResult,), on_event=relay)
        except TimeoutError:
            self.in_flight.discard(call_id)
            return local_failure(
                call_id, tool, ErrorCode.TIMEOUT,
                f"no Hands worker answered within {deadline_s:g}s; the tool may not have run. "
                "Is a Hands worker running (`pincer hands`)?",
                recoverable=True,
            )
        self.in_flight.discard(call_id)
        assert isinstance(reply, ToolResult)
        return reply

    async def stop(self, reason: str) -> None:
        """Stop every call still running, wherever it runs (the worker that has it answers CANCELLED)."""
        for call_id in list(self.in_flight):
            await self.bus.publish(self.bus.keys.hands_control, ToolCancel(call_id=call_id, reason=reason))
