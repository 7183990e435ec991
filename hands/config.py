"""The ``hands`` section of the configuration."""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from bus.config import Config, ConfigError
from bus.settings import Section
from bus.workspaces import Workspaces
from memory.jobs import ModelJobLimits

# The skills shipped with Pincer (package data); `{shipped}` in skill_dirs. `{project}/skills`, from
# configs written when they were found beside a checkout only, names the same folder.
SHIPPED_SKILLS = Path(str(resources.files("skills")))


class ConcurrencySettings(Section):
    """Calls running at once: in the whole worker, per tool category (a tool may lower its own)."""

    global_: int = Field(default=10, ge=1, le=1000, alias="global")
    file: int = Field(default=5, ge=1)
    network: int = Field(default=3, ge=1)
    code: int = Field(default=2, ge=1)
    memory: int = Field(default=8, ge=1)
    skill: int = Field(default=5, ge=1)


class TimeoutSettings(Section):
    """Seconds a call may run, per category, when its tool sets none (always clamped to 1..120)."""

    file: float = Field(default=5.0, gt=0)
    network: float = Field(default=20.0, gt=0)
    code: float = Field(default=30.0, gt=0)
    memory: float = Field(default=3.0, gt=0)
    skill: float = Field(default=30.0, gt=0)


class QueueSettings(Section):
    """Calls waiting for a slot: in the pool's backlog in Redis (``hands/backlog.py``), or in a worker."""

    depth: int = Field(default=1000, ge=0, le=100_000)  # per live worker, for each lane of the pool
    pool_depth: int | None = Field(default=None, ge=0)  # a lane's bound for the whole pool, when set
    wait_s: float = Field(default=30.0, gt=0)


class RetryPolicy(Section):
    """How retryable failures of idempotent tools are retried: the worker's default (``hands.retry``),
    or a tool's own (a skill's ``retry``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    retries: int = Field(default=2, ge=0, le=10)
    base_s: float = Field(default=1.0, ge=0)
    max_s: float = Field(default=10.0, ge=0)


class PolicySettings(Section):
    """The global policy: what any tool may be permitted. ``{workspace}`` is the workspace path."""

    filesystem_read: list[str] = Field(default_factory=lambda: ["{workspace}/**"])
    filesystem_write: list[str] = Field(default_factory=lambda: ["{workspace}/**"])
    network: list[str] = Field(default_factory=lambda: ["*"])
    execute: list[str] = Field(default_factory=lambda: ["*"])


class SandboxSettings(Section):
    """How commands run: tier, the uid they run as, and their resource limits."""

    tier: Literal["auto", "bwrap", "landlock", "rlimits"] = "auto"
    allow_degraded: bool = False  # run commands with rlimits only when bubblewrap is unusable
    uid: int = Field(default=65534, ge=1)  # never root: root launching bwrap stays root inside
    gid: int = Field(default=65534, ge=1)
    memory_mb: int = Field(default=512, ge=16)
    cpu_s: int = Field(default=30, ge=1, le=3600)
    file_size_mb: int = Field(default=64, ge=1)
    open_files: int = Field(default=256, ge=16)
    processes: int = Field(default=256, ge=8)  # one command's tree at once
    # Every command of one session at once (a pids cgroup per session): one session's fork storm never
    # leaves another unable to fork. None: as many as one command may hold.
    session_processes: int | None = Field(default=None, ge=8)
    # Not as root: a cgroup folder with the pids controller that Pincer's user may write (delegated to
    # it), under which each session gets its cgroup. As root the hierarchies' roots are used.
    cgroup_dir: Path | None = None
    # Run commands where no session can be capped on its own (not root, no cgroup_dir): then every
    # session's commands share one process limit, and one session can starve the others of processes.
    allow_shared_process_limit: bool = False
    output_bytes: int = Field(default=200_000, ge=1_000)
    default_timeout_s: float = Field(default=30.0, ge=1, le=120)
    # bwrap tier: each session's commands reuse a sandbox kept warm for it (~1 ms, not ~11 ms, for `true`),
    # torn down after warm_idle_s without a command. Off: every command starts its own bwrap.
    warm: bool = True
    warm_idle_s: float = Field(default=180.0, gt=0, le=86_400)
    # Warm sandboxes a worker keeps at most (each ~6 MB for its runner): past it the longest idle one goes,
    # and when every one is running a command, a command runs cold.
    warm_max: int = Field(default=16, ge=1)


class WebSettings(Section):
    """web_fetch and web_search."""

    timeout_s: float = Field(default=15.0, gt=0, le=120)
    max_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    max_redirects: int = Field(default=3, ge=0, le=10)
    # Networks web_fetch may reach although they are not public (e.g. an intranet: ["10.1.0.0/16"]).
    allow_networks: list[str] = Field(default_factory=list)
    allowed_domains: list[str] = Field(default_factory=list)  # web_fetch's own host globs; empty: any public host
    search_url: str | None = None  # a SearXNG instance, e.g. http://127.0.0.1:8888
    user_agent: str = "Pincer/0.1 (+web_fetch)"


# Each group is every tool of one category (hands.registry.Category's values).
GROUP_CATEGORIES = {"group:fs": "file_operation", "group:runtime": "code_execution", "group:web": "network_request",
                    "group:memory": "memory_operation", "group:skills": "skill",
                    "group:agents": "agent_delegation", "group:people": "person_interaction"}
GROUP_NAMES = tuple(GROUP_CATEGORIES)
PROFILES = {
    "minimal": ["group:memory", "group:skills", "group:people"],
    "coding": ["group:fs", "group:runtime", "group:memory", "group:skills", "group:agents", "group:people"],
    "full": ["*"],
}


class ToolRules(Section):
    """One layer of the tool policy: a profile, then allow (if any), then deny (which wins)."""

    profile: str | None = None
    allow: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _known_names(self) -> ToolRules:
        if self.profile is not None and self.profile not in PROFILES:
            raise ValueError(f"unknown profile {self.profile!r}; use one of {', '.join(PROFILES)}")
        for entry in [*self.allow, *self.deny]:
            if entry.startswith("group:") and entry not in GROUP_NAMES:
                raise ValueError(f"unknown group {entry!r}; groups: {', '.join(GROUP_NAMES)}")
        return self


class ToolPolicySettings(ToolRules):
    profile: str | None = "full"
    # Tools only owners may use: scheduling jobs, by default (a job runs unattended, as its maker).
    owner_only: list[str] = Field(default_factory=lambda: ["schedule"])
    # Sender ids that count as owners: the configured token's identity ("owner"), by default.
    owners: list[str] = Field(default_factory=lambda: ["owner"])
    agents: dict[str, ToolRules] = Field(default_factory=dict)  # per-agent layers, narrowing the global one
    # The jobs the schedule tool makes: caps per identity, the shortest period (for every sender), and where
    # the owner is told of each (docs/jobs.md).
    schedule: ModelJobLimits = Field(default_factory=ModelJobLimits)


def default_workspace() -> Path:
    # As root, commands run as an unprivileged uid that cannot enter /root: keep the
    # workspace where that uid can reach it.
    return Path("/var/lib/pincer/workspace") if os.geteuid() == 0 else Path("~/.pincer/workspace")


class BackgroundSettings(Section):
    """Background processes: commands that outlive their call (exec with background, or past yield_ms).
    Named ``hands.jobs`` before; that key is still read (``bus.config.RENAMED``)."""

    max_timeout_s: float = Field(default=3600.0, ge=1)  # longest a background process may run
    keep_s: float = Field(default=1800.0, ge=1)  # how long a finished one stays listed
    # Background processes at once, per session and in a worker: past them a command stays in the
    # foreground (it runs to its timeout) and background: true is refused.
    max_per_session: int = Field(default=4, ge=1)
    max_per_worker: int = Field(default=16, ge=1)


class AllowEntry(Section):
    """An allowlisted program: its resolved path (glob), and optionally a regex its arguments must match."""

    path: str
    args: str | None = None


class ExecSettings(Section):
    """Exec approvals: deny | allowlist | ask | full."""

    mode: Literal["deny", "allowlist", "ask", "full"] = "full"
    allowlist: list[AllowEntry] = Field(default_factory=list)
    approval_timeout_s: float = Field(default=45.0, gt=0, le=3600)


class AskUserSettings(Section):
    """The ask_user tool: how long a question waits for its person (never past the call's deadline)."""

    timeout_s: float = Field(default=300.0, gt=0, le=86_400)


class RecallSettings(Section):
    """Memory search's indexes in each worker: one per scope searched lately, built on demand (memory/recall.py)."""

    max_chunks: int = Field(default=50_000, ge=1_000)  # held across scopes before the least recent are evicted
    log_keep_s: float = Field(default=86_400.0, ge=60)  # how long the memory log keeps a change


MCP_SERVER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$"


class McpServerSettings(Section):
    """One MCP server, in the shape of Claude Desktop's and Cursor's ``mcpServers`` entries (stdio:
    ``command``, ``args``, ``env``, ``cwd``; streamable HTTP: ``url``, ``headers``), plus Pincer's own keys.
    Values of ``env`` and ``headers`` may name the worker's environment as ``${NAME}``: secrets stay there."""

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None  # inside the sandbox; the workspace (/workspace under bwrap) when unset
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    enabled: bool = True
    tools: list[str] = Field(default_factory=lambda: ["*"])  # globs of the server's tool names to offer
    timeout_s: float | None = Field(default=None, gt=0, le=3600)  # per call; the category's otherwise
    start_timeout_s: float = Field(default=20.0, gt=0, le=600)  # for the handshake and the first tool list
    max_concurrency: int | None = Field(default=None, ge=1)  # calls at once to this server, from one worker
    idempotent: bool = False  # unknown side effects: never run twice unless the entry says so
    # One copy in the whole pool (a server that keeps state between calls): the worker holding its
    # lease runs it, and the others send its calls there, as they do for a background process's.
    stateful: bool = False
    # Start at the first call, not with the worker (its tools come from the last list any worker saw).
    lazy: bool = False
    category: Literal["file", "network", "code", "memory", "skill"] = "skill"
    # Sandbox (stdio servers): directories it may read (its install, e.g. a venv or node_modules; the
    # command's own directory is added), whether it may use the network, and limits of its own.
    read_only: list[Path] = Field(default_factory=list)
    network: bool = False
    workspace: Literal["rw", "ro", "none"] = (
        "rw"  # the agent's workspace at /workspace: read-write, read-only, not at all
    )
    memory_mb: int = Field(default=2048, ge=64)  # an address-space cap: a JIT (node) reserves far more than it uses
    cpu_s: int = Field(default=3600, ge=1)  # CPU over the server's whole life, not per call

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSettings:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a stdio server) or url (a streamable HTTP server), not both "
                             "and not neither")
        if self.stateful and self.lazy:
            raise ValueError("a server is stateful (one copy, started by the worker holding its lease) or lazy "
                             "(started at its first call in every worker), not both")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} must start with http:// or https://")
        return self


class McpSettings(Section):
    """MCP servers whose tools join this worker's registry as ``mcp_<server>_<tool>``."""

    servers: dict[str, McpServerSettings] = Field(default_factory=dict)
    restart_max_s: float = Field(default=60.0, ge=1)  # longest wait between restarts of a dead server
    lease_s: float = Field(default=15.0, ge=1, le=600)  # a stateful server's owner: renewed every third of it

    @field_validator("servers")
    @classmethod
    def _names(cls, value: dict[str, McpServerSettings]) -> dict[str, McpServerSettings]:
        for name in value:
            if not re.match(MCP_SERVER_NAME, name):
                raise ValueError(f"MCP server name {name!r}: use 1-32 letters, digits, _ or -, starting with a "
                                 "letter or digit (it becomes part of each tool's name)")
        return value


SHARED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class SharedFolder(Section):
    """A folder of the owners' workspace shown in every identity's tree (``hands.shared_folders.<name>``)."""

    writable: bool = False  # others may change it too (by default they only read it)


class HandsSettings(Section):
    workspace: Path = Field(default_factory=default_workspace)
    # Each identity that is not an owner (a token, a chat user, a hook) works in a tree of its own here
    # (bus/workspaces.py); unset: "<workspace>-identities" beside the workspace.
    identity_workspaces: Path | None = None
    shared_folders: dict[str, SharedFolder] = Field(default_factory=dict)
    concurrency: ConcurrencySettings = Field(default_factory=ConcurrencySettings)
    timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)
    queue: QueueSettings = Field(default_factory=QueueSettings)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    web: WebSettings = Field(default_factory=WebSettings)
    background: BackgroundSettings = Field(default_factory=BackgroundSettings)
    exec: ExecSettings = Field(default_factory=ExecSettings)
    ask_user: AskUserSettings = Field(default_factory=AskUserSettings)
    recall: RecallSettings = Field(default_factory=RecallSettings)
    mcp: McpSettings = Field(default_factory=McpSettings)
    tools: ToolPolicySettings = Field(default_factory=ToolPolicySettings)
    skill_dirs: list[Path] = Field(default_factory=lambda: [SHIPPED_SKILLS, Path("~/.pincer/skills")])
    memory_watermark: float = Field(default=0.9, gt=0, le=1)
    progress_interval_s: float = Field(default=5.0, gt=0)
    max_result_bytes: int = Field(default=50_000, ge=1_000)
    max_file_bytes: int = Field(default=10 * 1024 * 1024, ge=1)
    # Limits across the whole pool (gate -> calls at once): "global", "category:<name>", "tool:<name>".
    pool_limits: dict[str, int] = Field(default_factory=dict)
    pool_lease_s: float = Field(default=30.0, ge=1)
    # How long the result of a call to a tool that is not idempotent is kept for a second delivery.
    call_record_s: float = Field(default=3600.0, ge=60)

    @field_validator("pool_limits")
    @classmethod
    def _known_gates(cls, value: dict[str, int]) -> dict[str, int]:
        for gate, capacity in value.items():
            kind, _, name = gate.partition(":")
            if not (gate == "global" or (kind in ("category", "tool") and name)):
                raise ValueError(f"{gate!r} is not a gate: use global, category:<name> or tool:<name>")
            if capacity < 1:
                raise ValueError(f"{gate}: the limit must be at least 1, got {capacity}")
        return value

    @field_validator("shared_folders")
    @classmethod
    def _shared_names(cls, value: dict[str, SharedFolder]) -> dict[str, SharedFolder]:
        for name in value:
            if not SHARED_NAME.match(name) or name in ("inbox", "..", "."):
                raise ValueError(f"{name!r} cannot be a shared folder: a name of letters, digits, '.', '_' and '-' "
                                 "directly in the workspace (not 'inbox', where each person's uploads go)")
        return value

    @field_validator("skill_dirs", mode="before")
    @classmethod
    def _expand_project(cls, value: object) -> object:
        if isinstance(value, list):
            return [str(v).replace("{shipped}", str(SHIPPED_SKILLS)).replace("{project}", str(SHIPPED_SKILLS.parent))
                    if isinstance(v, str) else v for v in value]
        return value


def identity_root(settings: HandsSettings) -> Path:
    """Where identities' own workspaces are made: ``hands.identity_workspaces``, else
    ``<workspace>-identities`` beside ``hands.workspace``."""
    if settings.identity_workspaces is not None:
        return settings.identity_workspaces.expanduser().resolve()
    workspace = settings.workspace.expanduser().resolve()
    return workspace.with_name(workspace.name + "-identities")


def sandbox_owner(settings: HandsSettings) -> tuple[int, int] | None:
    """Who must own workspace files for sandboxed commands to change them: the sandbox's uid, as root."""
    return (settings.sandbox.uid, settings.sandbox.gid) if os.geteuid() == 0 else None


def workspaces(settings: HandsSettings, *, owner: tuple[int, int] | None = None) -> Workspaces:
    """Whose tree each call sees, as these settings lay them out (bus/workspaces.py)."""
    return Workspaces(settings.workspace, identity_root(settings), owners=settings.tools.owners, owner=owner,
                      shared={name: folder.writable for name, folder in settings.shared_folders.items()})


def configured_workspaces(config: Config) -> Workspaces:
    """The workspaces of ``config`` as a role outside the sandbox sees them (a channel saving uploads)."""
    settings = config.section("hands", HandsSettings)
    return workspaces(settings, owner=sandbox_owner(settings))


def check_workspace(settings: HandsSettings, *, data_dir: Path) -> None:
    """Refuse a workspace that holds Pincer's own code or data: the model writes there, so a skill dir
    or the data dir inside it (``workspace: ~`` holds ``~/.pincer``) would let it plant a handler that
    Hands imports at its next start, or rewrite the Redis data and tokens."""
    workspace = settings.workspace.expanduser().resolve()
    people = identity_root(settings)
    protected = {f"the data directory {data_dir} (runtime.data_dir)": data_dir}
    protected.update({f"the skill directory {d}": d for d in settings.skill_dirs})
    for what, path in protected.items():
        resolved = path.expanduser().resolve()
        for key, tree in (("hands.workspace", workspace), ("hands.identity_workspaces", people)):
            if resolved == tree or tree in resolved.parents:
                raise ConfigError(f"{key} {tree} contains {what}: the agent could change Pincer's own code or "
                                  "data. Give the agent a directory of its own (PINCER_WORKSPACE), outside both")
    if people == workspace or workspace in people.parents or people in workspace.parents:
        raise ConfigError(f"hands.identity_workspaces {people} and hands.workspace {workspace} overlap: the owner's "
                          "turns would see every identity's files, or every identity the owner's. Give each its own "
                          "directory, neither inside the other")
    for name in settings.shared_folders:
        if (workspace / name).is_symlink():
            raise ConfigError(f"hands.shared_folders.{name}: {workspace / name} is a symbolic link; a shared folder "
                              "is a folder of the workspace itself (replace the link with the folder)")
