"""The system prompt: the agent's instructions plus the skills it may read."""

from __future__ import annotations

from bus.protocol import SkillInfo


def system_prompt(instructions: str, skills: list[SkillInfo]) -> str:
    if not skills:
        return instructions
    listed = "\n".join(f"- {skill.name}: {skill.description}" for skill in skills)
    return (f"{instructions}\n\nSkills you can use (read one with the read_skill tool before you follow it):\n"
            f"{listed}")
