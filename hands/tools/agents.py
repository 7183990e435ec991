"""The delegate tool: listed by Hands (so the tool policy offers or withholds it like any tool), run by the
Brain, which starts the sub-agent's turn on the bus (brain/delegation.py)."""

from __future__ import annotations

from typing import Any

from bus.protocol import ErrorCode
from hands.errors import ToolFailure
from hands.registry import Category, ToolContext, ToolDefinition

DELEGATE = "delegate"


async def delegate(_args: dict[str, Any], _ctx: ToolContext) -> None:
    raise ToolFailure(ErrorCode.UNSUPPORTED, "delegate runs inside an agent's turn (a Brain starts the sub-agent); "
                      "it cannot be called on its own", retryable=False)


AGENT_TOOLS = [
    ToolDefinition(
        name=DELEGATE,
        description=("Hand a task to a sub-agent, which works on it with its own tools and answers with its result. "
                     "Several delegate calls in one response run at the same time. Say in task exactly what to do "
                     "and what to return; put what it needs to know in context. agent: another agent to do it "
                     "(by default, one like you)."),
        parameters={"type": "object", "properties": {
            "task": {"type": "string", "minLength": 1, "maxLength": 32_000},
            "agent": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"},
            "context": {"type": "string", "maxLength": 32_000},
        }, "required": ["task"], "additionalProperties": False},
        handler=delegate, category=Category.AGENT, idempotent=False,
    ),
]
