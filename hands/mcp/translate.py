"""What crosses between an MCP server and the registry: tool names, parameter schemas, call results.

A server is someone else's program: everything it says is checked and capped
here before the registry or the model sees it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from mcp import types
from pydantic import ValidationError

from bus.errors import PincerError
from bus.protocol import ErrorCode
from hands.errors import ToolFailure

NAME_LIMIT = 64  # what every provider accepts: ^[a-zA-Z0-9_-]{1,64}$
DESCRIPTION_LIMIT = 2_000
SCHEMA_LIMIT = 32_000  # bytes of JSON: a schema is sent to the model with every turn
TOOLS_LIMIT = 200  # per server
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


class ToolRefused(PincerError, ValueError):
    """A server's tool that cannot be offered; the message says why."""


def tool_name(server: str, tool: str) -> str:
    """``mcp_<server>_<tool>``, sanitised to what every provider accepts; a long one ends in a short hash."""
    name = f"mcp_{server}_{_UNSAFE.sub('_', tool).strip('_') or 'tool'}"
    if len(name) > NAME_LIMIT:
        digest = hashlib.sha256(tool.encode()).hexdigest()[:8]
        name = f"{name[:NAME_LIMIT - 9]}_{digest}"
    return name


def description(server: str, tool: types.Tool) -> str:
    text = (tool.description or tool.title or "").strip() or f"{tool.name} (no description given)"
    if len(text) > DESCRIPTION_LIMIT:
        text = text[:DESCRIPTION_LIMIT] + "…"
    return f"{text}\n(MCP server {server}, tool {tool.name})"


def parameters(tool: types.Tool) -> dict[str, Any]:
    """The tool's input schema, normalised to what providers accept: an object at the top, valid
    JSON Schema, no larger than ``SCHEMA_LIMIT``."""
    schema = tool.input_schema
    if not isinstance(schema, dict):
        raise ToolRefused(f"its inputSchema is a {type(schema).__name__}, not a JSON Schema object")
    schema = {k: v for k, v in schema.items() if k not in ("$schema", "$id")}  # drafts differ; 2020-12 validates
    if schema.get("type", "object") != "object":
        raise ToolRefused(f"its inputSchema has type {schema.get('type')!r}; a tool's arguments are an object")
    schema["type"] = "object"
    schema.setdefault("properties", {})
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ToolRefused(f"its inputSchema is not valid JSON Schema: {exc.message}") from None
    if len(json.dumps(schema)) > SCHEMA_LIMIT:
        raise ToolRefused(f"its inputSchema is over {SCHEMA_LIMIT:,} bytes")
    return schema


def screen_tool_list(message: Any, refuse: Callable[[str], None]) -> None:
    """Drop from a ``tools/list`` answer (any result holding ``tools``) each entry that is not a tool
    we could offer, saying why: one bad entry must not cost the server all its others."""
    result = getattr(message, "result", None)
    if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
        return
    kept = []
    for entry in result["tools"]:
        name = entry.get("name") if isinstance(entry, dict) else None
        try:
            if not isinstance(name, str):
                raise ToolRefused("it has no name")
            parameters(types.Tool.model_validate(entry, by_name=False))
        except (ToolRefused, ValidationError) as exc:
            reason = str(exc) if isinstance(exc, ToolRefused) else f"not an MCP tool: {exc.errors()[0]['msg']}"
            refuse(f"{str(name)[:80] if name is not None else '(unnamed)'}: {reason}")
            continue
        kept.append(entry)
    result["tools"] = kept


def result_data(server: str, result: types.CallToolResult) -> dict[str, Any]:
    """A call's result as tool:result data: text joined, images and binary resources as a readable
    note (size and type), resources' text inline, structured content as is. ``isError`` raises."""
    texts: list[str] = []
    attachments: list[dict[str, Any]] = []
    for block in result.content:
        match block:
            case types.TextContent():
                texts.append(block.text)
            case types.ImageContent() | types.AudioContent():
                kind = "image" if isinstance(block, types.ImageContent) else "audio"
                attachments.append({"type": kind, "mime_type": block.mime_type, "bytes": _decoded_size(block.data),
                                    "note": f"a {kind} ({block.mime_type}) the model cannot see yet"})
            case types.EmbeddedResource():
                attachments.append(_resource(block.resource))
            case types.ResourceLink():
                attachments.append({"type": "resource_link", "uri": str(block.uri), "name": block.name,
                                    **({"mime_type": block.mime_type} if block.mime_type else {}),
                                    **({"description": block.description} if block.description else {})})
            case _:
                attachments.append({"type": getattr(block, "type", type(block).__name__), "note": "not shown"})
    if result.is_error:
        message = "\n".join(texts).strip() or "the tool reported an error and gave no message"
        raise ToolFailure(ErrorCode.TOOL_ERROR, f"MCP server {server}: {message}", recoverable=True,
                          suggestions=["read the server's message; fix the arguments or try another way"])
    data: dict[str, Any] = {"text": "\n".join(texts)}
    if attachments:
        data["attachments"] = attachments
    if result.structured_content is not None:
        data["structured"] = result.structured_content
    return data


def _resource(resource: types.TextResourceContents | types.BlobResourceContents) -> dict[str, Any]:
    found: dict[str, Any] = {"type": "resource", "uri": str(resource.uri)}
    if resource.mime_type:
        found["mime_type"] = resource.mime_type
    if isinstance(resource, types.TextResourceContents):
        found["text"] = resource.text
    else:
        found["bytes"] = _decoded_size(resource.blob)
        found["note"] = "binary content, not shown"
    return found


def _decoded_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data)


def protocol_failure(server: str, exc: Exception) -> ToolFailure:
    """An error the server answered with (JSON-RPC), as the wire's error."""
    from mcp.shared.exceptions import MCPError

    if isinstance(exc, MCPError):
        code = {types.INVALID_PARAMS: ErrorCode.INVALID_ARGUMENTS,
                types.METHOD_NOT_FOUND: ErrorCode.TOOL_NOT_FOUND}.get(exc.code, ErrorCode.TOOL_ERROR)
        return ToolFailure(code, f"MCP server {server} answered error {exc.code}: {exc.message}", recoverable=True)
    return ToolFailure(ErrorCode.SERVICE_UNAVAILABLE, f"MCP server {server}: {type(exc).__name__}: {exc}",
                       recoverable=True)
