"""The local model's chat handler: OpenAI-shaped messages in, the model's own prompt out, and its
reply turned back into text or structured tool calls.

- The prompt is the GGUF's own chat template (Jinja, run in a sandboxed
  environment: a model file is data, not code we trust), given the messages,
  the offered tools and ``add_generation_prompt``.
- A small model needs more said than a large one: with tools offered, the
  system message lists each tool by what it does between ``BEFORE_TOOLS``
  (call, never guess; files and shell commands are recognised) and
  ``AFTER_TOOLS`` (answer from a result rather than calling again); after a
  tool result the request is said again, last (``AFTER_RESULT``).
- ``review`` says what is wrong with a reply, for the server to ask once more.
- The reply's tool calls are read from the formats such models write:
  ``<tool_call>{...}</tool_call>`` (Qwen2.5, Hermes; or ``<tools>``, which a
  small model echoes from its prompt), a fenced ```json block, or a reply
  that is a bare JSON object; each is ``{"name": ..., "arguments": {...}}``
  or OpenAI's ``{"type": "function", "function": {...}}``. A call to a tool
  that was not offered is refused: it never reaches the caller as a call,
  and the reason is given so the server can ask again or say so. Nothing here is tied to one model beyond these
  formats, which Qwen2.5 and Hermes-style models share.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jsonschema import Draft202012Validator, SchemaError
from jsonschema.exceptions import best_match

from bus.errors import PincerError

BEFORE_TOOLS = ("Call a tool whenever the request needs something from outside this conversation (a file, a "
                "directory, a command's output, a web page, a stored note); never make up what a tool would "
                "return. A name with a file extension (notes.txt, vars.env) is a file. A shell command the user "
                "gives (ls -la, git status, python3 --version) is run as it is, by the tool that runs commands. "
                "Choose the tool whose description matches what is asked:")
AFTER_TOOLS = ("When a tool result is in the conversation, answer the user from it in plain words, with the values "
               "it shows (names, numbers, text). Call a tool again only if the result shows an error or more is "
               "clearly needed.")
# A worked call for each of Pincer's everyday tools that is offered: a 1.5B model copies a pattern
# more reliably than it follows a rule (bench/results.md has the figures).
EXAMPLES = (
    ("read_file", "What is in letter.txt?", {"path": "letter.txt"}),
    ("exec", "Run uptime", {"command": "uptime"}),
    ("memory_read", "What did I ask you to remember under 'car'?", {"key": "car"}),
)
AFTER_RESULT = ("Answer the request now from the tool result above, in plain words with the values it shows "
                "(if it shows an error, fix the call or say what went wrong).")
# Qwen2.5 is told <tool_call>; at 1.5B it sometimes echoes the <tools> tag of its prompt instead.
_TAGGED = re.compile(r"<(tool_call|tools)>\s*(.*?)\s*(?:</\1>|$)", re.DOTALL)
# A reply that only announces an action ("I will read the file...") instead of taking it.
_ANNOUNCED = re.compile(
    r"\s*(?:sure[,!.]?\s*)?(?:I will|I'll|let me|I am going to|I'm going to)\b[^\n]{0,200}[.:]?\s*$", re.IGNORECASE
)
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
        messages = _with_guidance(messages, tools)
    try:
        return _compiled(template).render(messages=messages, tools=tools or None, add_generation_prompt=True,
                                          bos_token=bos_token, eos_token=eos_token)
    except TemplateError as exc:
        raise TemplateFailed(f"the model's chat template failed: {exc}") from None


@functools.lru_cache(maxsize=4)
def _compiled(template: str) -> Template:
    """A model's template compiled once (~6 ms each time, twice a request otherwise)."""
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    environment.globals["raise_exception"] = _raise
    return environment.from_string(template)


_MARK = "\u2063pincer-prefix\u2063"


def prompt_prefix(template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """The part of every prompt of this conversation's kind that comes before its first user message
    (the system message and the tools): what a model can read ahead of a request."""
    system = [messages[0]] if messages and messages[0].get("role") == "system" else []
    rendered = render(template, [*system, {"role": "user", "content": _MARK}], tools)
    return rendered.split(_MARK, 1)[0] if _MARK in rendered else ""


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


def review(reply: Reply, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str | None:
    """What to tell the model before it tries once more, or None when its reply can go out:
    calls only to tools that do not exist, arguments that do not fit a tool's parameters (a small
    model echoes the schema), the call whose result it was just given made again, or a tool named
    in words where a call was due."""
    if reply.refused and not reply.tool_calls:
        return "Those tools do not exist: " + "; ".join(reply.refused) + ". Use one of the offered tools, or answer."
    schemas = {t["function"].get("name"): t["function"].get("parameters") for t in tools or []
               if isinstance(t.get("function"), dict)}
    for call in reply.tool_calls:
        name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
        problem = _misfit(schemas.get(name), arguments)
        if problem:
            return (f"Your call to {name} does not fit its parameters: {problem}. Call it again with the "
                    "argument values themselves, not their schema.")
    last = messages[-1] if messages else {}
    if last.get("role") == "tool" and reply.tool_calls:
        before = {
            _signature(call) for m in messages if m.get("role") == "assistant" for call in m.get("tool_calls") or []
        }
        repeated = [call["function"]["name"] for call in reply.tool_calls if _signature(call) in before]
        if repeated:
            return (f"You already called {repeated[0]} with these arguments and its result is above. "
                    "Answer the user from it now.")
    if tools and not reply.tool_calls and last.get("role") == "user":
        named = [name for name in schemas if re.search(rf"\b{re.escape(name)}\b", reply.content)]
        if named:
            return (f"You named {named[0]} but did not call it. To use it, write the call itself: "
                    f'<tool_call>{{"name": "{named[0]}", "arguments": {{...}}}}</tool_call>; or answer the user.')
        if _ANNOUNCED.match(reply.content):
            return ("You said what you would do but did not do it. If a tool does it, write the call now: "
                    '<tool_call>{"name": ..., "arguments": {...}}</tool_call>; or answer the user.')
    return None


def _misfit(schema: Any, arguments: dict[str, Any]) -> str | None:
    if not isinstance(schema, dict):
        return None
    try:
        error = best_match(Draft202012Validator(schema).iter_errors(arguments))
    except SchemaError:
        return None  # the tool's own schema is broken: Hands will say so
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message


def _signature(call: dict[str, Any]) -> tuple[str, str]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return str(function.get("name")), json.dumps(arguments, sort_keys=True)


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


def _with_guidance(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The system message with what a small model needs told: each tool by what it does, to call
    rather than guess, and to answer from a result."""
    functions = [t["function"] for t in tools if isinstance(t.get("function"), dict)]
    listed = "\n".join(f"- {f.get('name')}: {f.get('description') or ''}".rstrip(": ") for f in functions)
    offered = {f.get("name") for f in functions}
    examples = "".join(f"\nUser: {asked}\n<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
                       for name, asked, arguments in EXAMPLES if name in offered)
    guidance = f"{BEFORE_TOOLS}\n{listed}\n{AFTER_TOOLS}" + (f"\nFor example:{examples}" if examples else "")
    if messages and messages[0].get("role") == "system":
        first = {**messages[0], "content": f"{messages[0].get('content') or ''}\n\n{guidance}".strip()}
        messages = [first, *messages[1:]]
    else:
        messages = [{"role": "system", "content": guidance}, *messages]
    if messages[-1].get("role") == "tool":  # the request again, last, where a small model still sees it
        asked = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "")
        messages.append({"role": "system", "content": f"{AFTER_RESULT} The request was: {asked}"})
    return messages


def _raise(message: str) -> None:
    raise TemplateError(message)
