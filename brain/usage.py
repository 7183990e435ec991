"""What one turn has used, and the limits it may not pass: counted in one object, checked at two fixed points
(before each model request, before a response's tool calls run). After pydantic-ai's usage and usage limits.

The delegation tree's shared limits are the tree's (brain/delegation.py); these are the turn's own."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from brain.config import BrainSettings
from brain.delegation import Totals


@dataclass
class TurnUsage:
    tokens: dict[str, int] = field(default_factory=dict)  # the provider's counters, summed over the turn's calls
    cost_usd: float = 0.0
    model_calls: int = 0
    tool_calls: int = 0
    tools_used: list[str] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return self.tokens.get("total_tokens", 0)

    def add_tokens(self, usage: dict[str, Any]) -> None:
        for key, value in usage.items():
            if isinstance(value, int):
                self.tokens[key] = self.tokens.get(key, 0) + value

    def add_calls(self, names: Iterable[str]) -> None:
        """A response's tool calls, about to run (or, in a resumed turn, that ran)."""
        for name in names:
            self.tool_calls += 1
            self.tools_used.append(name)

    def totals(self) -> Totals:
        return Totals(tokens=self.total_tokens, cost_usd=self.cost_usd, tool_calls=self.tool_calls)

    def said(self) -> str:
        """The turn's work in a phrase, for a turn that is stopped."""
        tools = f" ({', '.join(sorted(set(self.tools_used)))})" if self.tools_used else ""
        return f"{self.model_calls} model call(s), {self.tool_calls} tool call(s){tools}, {self.total_tokens:,} tokens"


@dataclass(frozen=True)
class TurnLimits:
    max_iterations: int
    max_tokens: int
    max_tool_calls: int
    max_cost_usd: float | None

    @classmethod
    def of(cls, settings: BrainSettings) -> TurnLimits:
        return cls(max_iterations=settings.max_iterations, max_tokens=settings.max_tokens,
                   max_tool_calls=settings.max_tool_calls, max_cost_usd=settings.max_cost_usd)

    def before_request(self, used: TurnUsage, iteration: int) -> str | None:
        """Why the turn may not ask the model again (None: it may); ``iteration`` is the request's number."""
        if iteration > self.max_iterations:
            return f"the model made {self.max_iterations} calls without a final answer (brain.max_iterations)"
        if used.total_tokens >= self.max_tokens:
            return f"the turn used its tokens (brain.max_tokens = {self.max_tokens:,})"
        if self.max_cost_usd is not None and used.cost_usd >= self.max_cost_usd:
            return f"the turn spent its money (brain.max_cost_usd = {self.max_cost_usd:g})"
        return None

    def before_tools(self, used: TurnUsage, asking: int) -> str | None:
        """Why a response's ``asking`` tool calls may not run (None: they may)."""
        if used.tool_calls + asking > self.max_tool_calls:
            return (f"the model asked for more tool calls than the turn allows "
                    f"(brain.max_tool_calls = {self.max_tool_calls})")
        return None
