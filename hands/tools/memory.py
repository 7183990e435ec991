"""Memory tools: the agent's long-term notes, kept by memory/ and shared by all workers."""

from __future__ import annotations

from typing import Any

from bus.protocol import ErrorCode
from hands.errors import ToolFailure
from hands.registry import Category, ToolContext, ToolDefinition
from memory.longterm import NoteRefused

MAX_NOTE_CHARS = 100_000
_KEY = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$",
        "description": "Name of the note (letters, digits, _ . -)"}


def _store(ctx: ToolContext) -> Any:
    if ctx.memory is None:
        raise ToolFailure(ErrorCode.SERVICE_UNAVAILABLE, "long-term memory is not available on this worker",
                          retryable=False)
    return ctx.memory


async def memory_write(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    try:
        content = await _store(ctx).write(ctx.agent_id, args["key"], args["content"],
                                          append=args.get("append", False))
    except NoteRefused as exc:
        raise ToolFailure(ErrorCode.RESOURCE_EXHAUSTED, str(exc),
                          suggestions=["write a shorter note, split it, or replace an old one"]) from None
    return {"key": args["key"], "chars": len(content), "appended": bool(args.get("append"))}


async def memory_read(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    store = _store(ctx)
    key = args.get("key")
    if key is None:
        return {"notes": await store.list(ctx.agent_id)}
    content = await store.read(ctx.agent_id, key)
    if content is None:
        known = [note["key"] for note in await store.list(ctx.agent_id)]
        raise ToolFailure(
            ErrorCode.FILE_NOT_FOUND,
            f"no memory note named {key!r}; notes: {', '.join(known) or '(none)'}",
            suggestions=["call memory_read without a key to list the notes"],
        )
    return {"key": key, "content": content}


async def memory_search(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"query": args["query"], "notes": await _store(ctx).search(ctx.agent_id, args["query"],
                                                                       limit=args.get("limit", 10))}


MEMORY_TOOLS = [
    ToolDefinition(
        name="memory_write",
        description="Save a note in the agent's long-term memory (kept across sessions). append adds to it.",
        parameters={"type": "object", "properties": {
            "key": _KEY,
            "content": {"type": "string", "maxLength": MAX_NOTE_CHARS},
            "append": {"type": "boolean", "default": False},
        }, "required": ["key", "content"], "additionalProperties": False},
        handler=memory_write, category=Category.MEMORY, idempotent=False,
    ),
    ToolDefinition(
        name="memory_read",
        description="Read a note from the agent's long-term memory; without a key, list the notes.",
        parameters={"type": "object", "properties": {"key": _KEY}, "additionalProperties": False},
        handler=memory_read, category=Category.MEMORY,
    ),
    ToolDefinition(
        name="memory_search",
        description="Find notes in the agent's long-term memory that mention every word of a query.",
        parameters={"type": "object", "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 500},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
        }, "required": ["query"], "additionalProperties": False},
        handler=memory_search, category=Category.MEMORY,
    ),
]
