"""The local model's chat handler: OpenAI-shaped messages in, the model's own prompt out, and its
reply turned back into text or structured tool calls.

- The prompt is the GGUF's own chat template (Jinja, run in a sandboxed
  environment: a model file is data, not code we trust), given the messages,
  the offered tools and ``add_generation_prompt``.
- A small model needs to hear when to stop: with tools offered, the system
  message gains ``AFTER_TOOLS`` (answer from a tool's result rather than
  calling again).
- The reply's tool calls are read from the formats such models write:
  ``<tool_call>{...}</tool_call>`` (Qwen2.5, Hermes; or ``<tools>``, which a
  small model echoes from its prompt), a fenced ```json block, or a reply
  that is a bare JSON object; each is ``{"name": ..., "arguments": {...}}``
  or OpenAI's ``{"type": "function", "function": {...}}``. A call to a tool that was not offered is refused: it never
  reaches the caller as a call, and the reason is given so the server can
  ask again or say so. Nothing here is tied to one model beyond these
  formats, which Qwen2.5 and Hermes-style models share.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from bus.errors import PincerError

AFTER_TOOLS = ("When a tool result is in the conversation, answer the user from it in plain words. "
               "Call a tool again only if the result shows an error or more is clearly needed.")
# Qwen2.5 is told <tool_call>; at 1.5B it sometimes echoes the <tools> tag of its prompt instead.
_TAGGED = re.compile(r"<(tool_call|tools)>\s*(.*?)\s*(?:</\1>|$)", re.DOTALL)
_FENCED = re.compile(r"```(?:json|tool_call)?\s*(\{.*?\})\s*```", re.DOTALL)


class TemplateFailed(PincerError):
    """The model's chat template could not render these messages."""


@dataclass
class Reply:
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's shape
    refused: list[str] = field(default_factory=list)  # why each call the model invented was dropped


def render(template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
           bos_token: str = "", eos_token: str = "") -> str:
    """The prompt for the next assistant turn, by the model's own template."""
    messages = [_for_template(m) for m in messages]
    if tools:
        messages = _with_guidance(messages)
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    environment.globals["raise_exception"] = _raise
    try:
        return environment.from_string(template).render(
            messages=messages, tools=tools or None, add_generation_prompt=True,
            bos_token=bos_token, eos_token=eos_token)
    except TemplateError as exc:
        raise TemplateFailed(f"the model's chat template failed: {exc}") from None


def parse(text: str, offered: set[str]) -> Reply:
    """The model's raw reply as text and tool calls; calls to tools not in ``offered`` are refused."""
    candidates = [body for _tag, body in _TAGGED.findall(text)]
    rest = _TAGGED.sub("", text) if candidates else text
    if not candidates:
        fenced = _FENCED.findall(text)
        if fenced:
            candidates, rest = fenced, _FENCED.sub("", text)
        elif text.strip().startswith("{"):
            candidates, rest = [text.strip()], ""
    reply = Reply()
    for raw in candidates:
        call = _call(raw)
        if call is None:
            continue  # not a call after all: it stays in the text
        name, arguments = call
        if name not in offered:
            reply.refused.append(f"{name!r} is not one of the offered tools ({', '.join(sorted(offered)) or 'none'})")
            continue
        reply.tool_calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                 "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
    reply.content = rest.strip() if reply.tool_calls or reply.refused else text.strip()
    return reply


def _call(raw: str) -> tuple[str, dict[str, Any]] | None:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if isinstance(data, dict) and isinstance(data.get("function"), dict):  # OpenAI's own shape, echoed
        data = data["function"]
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return (data["name"], arguments) if isinstance(arguments, dict) else None


def _for_template(message: dict[str, Any]) -> dict[str, Any]:
    """A message as chat templates expect it: text content (never None), a call's arguments as an
    object (OpenAI carries them as JSON text; templates write them with ``tojson``)."""
    shaped = {**message, "content": message.get("content") or ""}
    if message.get("tool_calls"):
        shaped["tool_calls"] = [_call_for_template(call) for call in message["tool_calls"]]
    return shaped


def _call_for_template(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    if isinstance(function.get("arguments"), str):
        with contextlib.suppress(ValueError):  # else written as the model gave it
            function["arguments"] = json.loads(function["arguments"])
    return {**call, "function": function}


def _with_guidance(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if messages and messages[0].get("role") == "system":
        first = {**messages[0], "content": f"{messages[0].get('content') or ''}\n\n{AFTER_TOOLS}".strip()}
        return [first, *messages[1:]]
    return [{"role": "system", "content": AFTER_TOOLS}, *messages]


def _raise(message: str) -> None:
    raise TemplateError(message)
