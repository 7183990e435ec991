"""The tool registry: definitions in, a cached Brain-facing view out."""

from __future__ import annotations

import graphlib
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field

from bus.protocol import ErrorCode, SkillInfo, ToolSpec
from hands.config import HandsSettings
from hands.errors import ToolFailure
from hands.workspace import Workspace


class Category(StrEnum):
    FILE = "file_operation"
    NETWORK = "network_request"
    CODE = "code_execution"
    MEMORY = "memory_operation"
    SKILL = "skill"


class Permissions(BaseModel):
    """What a tool promises to touch; checked against the global policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    filesystem_read: list[str] = Field(default_factory=list)
    filesystem_write: list[str] = Field(default_factory=list)
    network: list[str] = Field(default_factory=list)
    execute: list[str] = Field(default_factory=list)


class RetryPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    retries: int = Field(default=2, ge=0, le=10)
    base_s: float = Field(default=1.0, ge=0)
    max_s: float = Field(default=10.0, ge=0)


Progress = Callable[[str], Awaitable[None]]


async def _no_progress(_message: str) -> None:
    return None


@dataclass(frozen=True)
class ToolContext:
    """What a handler may know about the call it serves, and the shared services it may use."""

    call_id: str
    session_id: str
    agent_id: str
    worker_id: str
    settings: HandsSettings
    workspace: Workspace
    memory: Any = None  # memory.longterm.LongTermMemory, when the worker has Redis
    sandbox: Any = None  # hands.sandbox.runner.Sandbox, for tools that run commands
    policy: Any = None  # hands.policy.Policy, for tools that check each target themselves
    jobs: Any = None  # hands.jobs.JobManager, for commands that outlive their call
    approvals: Any = None  # hands.approvals.ApprovalGate, for commands that may need a person's yes
    call: Any = None  # the tool:execute being served
    progress: Progress = _no_progress  # await ctx.progress("50% done") sends tool:progress "output"
    notes: dict[str, Any] = field(default_factory=dict)  # e.g. {"sandbox": "bwrap"}, copied into the metadata


Handler = Callable[[dict[str, Any], ToolContext], Any | Awaitable[Any]]


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str = Field(pattern=r"^[a-zA-Z][a-zA-Z0-9_-]{0,63}$")
    description: str
    parameters: dict[str, Any]
    handler: Handler
    category: Category
    permissions: Permissions = Field(default_factory=Permissions)
    timeout_s: float | None = Field(default=None, gt=0)
    max_concurrency: int | None = Field(default=None, ge=1)
    retry: RetryPolicy | None = None  # None: the worker's default policy
    idempotent: bool = True
    # Tools (by name, or ``category:<name>``) whose calls in the same model response must
    # finish before this one runs; it then sees their results (``ToolExecute.prior``).
    after: tuple[str, ...] = ()
    source: str = "builtin"  # or the SKILL.md it came from

    def spec(self) -> ToolSpec:
        metadata: dict[str, Any] = {"category": self.category.value, "idempotent": self.idempotent}
        if self.after:
            metadata["after"] = list(self.after)
        for key in ("timeout_s", "max_concurrency"):
            if getattr(self, key) is not None:
                metadata[key] = getattr(self, key)
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters, metadata=metadata)


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, ToolDefinition] = {}
        self._validators: dict[str, Draft202012Validator] = {}
        self._view: list[ToolSpec] | None = None
        self._instructions: dict[str, SkillInfo] = {}

    def register(self, tool: ToolDefinition) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        try:
            Draft202012Validator.check_schema(tool.parameters)
        except SchemaError as exc:
            raise ValueError(f"tool {tool.name!r} has an invalid parameter schema: {exc.message}") from None
        cycle = _order_cycle({**self._tools, tool.name: tool})
        if cycle:
            raise ValueError(f"tool {tool.name!r} declares an order that forms a cycle ({' → '.join(cycle)}): "
                             "remove one of these `after` entries")
        self._tools[tool.name] = tool
        self._validators[tool.name] = Draft202012Validator(tool.parameters)
        self._view = None

    def unregister(self, name: str) -> None:
        self._tools.pop(name, None)
        self._validators.pop(name, None)
        self._view = None

    def names(self) -> list[str]:
        return sorted(self._tools)

    def by_category(self, category: Category) -> list[ToolDefinition]:
        return [tool for name, tool in sorted(self._tools.items()) if tool.category is category]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def get(self, name: str) -> ToolDefinition:
        tool = self._tools.get(name)
        if tool is None:
            raise ToolFailure(
                ErrorCode.TOOL_NOT_FOUND,
                f"no tool named {name!r}; available tools: {', '.join(self.names()) or '(none)'}",
                suggestions=[f"call one of: {', '.join(self.names())}"],
                recoverable=True,
            )
        return tool

    def validate(self, name: str, args: dict[str, Any]) -> None:
        """Check args against the tool's schema: one line per offending path."""
        errors = sorted(self._validators[name].iter_errors(args), key=lambda e: list(e.absolute_path))
        if errors:
            lines = [f"{'/'.join(str(p) for p in e.absolute_path) or '(arguments)'}: {e.message}" for e in errors]
            raise ToolFailure(
                ErrorCode.INVALID_ARGUMENTS,
                f"invalid arguments for {name}:\n" + "\n".join(lines),
                suggestions=["fix the listed arguments to match the tool's parameter schema and call again"],
                details={"errors": lines},
                recoverable=True,
            )

    def add_instruction(self, skill: SkillInfo) -> None:
        """An instruction skill: no tool, but the Brain is told about it."""
        self._instructions[skill.name] = skill

    def has_instruction(self, name: str) -> bool:
        return name in self._instructions

    def instructions(self) -> list[SkillInfo]:
        return [self._instructions[name] for name in sorted(self._instructions)]

    def brain_view(self) -> list[ToolSpec]:
        """What the Brain may see: name, description, parameters, metadata. Cached."""
        if self._view is None:
            self._view = [self._tools[name].spec() for name in self.names()]
        return self._view

    def digest(self) -> str:
        payload = json.dumps([[spec.model_dump(mode="json") for spec in self.brain_view()],
                              [skill.model_dump(mode="json") for skill in self.instructions()]], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _order_cycle(tools: dict[str, ToolDefinition]) -> list[str]:
    """A cycle in the tools' declared ``after`` order (names, first repeated last), or [] if none."""
    graph: dict[str, set[str]] = {}
    for name, tool in tools.items():
        graph[name] = set()
        for wanted in tool.after:
            if wanted.startswith("category:"):
                graph[name] |= {other for other, t in tools.items()
                                if t.category.value == wanted[9:] and other != name}
            elif wanted in tools and wanted != name:
                graph[name].add(wanted)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return []
