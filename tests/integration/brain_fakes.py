"""A fake LLM behind the Brain's seam, for integration tests of turns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from brain.llm import Completion, ToolCall
from brain.testing import FunctionModel, tool_call
from hands.registry import Category, ToolDefinition


class FakeLLM(FunctionModel):
    """The shipped FunctionModel (brain.testing), for scripts that only read the messages."""

    def __init__(self, script: Callable[[list[dict[str, Any]]], Completion]) -> None:
        super().__init__(lambda messages, _tools: script(messages))


def call(name: str, args: Any, n: int = 0) -> ToolCall:
    return tool_call(name, args, f"call_{n}")


def read_then_answer(messages):
    if messages[-1]["role"] == "tool":
        return Completion(text=f"file says {messages[-1]['content']}", model="fake")
    return Completion(tool_calls=[call("read_file", {"path": "a.txt"})], model="fake")


class Endless:
    """A tool that never finishes on its own: ``started`` when a call begins, ``stopped`` when it is stopped."""

    def __init__(self, name: str) -> None:
        self.started, self.stopped = asyncio.Event(), asyncio.Event()
        self.tool = ToolDefinition(name=name, description="", parameters={"type": "object"}, handler=self._run,
                                   category=Category.SKILL)
        self.llm = FakeLLM(lambda _m: Completion(tool_calls=[call(name, {})]))  # a model that keeps calling it

    async def _run(self, _args: dict[str, Any], _ctx: Any) -> None:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            self.stopped.set()
