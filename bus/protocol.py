"""The wire: every message Pincer processes exchange, and the one error-code enum.

Each message is a pydantic model tagged by its ``type``; ``Message`` is their
union. How a message becomes a Redis stream entry and back is ``bus.codec``.
"""

from __future__ import annotations

import os
import time
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError


class ErrorCode(StrEnum):
    """Why a tool call or a chat turn failed. Extend, never rename."""

    TOOL_NOT_FOUND = "TOOL_NOT_FOUND"
    INVALID_ARGUMENTS = "INVALID_ARGUMENTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    FILE_NOT_FOUND = "FILE_NOT_FOUND"
    TIMEOUT = "TIMEOUT"
    NETWORK_ERROR = "NETWORK_ERROR"
    RATE_LIMITED = "RATE_LIMITED"
    SERVICE_UNAVAILABLE = "SERVICE_UNAVAILABLE"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    QUEUE_FULL = "QUEUE_FULL"
    QUEUE_TIMEOUT = "QUEUE_TIMEOUT"
    RETRY_EXHAUSTED = "RETRY_EXHAUSTED"
    ALL_FAILED = "ALL_FAILED"
    WORKER_LOST = "WORKER_LOST"
    APPROVAL_DENIED = "APPROVAL_DENIED"
    CANCELLED = "CANCELLED"
    UNHANDLED = "UNHANDLED"
    TOOL_ERROR = "TOOL_ERROR"  # the tool ran and reported a failure of its own (an MCP isError result)
    # Chat-turn failures (chat:error), beyond the seed's tool codes.
    MODEL_NOT_CONFIGURED = "MODEL_NOT_CONFIGURED"
    MODEL_ERROR = "MODEL_ERROR"
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"  # one turn's own limits (iterations, tokens, time)
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"  # a spend budget of the pool, an agent or an identity: no call is made
    LOOP_DETECTED = "LOOP_DETECTED"
    # The Gateway's refusals (HTTP), before anything reaches the bus.
    UNAUTHENTICATED = "UNAUTHENTICATED"
    FORBIDDEN = "FORBIDDEN"
    NOT_FOUND = "NOT_FOUND"
    BAD_REQUEST = "BAD_REQUEST"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    UNSUPPORTED = "UNSUPPORTED"
    CONFLICT = "CONFLICT"  # the request clashes with what exists (a job of that name)


RETRYABLE = frozenset(
    {ErrorCode.TIMEOUT, ErrorCode.NETWORK_ERROR, ErrorCode.RATE_LIMITED, ErrorCode.SERVICE_UNAVAILABLE}
)


# Every wire model reads a field it does not know as nothing: a release may add optional fields and the
# previous one still reads its messages (the rule: docs/upgrades.md).
WIRE = ConfigDict(extra="ignore", frozen=True)


KNOWN_CODES = frozenset(code.value for code in ErrorCode)


def _known_code(value: Any) -> Any:
    """A newer release's error code reads as UNHANDLED here (its message says what happened)."""
    return value if not isinstance(value, str) or value in KNOWN_CODES else ErrorCode.UNHANDLED


# The error code a message carries: an unknown one is a newer release's, never a malformed message.
Code = Annotated[ErrorCode, BeforeValidator(_known_code)]


def now_ms() -> int:
    return int(time.time() * 1000)


def new_id() -> str:
    """128 random bits as 32 hex digits (a uuid4's strength, without building a UUID)."""
    return os.urandom(16).hex()


class BaseMessage(BaseModel):
    model_config = WIRE

    @property
    def correlation_id(self) -> str | None:
        """The id a waiting requester matches this message on, if any."""
        return None


# --- tools ------------------------------------------------------------------


class ToolMeta(BaseModel):
    """What Hands says of a tool besides its schema: ``ToolSpec.metadata`` on the wire, one home for
    the side that writes it (the registry) and the side that reads it (the Brain's planner)."""

    model_config = ConfigDict(extra="allow", frozen=True)  # a newer Hands may say more

    category: str = ""
    idempotent: bool = True
    # Tools (by name, or ``category:<name>``) whose calls in the same model response run first.
    after: tuple[str, ...] = ()
    timeout_s: float | None = None
    max_concurrency: int | None = None

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_defaults=True, exclude={"idempotent"}) | \
            {"category": self.category, "idempotent": self.idempotent}


class ToolSpec(BaseModel):
    """What the LLM may see of a tool: never its handler or permissions."""

    model_config = WIRE

    name: str
    description: str
    parameters: dict[str, Any]
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def meta(self) -> ToolMeta:
        """The metadata, typed (unknown keys kept; a malformed value reads as the default)."""
        try:
            return ToolMeta.model_validate(self.metadata)
        except ValidationError:
            return ToolMeta()


class ToolError(BaseModel):
    model_config = WIRE

    code: Code
    message: str
    recoverable: bool = False
    suggestions: list[str] = Field(default_factory=list)
    details: dict[str, Any] | None = None


class ResultMetadata(BaseModel):
    model_config = WIRE

    tool_name: str
    duration_ms: int = 0
    truncated: bool = False
    timestamp: int = Field(default_factory=now_ms)
    worker_id: str = ""
    attempts: int = 1
    sandbox: str | None = None  # the isolation a command ran in: bwrap | landlock | rlimits


class ToolsList(BaseMessage):
    type: Literal["tools:list"] = "tools:list"
    request_id: str = Field(default_factory=new_id)
    reply_to: str
    session_id: str | None = None
    deadline: int | None = None
    agent_id: str = "main"
    sender: str = ""  # who is chatting: the tool policy may hide owner-only tools from others


class SkillInfo(BaseModel):
    """An instruction skill the model may read: what it is for and where its SKILL.md lies."""

    model_config = WIRE

    name: str
    description: str
    location: str


class ToolsAvailable(BaseMessage):
    type: Literal["tools:available"] = "tools:available"
    request_id: str
    tools: list[ToolSpec]
    skills: list[SkillInfo] = Field(default_factory=list)
    digest: str = ""
    worker_id: str = ""

    @property
    def correlation_id(self) -> str:
        return self.request_id


class PriorResult(BaseModel):
    model_config = WIRE

    call_id: str
    tool: str
    success: bool
    data: Any = None


class ToolExecute(BaseMessage):
    type: Literal["tool:execute"] = "tool:execute"
    call_id: str = Field(default_factory=new_id)
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    session_id: str = ""
    agent_id: str = "main"
    sender: str = ""
    reply_to: str
    deadline: int
    # Where the person of this chat listens (their Gateway's stream) and which turn it is:
    # an approval request for this call goes there.
    approvals_to: str | None = None
    message_id: str | None = None
    # Results of the calls of the same model response this call waited for (its tool
    # declares ``after`` them), oldest first: a dependent call sees what came before.
    prior: list[PriorResult] = Field(default_factory=list)
    # The turn's agents stamp (ChatMessage.agents): what a job the call makes may use.
    agents: list[str] | None = None


class ToolResult(BaseMessage):
    type: Literal["tool:result"] = "tool:result"
    call_id: str
    success: bool
    data: Any = None
    error: ToolError | None = None
    partial_failure: list[dict[str, Any]] | None = None  # a batch's failed items, when some succeeded
    metadata: ResultMetadata

    @property
    def correlation_id(self) -> str:
        return self.call_id


class ToolProgress(BaseMessage):
    type: Literal["tool:progress"] = "tool:progress"
    call_id: str
    status: Literal["started", "running", "output"]
    message: str = ""
    elapsed_ms: int = 0

    @property
    def correlation_id(self) -> str:
        return self.call_id


# --- chat -------------------------------------------------------------------


ANY_AGENT = "*"  # in an agents stamp: every agent (no agent is named "*")


def stamp_allows(agents: list[str] | None, own: str, agent: str) -> bool:
    """Whether a turn of agent ``own``, stamped with ``agents`` by the door that authenticated its sender, may
    start a turn of ``agent`` (a sub-agent, a job). Nobody stamped it (None): no agent but its own."""
    if agent == own:
        return True
    return agents is not None and (ANY_AGENT in agents or agent in agents)


class Delegation(BaseModel):
    """What a sub-agent's turn knows of the turn that delegated to it (``ChatMessage.delegation``)."""

    model_config = WIRE

    root: str  # the message id of the turn that started the tree: its budgets are shared by the whole tree
    parent_session: str
    parent_call: str  # the delegate call this turn answers
    depth: int = Field(ge=1)
    deadline: int  # ms since the epoch: the tree's turn ends then
    # The root turn's limits, counted over every turn of the tree.
    max_tokens: int = Field(ge=1)
    max_tool_calls: int = Field(ge=1)
    max_cost_usd: float | None = None


class ChatMessage(BaseMessage):
    type: Literal["chat:message"] = "chat:message"
    session_id: str
    message_id: str = Field(default_factory=new_id)
    agent_id: str = "main"
    sender: str = "user"
    text: str
    reply_to: str
    # The message's place in its session (1, 2, ...), given by the Gateway: Brains run a
    # session's messages in this order. None (a raw wire client): only never interleaved.
    seq: int | None = Field(default=None, ge=1)
    # Text the client adds to the agent's instructions for this turn (an OpenAI client's
    # system message): appended to them, never put in their place.
    instructions: str | None = None
    # The scheduled job that started this turn (<owner>/<name>): its spend counts in the job's budget too.
    job: str | None = None
    # Set when another turn handed this one a task (the delegate tool): a sub-agent's turn.
    delegation: Delegation | None = None
    # The agents the sender may use, stamped by the door that authenticated it (["*"]: every agent) and
    # carried to its sub-agents and jobs; None (a raw bus client): no agent but this message's own.
    agents: list[str] | None = None


class ChatCancel(BaseMessage):
    type: Literal["chat:cancel"] = "chat:cancel"
    session_id: str
    by: str = ""


class ToolCancel(BaseMessage):
    """Stop a call wherever it runs: the worker that has it answers ``CANCELLED`` and kills its processes."""

    type: Literal["tool:cancel"] = "tool:cancel"
    call_id: str
    reason: str = ""


class _ChatEvent(BaseMessage):
    session_id: str
    message_id: str

    @property
    def correlation_id(self) -> str:
        return self.message_id


class ChatDelta(_ChatEvent):
    type: Literal["chat:delta"] = "chat:delta"
    text: str


class ChatTool(_ChatEvent):
    type: Literal["chat:tool"] = "chat:tool"
    call_id: str
    tool: str
    status: Literal["started", "progress", "finished"]
    summary: str = ""
    # started: the arguments as the model gave them (cut at 4,000 characters);
    # finished: the outcome's error code (None: ok), how long it ran, and where.
    arguments: str | None = None
    error_code: str | None = None
    duration_ms: int | None = None
    sandbox: str | None = None
    # A sub-agent's call: the delegate call (of this turn or of a sub-agent's) under which it ran.
    parent_call_id: str | None = None
    # finished delegate call: the sub-agent's answer (cut at 4,000 characters).
    answer: str | None = None


class ChatReply(_ChatEvent):
    type: Literal["chat:reply"] = "chat:reply"
    text: str
    model: str = ""
    usage: dict[str, Any] = Field(default_factory=dict)


class ChatError(_ChatEvent):
    type: Literal["chat:error"] = "chat:error"
    code: Code
    message: str


# --- approvals --------------------------------------------------------------


class ApprovalRequest(BaseMessage):
    type: Literal["approval:request"] = "approval:request"
    approval_id: str = Field(default_factory=new_id)
    call_id: str
    session_id: str
    message_id: str = ""  # the chat turn it belongs to: the Gateway shows it in that turn's stream
    tool: str
    summary: str
    expires_at: int
    reply_to: str
    # False when the summary had to be cut: the person was not shown it whole, so allow-always is off.
    always_allowed: bool = True

    @property
    def correlation_id(self) -> str:
        return self.message_id


class ApprovalDecision(BaseMessage):
    type: Literal["approval:decision"] = "approval:decision"
    approval_id: str
    decision: Literal["allow-once", "allow-always", "deny"]
    by: str

    @property
    def correlation_id(self) -> str:
        return self.approval_id


# --- questions to the person (the ask_user tool) -----------------------------


class Question(BaseModel):
    """One question put to a person: its text, and the choices that answer it (none: any text does)."""

    model_config = WIRE

    text: str = Field(min_length=1, max_length=2_000)
    choices: list[str] = Field(default_factory=list, max_length=6)


class QuestionRequest(BaseMessage):
    """An ``ask_user`` call's questions, sent where the person of its turn listens (``approvals_to``)."""

    type: Literal["question:request"] = "question:request"
    question_id: str = Field(default_factory=new_id)
    call_id: str
    session_id: str
    message_id: str = ""  # the chat turn it belongs to: the Gateway shows it in that turn's stream
    questions: list[Question] = Field(min_length=1, max_length=3)
    expires_at: int
    reply_to: str

    @property
    def correlation_id(self) -> str:
        return self.message_id


class QuestionAnswer(BaseMessage):
    """The person's answers, one per question, in order."""

    type: Literal["question:answer"] = "question:answer"
    question_id: str
    answers: list[str]
    by: str

    @property
    def correlation_id(self) -> str:
        return self.question_id


# --- chat channels ------------------------------------------------------------


class ChannelFile(BaseModel):
    """A file a person sent on a chat platform: the platform's reference to fetch it by, and what it says of it."""

    model_config = WIRE

    ref: str = Field(max_length=512)
    name: str = Field(default="", max_length=255)
    size: int = Field(default=0, ge=0)
    mime: str = Field(default="", max_length=255)


class ChannelUpdate(BaseMessage):
    """One thing that happened on a chat platform, in no platform's terms: a message said to the bot, or a
    button of one of its messages pressed. Read only by the channel's own process (gateway/channels):
    nothing of a platform reaches a Brain or Hands."""

    type: Literal["channel:update"] = "channel:update"
    channel: str  # "telegram"
    event_id: str  # the platform's id of the event (Telegram's update_id): one delivery per event
    user: str  # the platform's user id
    username: str = ""  # its handle, if any (without "@")
    chat: str  # where it happened
    group: bool = False  # a group or channel rather than a private chat
    text: str = Field(default="", max_length=64_000)
    mentioned: bool = False  # in a group: the bot was named, or replied to
    files: list[ChannelFile] = Field(default_factory=list, max_length=10)
    press: str | None = None  # a button press: the platform's id to answer it by ...
    data: str = Field(default="", max_length=256)  # ... and the button's data
    platform_message: str = ""  # the message said, or the one whose button was pressed
    invite: bool = False  # the user asks the bot into ``chat`` (a Matrix invite): accepted only if they may talk


class ChannelSend(BaseMessage):
    """Something to say in a chat on the agent's own initiative (a job's answer, an alert), read from the
    channel's outbox by its process: sent once, whatever redelivers it (``key`` names the sending)."""

    type: Literal["channel:send"] = "channel:send"
    channel: str
    chat: str
    text: str = Field(max_length=64_000)
    key: str = Field(min_length=1, max_length=256)


Message = Annotated[
    ToolsList
    | ToolsAvailable
    | ToolExecute
    | ToolResult
    | ToolProgress
    | ToolCancel
    | ChatMessage
    | ChatCancel
    | ChatDelta
    | ChatTool
    | ChatReply
    | ChatError
    | ApprovalRequest
    | ApprovalDecision
    | QuestionRequest
    | QuestionAnswer
    | ChannelUpdate
    | ChannelSend,
    Field(discriminator="type"),
]
