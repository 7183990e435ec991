"""The global policy: what any tool may be permitted, and the check of a tool's declared permissions.

A declared pattern is within the policy when, read as a path (or host), it
matches one of the policy's globs: ``{workspace}/notes/**`` is within
``{workspace}/**``; ``/**`` is not.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from hands.config import PolicySettings


class Permissions(BaseModel):
    """What a tool promises to touch; checked against the global policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    filesystem_read: list[str] = Field(default_factory=list)
    filesystem_write: list[str] = Field(default_factory=list)
    network: list[str] = Field(default_factory=list)
    execute: list[str] = Field(default_factory=list)


KINDS = ("filesystem_read", "filesystem_write", "network", "execute")


class PermissionPolicy:
    def __init__(self, settings: PolicySettings, workspace: Path) -> None:
        self.workspace = str(workspace.expanduser().resolve())
        self.allowed = {kind: [self._expand(p) for p in getattr(settings, kind)] for kind in KINDS}

    def violations(self, permissions: Permissions) -> list[str]:
        """One line per declared permission the policy does not allow; empty when all are allowed."""
        found = []
        for kind in KINDS:
            allowed = self.allowed[kind]
            for pattern in getattr(permissions, kind):
                if not any(fnmatchcase(self._expand(pattern), rule) for rule in allowed):
                    found.append(f"{kind} {pattern!r} is not within the policy's {kind} {allowed or '[] (nothing)'}")
        return found

    def allows_host(self, host: str) -> bool:
        """Whether the policy's network globs admit this host (checked on every request a tool makes)."""
        return any(fnmatchcase(host, rule) for rule in self.allowed["network"])

    def suggestions(self, violations: list[str]) -> list[str]:
        kinds = sorted({line.split(" ", 1)[0] for line in violations})
        return [f"an operator can allow it in config.yaml under hands.policy.{kind}" for kind in kinds] + [
            "or use another tool that needs less access"
        ]

    def _expand(self, pattern: str) -> str:
        return pattern.replace("{workspace}", self.workspace)
