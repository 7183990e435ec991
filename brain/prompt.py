"""The system prompt: the agent's instructions, the skills it may read, and what it remembers."""

from __future__ import annotations

from typing import Any

from bus.protocol import SkillInfo

MEMORY_NOTES_SHOWN = 30


def system_prompt(instructions: str, skills: list[SkillInfo], memory: list[dict[str, Any]] | None = None,
                  *, client: str | None = None) -> str:
    parts = [instructions]
    if client:  # the client's own system message adds to the agent's instructions, never replaces them
        parts.append(f"The client application adds these instructions:\n{client}")
    if skills:
        listed = "\n".join(f"- {skill.name}: {skill.description}" for skill in skills)
        parts.append(f"Skills you can use (read one with the read_skill tool before you follow it):\n{listed}")
    if memory:
        shown = sorted(memory, key=lambda note: -note["updated"])[:MEMORY_NOTES_SHOWN]
        listed = "\n".join(f"- {note['key']}{' (shared)' if note.get('scope') == 'shared' else ''}: {note['preview']}"
                           for note in shown)
        more = f"\n(and {len(memory) - len(shown)} older notes: find them with memory_search)" \
            if len(memory) > len(shown) else ""
        parts.append("Your long-term memory of this person, and shared notes (read a note in full with memory_read, "
                     "add one with memory_write):\n"
                     f"{listed}{more}")
    return "\n\n".join(parts)
