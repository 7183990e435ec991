"""Memory tools: the agent's long-term notes, kept by memory/ and shared by all workers."""

from __future__ import annotations

from typing import Any

from bus.protocol import ErrorCode
from hands.errors import ToolFailure
from hands.registry import Category, ToolContext, ToolDefinition
from memory.longterm import SHARED, NoteRefused

MAX_NOTE_CHARS = 100_000
_KEY = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$",
        "description": "Name of the note (letters, digits, _ . -)"}


def _store(ctx: ToolContext) -> Any:
    if ctx.memory is None:
        raise ToolFailure(ErrorCode.SERVICE_UNAVAILABLE, "long-term memory is not available on this worker",
                          retryable=False)
    return ctx.memory


def _owner(ctx: ToolContext) -> str:
    """Whose notes a call reads and writes: its sender's. A call without one (a client of the bus itself,
    which holds Redis and so is an operator) uses the agent's shared notes."""
    return ctx.call.sender if ctx.call is not None else SHARED


async def memory_write(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    owner = _owner(ctx)
    if args.get("shared"):
        if owner != SHARED and owner not in ctx.settings.tools.owners:
            raise ToolFailure(ErrorCode.PERMISSION_DENIED, f"only the pool's owners write shared notes (hands.tools."
                              f"owners), and {owner!r} is not one", suggestions=["write it as your own note"])
        owner = SHARED
    try:
        content = await _store(ctx).write(ctx.agent_id, args["key"], args["content"], owner=owner,
                                          append=args.get("append", False))
    except NoteRefused as exc:
        raise ToolFailure(ErrorCode.RESOURCE_EXHAUSTED, str(exc),
                          suggestions=["write a shorter note, split it, or replace an old one"]) from None
    return {"key": args["key"], "chars": len(content), "appended": bool(args.get("append")),
            "scope": "shared" if owner == SHARED else "own"}


async def memory_read(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    store, owner = _store(ctx), _owner(ctx)
    key = args.get("key")
    if key is None:
        return {"notes": await store.list(ctx.agent_id, owner=owner)}
    found = await store.read(ctx.agent_id, key, owner=owner)
    if found is None:
        known = [note["key"] for note in await store.list(ctx.agent_id, owner=owner)]
        raise ToolFailure(
            ErrorCode.FILE_NOT_FOUND,
            f"no memory note named {key!r}; notes: {', '.join(known) or '(none)'}",
            suggestions=["call memory_read without a key to list the notes"],
        )
    content, scope = found
    return {"key": key, "content": content, "scope": scope}


async def memory_search(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    turn = ctx.call.message_id if ctx.call is not None else ""  # its own words are not memory yet
    return {"query": args["query"], "hits": await _store(ctx).search(ctx.agent_id, args["query"], owner=_owner(ctx),
                                                                      limit=args.get("limit", 10), turn=turn)}


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
