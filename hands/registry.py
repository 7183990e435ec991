"""The tool registry: definitions in, a cached Brain-facing view out."""

from __future__ import annotations

import graphlib
import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import jsonschema_rs
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field

from bus.protocol import ErrorCode, SkillInfo, ToolMeta, ToolSpec
from bus.workspace import Workspace
from hands.config import HandsSettings, RetryPolicy
from hands.errors import ToolFailure
from hands.permissions import PermissionPolicy, Permissions

if TYPE_CHECKING:  # the services a handler may use, as Protocols (hands/seams.py): real ones or fakes
    from bus.protocol import ToolExecute
    from hands.notes import CallersNotes
    from hands.seams import ApprovalAsking, BackgroundKeeping, QuestionAsking, Sandboxing
    from memory.jobs import JobStore

class Category(StrEnum):
    FILE = "file_operation"
    NETWORK = "network_request"
    CODE = "code_execution"
    MEMORY = "memory_operation"
    SKILL = "skill"
    AGENT = "agent_delegation"  # run by the Brain itself (a sub-agent's turn), never by a Hands worker
    PERSON = "person_interaction"  # waits for the person of the turn (ask_user): bounded by the call's deadline

    @property
    def key(self) -> str:
        """Its name in the config's per-category tables (hands.concurrency, hands.timeouts): ``file``, ..."""
        return self.value.split("_")[0]


SendProgress = Callable[[str], Awaitable[Any]]
"""Sends one ``tool:progress`` "output" message for the call (the executor's, per worker)."""


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs more, on every call (docs/bus.md)
class ToolContext:
    """What a handler may know about the call it serves, and the shared services it may use."""

    call_id: str
    session_id: str
    agent_id: str
    worker_id: str
    settings: HandsSettings
    workspace: Workspace
    memory: CallersNotes | None = None  # the sender's notes (and the shared ones), when the worker has them
    sandbox: Sandboxing | None = None  # for tools that run commands
    policy: PermissionPolicy | None = None  # for tools that check each target themselves
    background: BackgroundKeeping | None = None  # for commands that outlive their call
    schedules: JobStore | None = None  # the scheduled jobs (the schedule tool)
    approvals: ApprovalAsking | None = None  # for commands that may need a person's yes
    questions: QuestionAsking | None = None  # for questions to the person of the turn (ask_user)
    call: ToolExecute | None = None  # the tool:execute being served
    send_progress: SendProgress | None = None
    notes: dict[str, Any] = field(default_factory=dict)  # e.g. {"sandbox": "bwrap"}, copied into the metadata

    async def progress(self, message: str) -> None:
        """``await ctx.progress("50% done")`` sends a ``tool:progress`` "output" to whoever waits."""
        if self.send_progress is not None:
            await self.send_progress(message)


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
    # Other names a caller may use for this tool. Not listed (the model reads each tool once); policy
    # entries naming an alias apply to the tool, as OpenClaw reads bash as exec.
    aliases: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def spec(self) -> ToolSpec:
        meta = ToolMeta(category=self.category.value, idempotent=self.idempotent, after=self.after,
                        timeout_s=self.timeout_s, max_concurrency=self.max_concurrency)
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters,
                        metadata=meta.to_wire())


class ArgsValidator:
    """A tool's parameter schema (Draft 2020-12), checked on every call.

    The check runs in Rust (jsonschema-rs: ~0.5 µs where the Python validator takes
    ~30); only arguments it rejects are explained by the Python validator, whose
    messages the LLM and the tests know. Should the two ever disagree, the Rust
    verdict stands and explains itself.
    """

    def __init__(self, schema: dict[str, Any]) -> None:
        self.explain = Draft202012Validator(schema)
        try:
            self.fast: jsonschema_rs.Draft202012Validator | None = jsonschema_rs.Draft202012Validator(schema)
        except Exception:  # a schema only the Python validator takes (a regex dialect, say)
            self.fast = None

    def errors(self, args: dict[str, Any]) -> list[str]:
        """One line per offending path; empty when the arguments are valid."""
        if self.fast is not None:
            try:
                if self.fast.is_valid(args):
                    return []
            except ValueError:  # something JSON cannot hold (a non-text key): the Python validator judges
                pass
        found = sorted(self.explain.iter_errors(args), key=lambda e: list(e.absolute_path))
        if found:
            return [f"{_path(e.absolute_path)}: {e.message}" for e in found]
        if self.fast is None:
            return []
        try:
            return [f"{_path(e.instance_path)}: {e.message}" for e in self.fast.iter_errors(args)]
        except ValueError:
            return []


def _path(parts: Any) -> str:
    return "/".join(str(p) for p in parts) or "(arguments)"


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, ToolDefinition] = {}
        self._aliases: dict[str, str] = {}  # alias -> the tool's name
        self._validators: dict[str, ArgsValidator] = {}
        self._async: dict[str, bool] = {}  # handler is a coroutine function: awaited on the loop, not in a thread
        self._view: list[ToolSpec] | None = None
        self._instructions: dict[str, SkillInfo] = {}

    def register(self, tool: ToolDefinition) -> None:
        taken = next((name for name in tool.names if name in self._tools or name in self._aliases), None)
        if taken is not None:
            raise ValueError(f"tool {tool.name!r}: the name {taken!r} is already registered")
        try:
            Draft202012Validator.check_schema(tool.parameters)
        except SchemaError as exc:
            raise ValueError(f"tool {tool.name!r} has an invalid parameter schema: {exc.message}") from None
        cycle = _order_cycle({**self._tools, tool.name: tool})
        if cycle:
            raise ValueError(f"tool {tool.name!r} declares an order that forms a cycle ({' → '.join(cycle)}): "
                             "remove one of these `after` entries")
        self._tools[tool.name] = tool
        self._aliases.update(dict.fromkeys(tool.aliases, tool.name))
        self._validators[tool.name] = ArgsValidator(tool.parameters)
        self._async[tool.name] = inspect.iscoroutinefunction(tool.handler)
        self._view = None

    def unregister(self, name: str) -> None:
        tool = self._tools.pop(name, None)
        for alias in tool.aliases if tool else ():
            self._aliases.pop(alias, None)
        self._validators.pop(name, None)
        self._async.pop(name, None)
        self._view = None

    def names(self) -> list[str]:
        return sorted(self._tools)

    def by_category(self, category: Category) -> list[ToolDefinition]:
        return [tool for name, tool in sorted(self._tools.items()) if tool.category is category]

    def __contains__(self, name: object) -> bool:
        return name in self._tools or name in self._aliases

    def get(self, name: str) -> ToolDefinition:
        """The tool called ``name`` (or known by it as an alias)."""
        tool = self._tools.get(name) or self._tools.get(self._aliases.get(name, ""))
        if tool is None:
            raise ToolFailure(
                ErrorCode.TOOL_NOT_FOUND,
                f"no tool named {name!r}; available tools: {', '.join(self.names()) or '(none)'}",
                suggestions=[f"call one of: {', '.join(self.names())}"],
                recoverable=True,
            )
        return tool

    def idempotent(self, name: str) -> bool:
        return self.get(name).idempotent

    def is_async(self, name: str) -> bool:
        return self._async[name]

    def validate(self, name: str, args: dict[str, Any]) -> None:
        """Check args against the tool's schema: one line per offending path."""
        lines = self._validators[name].errors(args)
        if lines:
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
