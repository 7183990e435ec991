"""Pincer's exceptions: one root, each kind where it is raised, translated at the edges.

    PincerError
    ├── ConfigError            bus.config        a person must fix the configuration (exit 78)
    ├── RedisUnreachable       bus.config        Redis did not answer at start (exit 1; a restart may help)
    ├── RedisStartError        bus.redis_server  the embedded redis-server would not start
    ├── RedisAway              bus.redis_client  Redis did not answer a command (also redis-py's ConnectionError)
    │   (NotReplicated         bus.redis_client  too few replicas confirmed a write)
    ├── RedisRefused           bus.redis_client  Redis answered with an error (also redis-py's ResponseError)
    ├── MalformedMessage       bus.codec         a stream entry that is not a Pincer message (also ValueError)
    ├── HandedOver             bus.consumer      another consumer took an entry over: it answers
    ├── NoteRefused            memory.longterm   a memory note past a limit; nothing stored (also ValueError)
    ├── RecordError            memory.flight     a flight record export that cannot be read, and which line
    ├── ForkRefused            memory.sessions   a fork that cannot be made as asked (no such message, name taken)
    ├── ToolFailure            hands.errors      a tool call failed: becomes its ToolError (the model reads it)
    ├── SandboxUnavailable     hands.sandbox.runner  no tier may run commands here, and why
    ├── NotDelivered           hands.sandbox.warm  a warm runner gone before it read a command (never escapes)
    │   (TooLarge              hands.sandbox.warm  a command too large for one message to it: it runs cold)
    ├── SkillRefused           hands.skills      a skill that will not load, and why
    ├── ToolRefused            hands.mcp.translate  an MCP tool that cannot be offered as written (also ValueError)
    ├── JobExists              memory.jobs       a scheduled job of that name exists
    ├── JobCapReached          memory.jobs       the owner has as many scheduled jobs as it may
    ├── LLMError               brain.llm         a model call failed: becomes the turn's ChatError
    ├── BudgetExceeded         brain.spend       a spend budget is used up: the call is not made
    ├── NoHandsAvailable       brain.catalog     no Hands worker answered the tool list
    ├── Diverged               brain.replay      a replay's request differs from the recording, and it may not go live
    ├── Refused                gateway.turns.refusal  a request a door will not serve (an ErrorCode)
    ├── TokenError             gateway.tokens    a token cannot be made or revoked as asked
    ├── AlreadyRunning         gateway.runtime.daemon  another `pincer up` owns the data dir
    ├── UnsafeUnit             gateway.runtime.service  a systemd unit that would run unsafely (also ValueError)
    ├── Unproven               gateway.channels.mailtext  a mail whose sender the receiver did not vouch for
    ├── ChatFailed             gateway.cli.chat  `pincer chat`'s turn or connection failed
    ├── PlatformAway           gateway.channels.errors  a chat platform did not serve a call now (try again)
    ├── PlatformRefused        gateway.channels.errors  a chat platform refused a call as asked
    ├── WeightsError           localmodel.weights  the local model's files are not what was pinned
    │   (ProvisionError        localmodel.provision  its runtime or weights could not be made ready)
    ├── NotGGUF                localmodel.gguf   a file that is not a GGUF model this reader knows
    └── TemplateFailed         localmodel.chat   a model's chat template could not render the messages

Lower layers' errors are translated where they enter: redis-py's by the bus's
connections (``bus.redis_client``: nothing outside ``bus/`` imports redis-py's
exceptions), litellm's and
the direct road's (httpx's, a provider's error status) in ``brain.llm.translate_error``, OS and httpx errors in
``hands.errors.to_tool_error`` and the web tool. What the model reads
(ToolFailure, LLMError) is kept apart from what a person must fix
(ConfigError and its kin).
"""

from __future__ import annotations


class PincerError(Exception):
    """The root of every exception Pincer raises on purpose."""
