"""Memory tools: the agent's long-term notes, kept by memory/ and shared by all workers."""

from __future__ import annotations

from typing import Any

from bus.protocol import ErrorCode
from hands.errors import ToolFailure
from hands.notes import CallersNotes, NotAnOwner
from hands.registry import Category, ToolContext, ToolDefinition
from memory.longterm import NoteRefused

MAX_NOTE_CHARS = 100_000
_KEY = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$",
        "description": "Name of the note (letters, digits, _ . -)"}


def _store(ctx: ToolContext) -> CallersNotes:
    if ctx.memory is None:
        raise ToolFailure(ErrorCode.SERVICE_UNAVAILABLE, "long-term memory is not available on this worker",
                          retryable=False)
    return ctx.memory


async def memory_write(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    shared = bool(args.get("shared"))
    try:
        content = await _store(ctx).write(ctx.agent_id, args["key"], args["content"], append=args.get("append", False),
                                          shared=shared)
    except NotAnOwner as exc:
        raise ToolFailure(ErrorCode.PERMISSION_DENIED, str(exc), suggestions=["write it as your own note"]) from None
    except NoteRefused as exc:
        raise ToolFailure(ErrorCode.RESOURCE_EXHAUSTED, str(exc),
                          suggestions=["write a shorter note, split it, or replace an old one"]) from None
    return {"key": args["key"], "chars": len(content), "appended": bool(args.get("append")),
            "scope": "shared" if shared else "own"}


async def memory_delete(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    shared = bool(args.get("shared"))
    store = _store(ctx)
    try:
        deleted = await store.delete(ctx.agent_id, args["key"], shared=shared)
    except NotAnOwner as exc:
        raise ToolFailure(ErrorCode.PERMISSION_DENIED, str(exc), suggestions=["delete your own note"]) from None
    if not deleted:
        known = [note["key"] for note in await store.list(ctx.agent_id)
                 if note["scope"] == ("shared" if shared else "own")]
        raise ToolFailure(ErrorCode.FILE_NOT_FOUND,
                          f"no {'shared' if shared else 'own'} memory note named {args['key']!r}; those notes: "
                          f"{', '.join(known) or '(none)'}",
                          suggestions=["call memory_read without a key to list the notes"])
    return {"key": args["key"], "deleted": True, "scope": "shared" if shared else "own"}


async def memory_read(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    store = _store(ctx)
    key = args.get("key")
    if key is None:
        return {"notes": await store.list(ctx.agent_id)}
    found = await store.find(ctx.agent_id, key)
    if found is None:
        known = [note["key"] for note in await store.list(ctx.agent_id)]
        raise ToolFailure(
            ErrorCode.FILE_NOT_FOUND,
            f"no memory note named {key!r}; notes: {', '.join(known) or '(none)'}",
            suggestions=["call memory_read without a key to list the notes"],
        )
    content, scope = found
    return {"key": key, "content": content, "scope": scope}


async def memory_search(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"query": args["query"], "hits": await _store(ctx).search(ctx.agent_id, args["query"],
                                                                      limit=args.get("limit", 10))}


MEMORY_TOOLS = [
    ToolDefinition(
        name="memory_write",
        description=("Save a note in your long-term memory of the person you are talking to (kept across sessions, "
                     "theirs alone). append adds to it; shared: true writes a note every person reads (owners only)."),
        parameters={"type": "object", "properties": {
            "key": _KEY,
            "content": {"type": "string", "maxLength": MAX_NOTE_CHARS},
            "append": {"type": "boolean", "default": False},
            "shared": {"type": "boolean", "default": False},
        }, "required": ["key", "content"], "additionalProperties": False},
        handler=memory_write, category=Category.MEMORY, idempotent=False,
    ),
    ToolDefinition(
        name="memory_delete",
        description=("Delete a note from long-term memory for good (the person's own; shared: true deletes a shared "
                     "note, owners only). Search no longer finds it."),
        parameters={"type": "object", "properties": {
            "key": _KEY,
            "shared": {"type": "boolean", "default": False},
        }, "required": ["key"], "additionalProperties": False},
        handler=memory_delete, category=Category.MEMORY, idempotent=False,
    ),
    ToolDefinition(
        name="memory_read",
        description=("Read a note from long-term memory (the person's own, else a shared one); without a key, list "
                     "the notes."),
        parameters={"type": "object", "properties": {"key": _KEY}, "additionalProperties": False},
        handler=memory_read, category=Category.MEMORY,
    ),
    ToolDefinition(
        name="memory_search",
        description=("Search long-term memory: the person's notes, the shared notes and your earlier conversations "
                     "with this person, best match first; each hit says where it is from and when."),
        parameters={"type": "object", "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 500},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
        }, "required": ["query"], "additionalProperties": False},
        handler=memory_search, category=Category.MEMORY,
    ),
]
