"""The prompt's layout: a stable head a provider can cache, then what may change from turn to turn.

A provider's prompt cache reads a request's longest prefix it has seen before, so what never changes
comes first and is sent byte for byte the same every time: the tools (in name order), then the agent's
instructions and the skills it may read (``system_prompt``). What may change between turns follows in a
system message of its own (``context_prompt``): the client application's instructions and the memory
notes, which change whenever a note is written. For Anthropic-family models the end of the stable part
is marked as a cache breakpoint (``cache_marked``), as litellm takes it; other providers cache
prefixes by themselves and are sent nothing extra.
"""

from __future__ import annotations

from typing import Any

from bus.protocol import SkillInfo

MEMORY_NOTES_SHOWN = 30
EPHEMERAL = {"type": "ephemeral"}  # Anthropic's one kind of cache breakpoint (five minutes, renewed by each hit)
# litellm model names of the providers that cache only up to a marked breakpoint (Anthropic's models,
# direct or through Bedrock or Vertex AI); the others (OpenAI, Gemini, DeepSeek...) cache prefixes themselves.
_ANTHROPIC_PREFIXES = ("anthropic/", "claude", "vertex_ai/claude", "vertex_ai_beta/claude")


def system_prompt(instructions: str, skills: list[SkillInfo]) -> str:
    """The stable head: the agent's instructions and its skills (in the order Hands lists them, by name)."""
    parts = [instructions]
    if skills:
        listed = "\n".join(f"- {skill.name}: {skill.description}" for skill in sorted(skills, key=lambda s: s.name))
        parts.append(f"Skills you can use (read one with the read_skill tool before you follow it):\n{listed}")
    return "\n\n".join(parts)


def context_prompt(memory: list[dict[str, Any]] | None = None, *, client: str | None = None) -> str:
    """What may change between turns, after the stable head ('' when there is nothing)."""
    parts = []
    if client:  # the client's own system message adds to the agent's instructions, never replaces them
        parts.append(f"The client application adds these instructions:\n{client}")
    if memory:
        shown = sorted(memory, key=lambda note: (-note["updated"], note["key"]))[:MEMORY_NOTES_SHOWN]
        listed = "\n".join(f"- {note['key']}{' (shared)' if note.get('scope') == 'shared' else ''}: {note['preview']}"
                           for note in shown)
        more = f"\n(and {len(memory) - len(shown)} older notes: find them with memory_search)" \
            if len(memory) > len(shown) else ""
        parts.append("Your long-term memory of this person, and shared notes (read a note in full with memory_read, "
                     "add one with memory_write):\n"
                     f"{listed}{more}")
    return "\n\n".join(parts)


def takes_cache_marks(model: str) -> bool:
    """Whether ``model`` (a litellm model name) caches only where a request marks it: Anthropic's models."""
    name = model.lower()
    if name.startswith(_ANTHROPIC_PREFIXES):
        return True
    provider, _, rest = name.partition("/")
    return provider == "bedrock" and "anthropic" in rest


def cache_marked(messages: list[dict[str, Any]], tools: list[dict[str, Any]]
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The request with the end of its stable head marked as a cache breakpoint, as litellm documents it:
    the last tool, and the leading system message (its text as one content block carrying the mark).
    Copies: the messages and tools given are left as they are."""
    marked_tools = [*tools[:-1], {**tools[-1], "cache_control": EPHEMERAL}] if tools else []
    first = messages[0] if messages else None
    if first is None or first.get("role") != "system" or not isinstance(first.get("content"), str) \
            or not first["content"]:
        return messages, marked_tools
    block = {"type": "text", "text": first["content"], "cache_control": EPHEMERAL}
    return [{**first, "content": [block]}, *messages[1:]], marked_tools
