"""File tools: read, write and list files beneath the workspace."""

from __future__ import annotations

import os
import stat
from typing import Any

from bus.protocol import ErrorCode
from hands.errors import ToolFailure, to_tool_error
from hands.permissions import Permissions
from hands.registry import Category, ToolContext, ToolDefinition
from hands.shaping import Batch

MAX_LIST_ENTRIES = 1000
_PERMS_READ = Permissions(filesystem_read=["{workspace}/**"])
_PERMS_WRITE = Permissions(filesystem_read=["{workspace}/**"], filesystem_write=["{workspace}/**"])


def read_file(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    path, offset, limit = args["path"], args.get("offset", 1), args.get("limit")
    with ctx.workspace.open_file(path, os.O_RDONLY) as fd:
        info = os.fstat(fd)
        if info.st_size > ctx.settings.max_file_bytes:
            raise ToolFailure(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"{path!r} is {info.st_size:,} bytes; the limit is {ctx.settings.max_file_bytes:,}",
                suggestions=["read a smaller file, or raise hands.max_file_bytes"],
            )
        with os.fdopen(os.dup(fd), "rb") as handle:
            raw = handle.read(ctx.settings.max_file_bytes + 1)
    try:
        text, binary = raw.decode("utf-8"), False
    except UnicodeDecodeError:
        text, binary = raw.decode("utf-8", errors="replace"), True
    lines = text.splitlines(keepends=True)
    chosen = lines[offset - 1 : None if limit is None else offset - 1 + limit]
    result: dict[str, Any] = {"path": path, "size": info.st_size, "total_lines": len(lines), "content": "".join(chosen)}
    if offset != 1 or limit is not None:
        result["lines"] = [offset, offset + len(chosen) - 1]
    if binary:
        result["binary"] = True
        result["note"] = "the file is not valid UTF-8; undecodable bytes are shown as U+FFFD"
    return result


def read_files(args: dict[str, Any], ctx: ToolContext) -> Batch:
    """Several files at once; each item succeeds or fails on its own."""
    items = []
    for path in args["paths"]:
        try:
            items.append({"path": path, "success": True, **_content_only(read_file({"path": path}, ctx))})
        except Exception as exc:  # one bad path must not sink the others
            error = to_tool_error(exc)
            items.append(
                {"path": path, "success": False, "error": {"code": error.code.value, "message": error.message}}
            )
    return Batch(items)


def _content_only(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "path"}


def write_file(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    path, content = args["path"], args["content"]
    mode = os.O_APPEND if args.get("append") else os.O_TRUNC
    data = content.encode("utf-8")
    if len(data) > ctx.settings.max_file_bytes:
        raise ToolFailure(
            ErrorCode.RESOURCE_EXHAUSTED,
            f"content is {len(data):,} bytes; the limit is {ctx.settings.max_file_bytes:,}",
        )
    ws = ctx.workspace
    with ws.open_file(path, os.O_WRONLY | os.O_CREAT | mode, create_dirs=args.get("create_dirs", True)) as fd:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    return {"path": path, "bytes_written": len(data), "appended": bool(args.get("append"))}


def list_directory(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    path = args.get("path", ".")
    entries: list[dict[str, Any]] = []
    with ctx.workspace.open_dir(path) as fd, os.scandir(fd) as it:
        for entry in it:
            info = entry.stat(follow_symlinks=False)
            entries.append({"name": entry.name, "type": _kind(info.st_mode), "size": info.st_size})
    entries.sort(key=lambda e: (e["type"] != "directory", e["name"]))
    result: dict[str, Any] = {"path": path, "entries": entries[:MAX_LIST_ENTRIES], "count": len(entries)}
    if len(entries) > MAX_LIST_ENTRIES:
        result["note"] = f"showing the first {MAX_LIST_ENTRIES} of {len(entries)} entries"
    return result


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


_PATH = {"type": "string", "minLength": 1, "maxLength": 4096, "description": "Path relative to the workspace"}

FILE_TOOLS = [
    ToolDefinition(
        name="read_file",
        description="Read a UTF-8 text file from the workspace. Use offset/limit (in lines) for big files.",
        parameters={
            "type": "object",
            "properties": {
                "path": _PATH,
                "offset": {"type": "integer", "minimum": 1, "description": "First line to read (1-based)"},
                "limit": {"type": "integer", "minimum": 1, "description": "How many lines to read"},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        handler=read_file,
        category=Category.FILE,
        permissions=_PERMS_READ,
    ),
    ToolDefinition(
        name="read_files",
        description="Read several text files at once; reports each file's content or error.",
        parameters={
            "type": "object",
            "properties": {"paths": {"type": "array", "items": _PATH, "minItems": 1, "maxItems": 50}},
            "required": ["paths"],
            "additionalProperties": False,
        },
        handler=read_files,
        category=Category.FILE,
        permissions=_PERMS_READ,
    ),
    ToolDefinition(
        name="write_file",
        description="Write (or append) UTF-8 text to a file in the workspace, creating parent directories.",
        parameters={
            "type": "object",
            "properties": {
                "path": _PATH,
                "content": {"type": "string", "description": "The text to write"},
                "append": {"type": "boolean", "default": False, "description": "Append instead of replacing"},
                "create_dirs": {"type": "boolean", "default": True, "description": "Create missing directories"},
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
        handler=write_file,
        category=Category.FILE,
        permissions=_PERMS_WRITE,
        idempotent=False,
    ),
    ToolDefinition(
        name="list_directory",
        description="List the entries of a directory in the workspace (name, type, size).",
        parameters={
            "type": "object",
            "properties": {"path": {**_PATH, "description": "Directory relative to the workspace (default '.')"}},
            "additionalProperties": False,
        },
        handler=list_directory,
        category=Category.FILE,
        permissions=_PERMS_READ,
    ),
]
