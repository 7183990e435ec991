"""The ``brain`` section of the configuration."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator, model_validator

from bus.settings import Section
from memory.flight import KEEP_DAYS
from memory.schedule import parse_duration
from memory.spend import BudgetSettings

DEFAULT_INSTRUCTIONS = (
    "You are Pincer, a helpful assistant. You can act through the tools you are given; "
    "use them when they help, and say plainly what you did and what you found. "
    "When a tool fails, read its error and either fix the call, try another way, or tell the user."
)  # keep in step with config.yaml


class AgentSettings(Section):
    """One agent: anything left out is taken from the brain section."""

    model: str | None = None
    fallbacks: list[str] | None = None
    instructions: str | None = None
    max_iterations: int | None = Field(default=None, ge=1, le=1000)
    max_tool_calls: int | None = Field(default=None, ge=1)
    max_turn_s: float | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_cost_usd: float | None = Field(default=None, gt=0)
    context_window_tokens: int | None = Field(default=None, ge=1000)


class PriceSettings(Section):
    """What a model costs, in USD per million tokens."""

    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)
    # Prompt tokens the provider read from its cache (reported as cached_tokens); None: at the input price.
    cached_input_per_mtok: float | None = Field(default=None, ge=0)


class SchedulerSettings(Section):
    """The jobs' scheduler, run by every Brain; one holds its lease and fires what is due."""

    enabled: bool = True
    # How often the holder looks at the due set at most (a job due sooner is looked at on time).
    tick_s: float = Field(default=1.0, gt=0, le=60)
    # The lease: a holder that stops renewing it loses it after this (a killed one at once: no heartbeat).
    lease_s: float = Field(default=10.0, ge=1, le=600)
    # A due instant fired this late is on time; later, it was missed and the job's catch-up policy decides
    # (at most half the job's period).
    grace_s: float = Field(default=60.0, gt=0)


class HeartbeatSettings(Section):
    """A periodic check-in of one agent: it reads a checklist and speaks only when there is something to say."""

    every: str = "30m"  # a duration: 10m, 1h
    # The checklist in the workspace the agent reads each time (like HEARTBEAT.md).
    checklist: str = Field(default="HEARTBEAT.md", pattern=r"^[^/\x00][^\x00]{0,255}$")
    # Chats its reports go to (CHANNEL:CHAT); a report is also in its session (owner/heartbeat-<agent>).
    deliver: list[str] = Field(default_factory=list)
    # Its own spend limit per day, besides the pool's and the owner's.
    daily_usd: float | None = Field(default=0.25, ge=0)
    # Not run while the owner has not talked to the agent for this long (null: run even so).
    idle_after: str | None = "24h"
    owner: str = "owner"  # the identity it runs as (its tools, policy and budgets)

    @field_validator("every", "idle_after")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value)
        return value


class DelegationSettings(Section):
    """The delegate tool: a turn hands a task to a sub-agent, which runs as its own turn on any Brain."""

    max_depth: int = Field(default=2, ge=0, le=5)  # sub-agents of sub-agents, at most this deep (0: none)
    max_children: int = Field(default=8, ge=1, le=64)  # sub-agents one turn may start
    # Other agents each agent may hand tasks to (an agent may always delegate to itself), e.g. {main: [researcher]}.
    agents: dict[str, list[str]] = Field(default_factory=dict)


class CompactionSettings(Section):
    """Earlier turns that no longer fit the model's window are summarised into a note (docs/brain.md)."""

    enabled: bool = True  # false: they are left out instead, oldest first
    summary_share: float = Field(default=0.15, ge=0.02, le=0.5)  # of the window, at most, for the note


class LocalModelSettings(Section):
    """The local model (``brain.model: local``), which `pincer up` runs as its own process."""

    model_path: str | None = None  # None: the pinned model, assembled in the data dir
    context_tokens: int = Field(default=8192, ge=512, le=131_072)


class RecordSettings(Section):
    """The flight recorder (memory/flight.py): each model request and response, tool call and stop of a turn."""

    enabled: bool = True
    keep_days: float = Field(default=KEEP_DAYS, gt=0)  # a session's record lapses this long after its last step

    @property
    def keep_s(self) -> int:
        return int(self.keep_days * 86_400)


class BrainSettings(Section):
    model: str = ""  # "local": the local model, served by `pincer up`
    local: LocalModelSettings = Field(default_factory=LocalModelSettings)
    record: RecordSettings = Field(default_factory=RecordSettings)
    api_base: str | None = None
    api_key: SecretStr | None = None
    instructions: str = DEFAULT_INSTRUCTIONS
    fallbacks: list[str] = Field(default_factory=list)  # tried in order when the model is rate-limited or down
    # Budgets of one turn; the turn ends with BUDGET_EXHAUSTED naming the one that ran out.
    max_iterations: int = Field(default=25, ge=1, le=1000)
    max_tool_calls: int = Field(default=100, ge=1)
    max_turn_s: float = Field(default=900.0, gt=0)
    max_tokens: int = Field(default=500_000, ge=1)
    max_cost_usd: float | None = Field(default=None, gt=0)  # needs a model litellm knows prices for
    # Loop detection: warn the model at loop_warn_at repeats, end the turn at loop_stop_at (0 turns it off).
    loop_warn_at: int = Field(default=3, ge=0)
    loop_stop_at: int = Field(default=5, ge=0)
    tool_deadline_s: float = Field(default=60.0, gt=0, le=3600)
    tools_list_timeout_s: float = Field(default=5.0, gt=0, le=120)
    llm_timeout_s: float = Field(default=120.0, gt=0)
    llm_retries: int = Field(default=2, ge=0, le=10)
    # A request that never reached the provider (refused at connect: a restart, a blip) costs nothing, so it
    # is tried again, backing off, for this long before it counts as one of the llm_retries.
    llm_connect_patience_s: float = Field(default=10.0, ge=0, le=600)
    # `openai/...` models straight over httpx (the same request litellm would send), without litellm or
    # the openai SDK: less CPU per call, ~24 MB less (docs/brain.md). False: through litellm like the rest.
    openai_direct: bool = True
    # Mark the prompt's stable head (the tools, the instructions) as a cache breakpoint for the providers that
    # cache only where a request says so (Anthropic's models, direct, on Bedrock or Vertex AI): later turns read
    # it at the cached rate (docs/budgets.md). Others cache prefixes themselves and are sent nothing extra.
    prompt_cache: bool = True
    # Turns one Brain runs at once: the one bound on its model calls in flight (a turn makes one at a time),
    # so its consumer's slots and the direct road's connection pool are this size. A turn waiting on its
    # provider costs a socket and some memory, no CPU: hundreds fit one process (docs/brain.md). At most
    # litellm's connection pool per host (500), else that pool, not this setting, would be the bound.
    max_turns: int = Field(default=256, ge=1, le=500)
    # Streamed text goes to the person's Gateway at most this often (the first piece at once), each delta
    # what came meanwhile: a provider's chunk is a token or two, and each delta is a bus message, an event
    # log entry in Redis and a frame to every follower (0: every chunk as it comes).
    stream_every_ms: int = Field(default=50, ge=0, le=1000)
    # Transcripts a Brain keeps as it last read them, up to about this many MB of its memory, so each turn
    # reads and parses only what its session gained since, not the whole history again (0: read whole).
    transcript_cache_mb: float = Field(default=16.0, ge=0, le=4096)
    # Messages a Brain holds, besides its turns, while they wait for their session's earlier turn.
    max_waiting: int = Field(default=64, ge=0, le=10_000)
    # What the model reads: its window (None: litellm's figure for the model, else 32k tokens)
    # and the most one tool result may take of it (head and tail kept, the middle cut).
    context_window_tokens: int | None = Field(default=None, ge=1000)
    tool_result_max_tokens: int = Field(default=8_000, ge=100)
    compaction: CompactionSettings = Field(default_factory=CompactionSettings)
    # Several Brains: a session's turn holds a lease in Redis, renewed while it runs; a Brain
    # that dies lets it expire. A message waits this long for its session's earlier ones.
    session_lease_s: float = Field(default=15.0, ge=1, le=600)
    session_wait_s: float | None = Field(default=None, gt=0)  # None: max_turn_s + 60
    # More agents besides "main" (whose settings are the ones above); a chat message names its agent.
    agents: dict[str, AgentSettings] = Field(default_factory=dict)
    # Prices by model name (USD per million tokens); a model left out is priced by litellm's table.
    prices: dict[str, PriceSettings] = Field(default_factory=dict)
    # Spend limits across every Brain of the pool (docs/budgets.md).
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    # Scheduled jobs (docs/jobs.md).
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    # Heartbeats by agent id (docs/jobs.md), e.g. {main: {every: 30m, deliver: [telegram:123]}}; none by default.
    heartbeats: dict[str, HeartbeatSettings] = Field(default_factory=dict)
    # Sub-agents (docs/delegation.md).
    delegation: DelegationSettings = Field(default_factory=DelegationSettings)

    @model_validator(mode="after")
    def _of_known_agents(self) -> BrainSettings:
        named = [(f"heartbeats names agent {a!r}", a) for a in self.heartbeats]
        named += [(f"delegation.agents names agent {a!r}", a) for a in self.delegation.agents]
        named += [(f"delegation.agents.{a} names agent {b!r}", b)
                  for a, to in self.delegation.agents.items() for b in to]
        for what, agent in named:
            if agent not in self.agent_ids():
                raise ValueError(f"{what}, which is not configured; agents: {', '.join(self.agent_ids())} "
                                 "(add it under brain.agents)")
        return self

    def for_agent(self, agent_id: str) -> BrainSettings | None:
        """This agent's settings (the section with its overrides), or None for an unknown agent."""
        if agent_id == "main" and "main" not in self.agents:
            return self
        agent = self.agents.get(agent_id)
        if agent is None:
            return None
        return self.model_copy(update=agent.model_dump(exclude_none=True))

    def agent_ids(self) -> list[str]:
        return sorted({"main", *self.agents})
