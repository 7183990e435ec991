"""A fake LLM behind the Brain's seam, for integration tests of turns."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from brain.llm import Completion, ToolCall
from bus.protocol import ToolSpec
from hands.registry import Category, ToolDefinition


class FakeLLM:
    """Answers with whatever ``script(messages)`` returns; keeps every conversation it saw."""

    def __init__(self, script: Callable[[list[dict[str, Any]]], Completion]) -> None:
        self.script, self.seen = script, []

    async def complete(self, messages, tools: list[ToolSpec], on_text) -> Completion:
        self.seen.append([dict(m) for m in messages])
        done = self.script(messages)
        if done.text:
            await on_text(done.text)
        return done


def call(name: str, args: Any, n: int = 0) -> ToolCall:
    return ToolCall(id=f"call_{n}", name=name, arguments=args if isinstance(args, str) else json.dumps(args))


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
