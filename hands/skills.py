"""SKILL.md skills: scan the skill directories, check each skill, register what passes.

A skill is a folder ``<name>/SKILL.md`` with YAML frontmatter between ``---``
lines. With ``parameters`` (or a ``handler.py``) it is a **tool skill**: its
``handle(args, ctx)`` is registered like a built-in tool. Without either it is
an **instruction skill**: no tool, but the Brain is told its name, description
and where to read it. A skill that fails any check is refused with a reason;
the others still load. The frontmatter reference is in docs/skills.md.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bus.errors import PincerError
from bus.protocol import ErrorCode, SkillInfo
from hands.config import RetryPolicy
from hands.errors import ToolFailure
from hands.permissions import PermissionPolicy, Permissions
from hands.registry import Category, ToolDefinition, ToolRegistry

MAX_SKILL_BYTES = 256 * 1024
NAME = r"^[a-zA-Z][a-zA-Z0-9_-]{0,63}$"
AFTER = r"^(category:)?[a-zA-Z][a-zA-Z0-9_-]{0,63}$"  # a tool name or category:<name>


class ParameterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["string", "integer", "number", "boolean", "array", "object"]
    description: str = ""
    required: bool = False
    enum: list[Any] | None = None
    default: Any = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    items: dict[str, Any] | None = None


class FilesystemPermissions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    read: list[str] = Field(default_factory=list)
    write: list[str] = Field(default_factory=list)


class NetworkPermissions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    domains: list[str] = Field(default_factory=list)


class ExecutionPermissions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    commands: list[str] = Field(default_factory=list)


class PermissionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    filesystem: FilesystemPermissions = Field(default_factory=FilesystemPermissions)
    network: NetworkPermissions = Field(default_factory=NetworkPermissions)
    execution: ExecutionPermissions = Field(default_factory=ExecutionPermissions)

    def flat(self) -> Permissions:
        return Permissions(filesystem_read=self.filesystem.read, filesystem_write=self.filesystem.write,
                           network=self.network.domains, execute=self.execution.commands)


class Frontmatter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME)
    description: str = Field(min_length=1, max_length=2000)
    parameters: dict[str, ParameterSpec] | None = None
    permissions: PermissionSpec = Field(default_factory=PermissionSpec)
    timeout: float | None = Field(default=None, ge=1, le=120)
    max_concurrency: int | None = Field(default=None, ge=1, le=100)
    idempotent: bool = True
    retry: RetryPolicy | None = None
    after: list[Annotated[str, Field(pattern=AFTER)]] = Field(default_factory=list, max_length=20)

    def schema_(self) -> dict[str, Any]:
        properties, required = {}, []
        for name, spec in (self.parameters or {}).items():
            prop = spec.model_dump(exclude={"required"}, exclude_none=True)
            if not prop.get("description"):
                prop.pop("description", None)
            properties[name] = prop
            if spec.required:
                required.append(name)
        schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
        if required:
            schema["required"] = required
        return schema


@dataclass
class Refusal:
    location: str
    reason: str


@dataclass
class SkillReport:
    tools: list[str] = field(default_factory=list)
    instructions: list[SkillInfo] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)


class SkillRefused(PincerError):
    """A skill that cannot load; the message names the skill and what to fix."""


def skill_reader(registry: ToolRegistry) -> ToolDefinition:
    """The ``read_skill`` tool: the model reads an instruction skill's SKILL.md by name."""

    def read_skill(args: dict[str, Any], _ctx: Any) -> dict[str, Any]:
        known = {skill.name: skill for skill in registry.instructions()}
        skill = known.get(args["name"])
        if skill is None:
            raise ToolFailure(ErrorCode.FILE_NOT_FOUND, f"no instruction skill named {args['name']!r}; "
                              f"skills: {', '.join(sorted(known)) or '(none)'}")
        return {"name": skill.name, "instructions": Path(skill.location).read_text(encoding="utf-8")}

    return ToolDefinition(
        name="read_skill", description="Read the instructions of an available skill, by name.",
        parameters={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
                    "additionalProperties": False},
        handler=read_skill, category=Category.SKILL,
    )


def load_skills(dirs: list[Path], registry: ToolRegistry, policy: PermissionPolicy) -> SkillReport:
    report = SkillReport()
    for directory in dirs:
        directory = directory.expanduser()
        if not directory.is_dir():
            continue
        unsafe = _writable_by_others(directory)
        if unsafe:
            report.refused.append(Refusal(str(directory), f"skill directory {directory}: {unsafe}; its skills are "
                                          "not loaded (chmod go-w, or keep skills in a directory of your own)"))
            continue
        for folder in sorted(p for p in directory.iterdir() if (p / "SKILL.md").exists() or p.is_symlink()):
            try:
                loaded = load_skill(folder, registry, policy)
            except SkillRefused as exc:
                report.refused.append(Refusal(str(folder / "SKILL.md"), str(exc)))
                continue
            if isinstance(loaded, SkillInfo):
                registry.add_instruction(loaded)
                report.instructions.append(loaded)
            else:
                report.tools.append(loaded)
    return report


def load_skill(folder: Path, registry: ToolRegistry, policy: PermissionPolicy) -> SkillInfo | str:
    """One skill folder into ``registry``: its tool's name, or its instructions; ``SkillRefused`` says why not."""
    skill_md = folder / "SKILL.md"
    for part in (folder, skill_md, folder / "handler.py"):
        unsafe = _writable_by_others(part) if part.exists() and not part.is_symlink() else None
        if unsafe:
            raise SkillRefused(f"skill folder {folder.name!r}: {part.name} {unsafe}")
    return _load_one(folder, skill_md, registry, policy)


def _writable_by_others(path: Path) -> str | None:
    """Why someone other than us (or root) could change ``path``'s code, or None."""
    info = path.stat()
    if info.st_uid not in (0, os.geteuid()):
        return f"belongs to uid {info.st_uid}, who could change what Hands imports"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "is writable by its group or by everyone (mode " + oct(info.st_mode & 0o777) + ")"
    return None


def _load_one(folder: Path, skill_md: Path, registry: ToolRegistry, policy: PermissionPolicy) -> SkillInfo | str:
    if folder.is_symlink() or skill_md.is_symlink():
        raise SkillRefused(f"skill folder {folder.name!r}: symbolic links are not followed; copy the skill in")
    meta, body = _parse(skill_md)
    name = meta.name
    if name in registry or registry.has_instruction(name):
        raise SkillRefused(f"skill {name!r}: the name clashes with a tool or skill already loaded; rename it")
    handler_py = folder / "handler.py"
    if meta.parameters is None and not handler_py.exists():
        return SkillInfo(name=name, description=meta.description, location=str(skill_md.resolve()))
    if not handler_py.is_file():
        raise SkillRefused(f"skill {name!r} declares parameters but has no handler.py next to its SKILL.md")
    violations = policy.violations(meta.permissions.flat())
    if violations:
        raise SkillRefused(f"skill {name!r} asks for more than the global policy allows: " + "; ".join(violations))
    handler = _import_handler(name, handler_py)
    tool = ToolDefinition(
        name=name, description=meta.description + (f"\n\n{body.strip()}" if body.strip() else ""),
        parameters=meta.schema_(), handler=handler, category=Category.SKILL,
        permissions=meta.permissions.flat(), timeout_s=meta.timeout, max_concurrency=meta.max_concurrency,
        retry=meta.retry, idempotent=meta.idempotent, after=tuple(meta.after), source=str(skill_md.resolve()),
    )
    try:
        registry.register(tool)
    except ValueError as exc:
        raise SkillRefused(f"skill {name!r}: {exc}") from None
    return name


class _NoAliasLoader(yaml.SafeLoader):
    """safe_load without anchors and aliases: nine nested aliases make a billion nodes for whatever
    walks the result (the schema validator, json.dumps), from a frontmatter of a few hundred bytes."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]  # PyYAML's stubs leave it bare
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in a SKILL.md",
                                              event.start_mark)
        return super().compose_node(parent, index)


def _parse(skill_md: Path) -> tuple[Frontmatter, str]:
    where = f"{skill_md.parent.name}/SKILL.md"
    if skill_md.stat().st_size > MAX_SKILL_BYTES:
        raise SkillRefused(f"{where} is larger than {MAX_SKILL_BYTES // 1024} KB")
    text = skill_md.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---" or "---" not in (line.strip() for line in lines[1:]):
        raise SkillRefused(f"{where} has no YAML frontmatter: start the file with a '---' line, the keys, and '---'")
    end = next(i for i, line in enumerate(lines[1:], start=1) if line.strip() == "---")
    try:
        raw = yaml.load("\n".join(lines[1:end]), Loader=_NoAliasLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 2}" if mark else ""
        raise SkillRefused(f"{where}: broken YAML{at}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise SkillRefused(f"{where}: the frontmatter must be a mapping of keys")
    try:
        return Frontmatter.model_validate(raw), "\n".join(lines[end + 1 :])
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(frontmatter)'}: {e['msg']}"
                             for e in exc.errors())
        raise SkillRefused(f"{where}: {problems}") from None


def _import_handler(name: str, handler_py: Path) -> Any:
    module_name = f"pincer_skill_{name.replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(module_name, handler_py)
    if spec is None or spec.loader is None:
        raise SkillRefused(f"skill {name!r}: cannot load {handler_py}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # any error in a skill's module is the skill's, not the worker's
        raise SkillRefused(f"skill {name!r}: handler.py failed to load ({type(exc).__name__}: {exc})") from None
    handle = getattr(module, "handle", None)
    if not callable(handle):
        raise SkillRefused(f"skill {name!r}: handler.py must define handle(args, ctx)")
    if len(inspect.signature(handle).parameters) != 2:
        raise SkillRefused(f"skill {name!r}: handle must take two arguments, (args, ctx)")
    sys.modules[module_name] = module
    return handle
