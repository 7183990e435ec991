"""The ``brain`` section of the configuration."""

from __future__ import annotations

from pydantic import Field, SecretStr

from bus.config import Section

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


class LocalModelSettings(Section):
    """The local model (``brain.model: local``), which `pincer up` runs as its own process."""

    model_path: str | None = None  # None: the pinned model, assembled in the data dir
    context_tokens: int = Field(default=8192, ge=512, le=131_072)


class BrainSettings(Section):
    model: str = ""  # "local": the local model, served by `pincer up`
    local: LocalModelSettings = Field(default_factory=LocalModelSettings)
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
    # `openai/...` models through the openai SDK itself (which litellm uses for them too), without
    # litellm's wrapper: less CPU per call (docs/brain.md). False: through litellm like every provider.
    openai_direct: bool = True
    max_turns: int = Field(default=16, ge=1, le=1000)
    # Messages a Brain holds, besides its turns, while they wait for their session's earlier turn.
    max_waiting: int = Field(default=64, ge=0, le=10_000)
    # What the model reads: its window (None: litellm's figure for the model, else 32k tokens)
    # and the most one tool result may take of it (head and tail kept, the middle cut).
    context_window_tokens: int | None = Field(default=None, ge=1000)
    tool_result_max_tokens: int = Field(default=8_000, ge=100)
    # Several Brains: a session's turn holds a lease in Redis, renewed while it runs; a Brain
    # that dies lets it expire. A message waits this long for its session's earlier ones.
    session_lease_s: float = Field(default=15.0, ge=1, le=600)
    session_wait_s: float | None = Field(default=None, gt=0)  # None: max_turn_s + 60
    # More agents besides "main" (whose settings are the ones above); a chat message names its agent.
    agents: dict[str, AgentSettings] = Field(default_factory=dict)

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
