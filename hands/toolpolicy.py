"""Which tools an agent (and a sender) may use: the one policy point for listing and for running.

Layers, each only narrowing the one before: the global profile, the global
allow list (if any), the global deny list, then the same three for the agent,
then owner-only tools for senders who are not owners. Entries are tool names,
globs (``execute_*``) or groups (``group:fs``). Deny always wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from hands.config import GROUP_CATEGORIES, PROFILES, ToolPolicySettings, ToolRules
from hands.registry import Category, ToolDefinition

GROUPS = {group: Category(category) for group, category in GROUP_CATEGORIES.items()}


@dataclass(frozen=True)
class Decision:
    allowed: bool
    rule: str  # the rule that decided, for people and for PERMISSION_DENIED messages
    trace: tuple[str, ...] = ()


def _matches(entry: str, tool: ToolDefinition) -> bool:
    if entry in GROUPS:
        return tool.category is GROUPS[entry]
    return any(fnmatchcase(name, entry) for name in tool.names)  # denying an alias denies the tool


class ToolPolicy:
    def __init__(self, settings: ToolPolicySettings) -> None:
        self.settings = settings

    def decide(self, tool: ToolDefinition, *, agent: str = "main", sender: str = "") -> Decision:
        trace: list[str] = []
        layers: list[tuple[str, ToolRules]] = [("hands.tools", self.settings)]
        if agent in self.settings.agents:
            layers.append((f"hands.tools.agents.{agent}", self.settings.agents[agent]))
        for where, rules in layers:
            refusal = self._refusal(tool, where, rules, trace)
            if refusal:
                return Decision(False, refusal, tuple(trace))
        owner_only = next((e for e in self.settings.owner_only if _matches(e, tool)), None)
        if owner_only is not None:
            if sender not in self.settings.owners:
                rule = f"hands.tools.owner_only has {owner_only!r} and sender {sender or '(unknown)'!r} is not an owner"
                trace.append(f"denied: {rule}")
                return Decision(False, rule, tuple(trace))
            trace.append(f"owner-only {owner_only!r}: sender {sender!r} is an owner")
        return Decision(True, "allowed by every layer", tuple(trace))

    def visible(self, tools: list[ToolDefinition], *, agent: str, sender: str) -> list[ToolDefinition]:
        return [tool for tool in tools if self.decide(tool, agent=agent, sender=sender).allowed]

    @staticmethod
    def _refusal(tool: ToolDefinition, where: str, rules: ToolRules, trace: list[str]) -> str | None:
        if rules.profile is not None:
            if not any(_matches(e, tool) for e in PROFILES[rules.profile]):
                trace.append(f"denied: {where}.profile {rules.profile!r} does not include it")
                return f"{where}.profile is {rules.profile!r}, which does not include {tool.name}"
            trace.append(f"{where}.profile {rules.profile!r} includes it")
        denied = next((e for e in rules.deny if _matches(e, tool)), None)
        if denied is not None:
            trace.append(f"denied: {where}.deny has {denied!r}")
            return f"{where}.deny has {denied!r}"
        if rules.allow:
            allowed = next((e for e in rules.allow if _matches(e, tool)), None)
            if allowed is None:
                trace.append(f"denied: {where}.allow does not list it")
                return f"{where}.allow does not list {tool.name}"
            trace.append(f"{where}.allow has {allowed!r}")
        return None
