"""A tool call as the model and the person read it: results and errors as text, arguments checked.

The Brain's one home for what a model reads of its tool calls (a result, an
error with what to do next) and for the local failures it answers without
asking Hands (arguments that are not a JSON object, nest too deep, or name no tool).
"""

from __future__ import annotations

import json
from typing import Any

from brain.llm import ToolCall
from bus.protocol import ErrorCode, ResultMetadata, ToolError, ToolResult


def for_model(result: ToolResult) -> str:
    """The result as the model reads it: the data, or the error with what to do next."""
    if result.success:
        data = result.data
        return data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)
    error = result.error
    assert error is not None
    return error_for_model(error.code, error.message, recoverable=error.recoverable, suggestions=error.suggestions)


def error_for_model(code: ErrorCode, message: str, *, recoverable: bool | None = None,
                     suggestions: list[str] | None = None) -> str:
    """A failed call as the model reads it: the code, what happened, and what it may do next."""
    shown: dict[str, Any] = {"error": code.value, "message": message}
    if recoverable is not None:
        shown["recoverable"] = recoverable
    if suggestions:
        shown["suggestions"] = suggestions
    return json.dumps(shown, ensure_ascii=False)


def local_failure(call_id: str, tool: str, code: ErrorCode, message: str, *, recoverable: bool = True) -> ToolResult:
    return ToolResult(call_id=call_id, success=False, error=ToolError(code=code, message=message,
                      recoverable=recoverable), metadata=ResultMetadata(tool_name=tool, worker_id="brain"))


MAX_ARGS_DEPTH = 32


def depth(value: Any, level: int = 0) -> int:
    """How deeply ``value`` nests, counted no further than just past the limit."""
    if level > MAX_ARGS_DEPTH:
        return level
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return max((depth(child, level + 1) for child in children), default=level)


def summary(call: ToolCall) -> str:
    return f"{call.name}({call.arguments[:200]})"
