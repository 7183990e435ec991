"""A model you write as a function, for testing a Brain's turn (or anything that takes an ``LLMClient``).

    from brain.testing import FunctionModel, tool_call
    from brain.llm import Completion

    def model(messages, tools):
        if messages[-1]["role"] == "tool":
            return Completion(text="the file says " + messages[-1]["content"])
        return Completion(tool_calls=[tool_call("read_file", {"path": "a.txt"})])

    BrainWorker(bus, settings, llm=FunctionModel(model))

The function sees the conversation as the provider would (OpenAI-shaped
messages) and the tools offered; it may be async. Every conversation it was
shown is kept in ``seen``.
"""

from __future__ import annotations

import inspect
import itertools
import json
from collections.abc import Awaitable, Callable
from typing import Any

from brain.llm import Attempt, Completion, LLMClient, OnText, ToolCall
from bus.protocol import ToolSpec

ModelFunction = Callable[[list[dict[str, Any]], list[ToolSpec]], Completion | Awaitable[Completion]]

_ids = itertools.count()


def tool_call(name: str, args: dict[str, Any] | str, call_id: str | None = None) -> ToolCall:
    """A tool call as a model would write it (arguments as JSON text; a str is sent as it is, even invalid)."""
    return ToolCall(id=call_id or f"call_{next(_ids)}", name=name,
                    arguments=args if isinstance(args, str) else json.dumps(args))


class FunctionModel:
    """An ``LLMClient`` whose every answer is ``function(messages, tools)``; its text is streamed as one delta."""

    def __init__(self, function: ModelFunction) -> None:
        self.function = function
        self.seen: list[list[dict[str, Any]]] = []

    async def complete(self, messages: list[dict[str, Any]], tools: list[ToolSpec], on_text: OnText, *,
                       max_output_tokens: int | None = None, attempts: list[Attempt] | None = None) -> Completion:
        self.seen.append([dict(m) for m in messages])
        attempt = Attempt(model="")  # the configured model: the function answers for it
        if attempts is not None:
            attempts.append(attempt)
        answer = self.function(messages, tools)
        done = await answer if inspect.isawaitable(answer) else answer
        attempt.usage = done.usage
        for call in done.tool_calls:
            attempt.received(call.name + call.arguments)
        if done.text:
            attempt.received(done.text)
            await on_text(done.text)
        return done


_: type[LLMClient] = FunctionModel  # mypy keeps the fake true to the seam it stands for
