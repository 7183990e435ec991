"""Sub-agents: a turn's ``delegate`` call becomes a turn of its own on the bus.

The child is an ordinary ``chat:message``: its own session (named after the
parent's), the parent's sender, the chosen agent's instructions and tools, the
task as the user's words. Any Brain of the pool may run it, so several children
run at once, and a child whose Brain dies is taken over like any turn. Its
message id comes from the parent's call id: a parent resumed on another Brain
sends the same child again and gets its recorded answer, never a second run.

One tree shares the root turn's limits (tokens, money, tool calls, time): each
turn of it writes what it has used into one hash, and each checks the sum.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from brain.config import BrainSettings
from brain.tool_text import local_failure
from bus.log import kv
from bus.protocol import (
    ApprovalRequest,
    ChatCancel,
    ChatError,
    ChatMessage,
    ChatReply,
    ChatTool,
    Delegation,
    ErrorCode,
    Message,
    QuestionRequest,
    ResultMetadata,
    ToolResult,
    ToolSpec,
    now_ms,
    stamp_allows,
)
from bus.scripts import lua
from bus.streams import Bus
from bus.text import text
from memory.sessions import SessionStore

log = logging.getLogger("brain.delegation")
CATEGORY = "agent_delegation"  # the delegate tool's category in Hands' listing: what marks it, whatever its name
MAX_SESSION_NAME = 128
ANSWER_GRACE_S = 5.0  # past the tree's deadline, the child's own timeout answer is still waited for


def is_delegate(spec: ToolSpec | None) -> bool:
    return spec is not None and spec.meta.category == CATEGORY


def child_message_id(call_id: str) -> str:
    """The same call gets the same child in every Brain that runs the parent's turn."""
    return hashlib.sha256(f"delegate:{call_id}".encode()).hexdigest()[:32]


def child_session(parent_session: str, call_id: str) -> str:
    """``alice/main`` -> ``alice/main:sub-1a2b3c4d``: readable and followable as the owner's own session."""
    owner, separator, name = parent_session.rpartition("/")
    child = f"{name}:sub-{call_id[:8]}"
    if len(child) > MAX_SESSION_NAME:
        child = f"sub-{call_id[:16]}"
    return f"{owner}{separator}{child}"


def role(depth: int, max_depth: int, context: str | None) -> str:
    """What a sub-agent is told besides its agent's own instructions."""
    lines = [f"You are a sub-agent (level {depth} of at most {max_depth}): another agent handed you the task in "
             "the user's message. Do it with your own tools and answer with the result itself, complete and "
             "self-contained: your answer goes back to that agent, not to a person, and nobody can answer "
             "questions you ask."]
    if context:
        lines.append(f"What the agent that asked wants you to know:\n{context}")
    return "\n\n".join(lines)


@dataclass(frozen=True)
class Totals:
    tokens: int = 0
    cost_usd: float = 0.0
    tool_calls: int = 0


@dataclass(frozen=True)
class Limits:
    """The root turn's limits, which the whole tree shares."""

    max_tokens: int
    max_tool_calls: int
    max_cost_usd: float | None
    deadline: int  # ms since the epoch

    def exceeded(self, used: Totals) -> str | None:
        """Why the tree may not go on, or None (``used``: with the tool calls it asks for)."""
        where = "across the turn and its sub-agents"
        if used.tokens >= self.max_tokens:
            return f"the tokens of the turn that delegated are used {where} (brain.max_tokens = {self.max_tokens:,})"
        if self.max_cost_usd is not None and used.cost_usd >= self.max_cost_usd:
            return (f"the money of the turn that delegated is spent {where} "
                    f"(brain.max_cost_usd = {self.max_cost_usd:g})")
        if used.tool_calls > self.max_tool_calls:
            return (f"the tool calls of the turn that delegated are used {where} "
                    f"(brain.max_tool_calls = {self.max_tool_calls})")
        return None


# KEYS: the tree's hash. ARGV: the turn's message id, its tokens, micro-dollars and tool calls, the tool calls it
# asks for now, the tree's tool-call limit, the hash's life in ms. The ask is kept only if the tree stays within
# the limit: two turns asking at once cannot both take the last calls.
UPDATE = lua("brain.delegation.update", """
local mine = ARGV[2] .. ' ' .. ARGV[3] .. ' '
redis.call('HSET', KEYS[1], ARGV[1], mine .. (tonumber(ARGV[4]) + tonumber(ARGV[5])))
redis.call('PEXPIRE', KEYS[1], ARGV[7])
local t, c, n = 0, 0, 0
for _, row in ipairs(redis.call('HVALS', KEYS[1])) do
  local a, b, d = string.match(row, '(%d+) (%d+) (%d+)')
  t = t + tonumber(a); c = c + tonumber(b); n = n + tonumber(d)
end
if tonumber(ARGV[5]) > 0 and n > tonumber(ARGV[6]) then redis.call('HSET', KEYS[1], ARGV[1], mine .. ARGV[4]) end
return {t, c, n}
""")


class TreeBudget:
    """What every turn of one tree has used. Each turn writes its own counts whole (a resumed turn
    writes them again, never adding twice) and reads the sum in the same script."""

    def __init__(self, bus: Bus, root: str, limits: Limits) -> None:
        self.key, self.limits = bus.keys.delegation_tree(root), limits
        self._update = bus.redis.register_script(UPDATE)

    async def update(self, message_id: str, used: Totals, *, asking: int = 0) -> Totals:
        """Write this turn's counts (and the tool calls it asks for, if the tree has room) and read the tree's."""
        life_ms = max(60_000, self.limits.deadline - now_ms() + 3_600_000)
        tokens, micro, calls = await self._update(keys=[self.key], args=[
            message_id, used.tokens, round(used.cost_usd * 1e6), used.tool_calls, asking,
            self.limits.max_tool_calls, life_ms])
        return Totals(tokens=int(tokens), cost_usd=int(micro) / 1e6, tool_calls=int(calls))


Publish = Callable[[Message], Awaitable[None]]


@dataclass
class Delegations:
    """The children one turn starts: refused past the limits, sent, followed, answered, cancelled."""

    bus: Bus
    sessions: SessionStore
    inbox: Any  # bus.replies.ReplyInbox: where this Brain's answers come
    settings: BrainSettings
    message: ChatMessage
    tool_name: str | None = None  # the delegate tool's name as Hands lists it (None: not offered)
    ordinals: dict[str, int] = field(default_factory=dict)  # our call id -> its place among the turn's delegations
    running: dict[str, tuple[str, str]] = field(default_factory=dict)  # call id -> (child session, message id)
    tree: TreeBudget | None = None

    @property
    def depth(self) -> int:
        return self.message.delegation.depth if self.message.delegation else 0

    @property
    def may_delegate(self) -> bool:
        return self.depth < self.settings.delegation.max_depth

    def number(self, call_id: str) -> None:
        """Count a delegate call of the turn, in the order the model made them (the same on a resume)."""
        self.ordinals.setdefault(call_id, len(self.ordinals) + 1)

    def start_tree(self, deadline: int) -> None:
        """A child turn shares its root's limits from the start; a root once it first delegates."""
        given = self.message.delegation
        if given is not None:
            limits = Limits(max_tokens=given.max_tokens, max_tool_calls=given.max_tool_calls,
                            max_cost_usd=given.max_cost_usd, deadline=given.deadline)
            self.tree = TreeBudget(self.bus, given.root, limits)
        elif self.tree is None:
            s = self.settings
            limits = Limits(max_tokens=s.max_tokens, max_tool_calls=s.max_tool_calls, max_cost_usd=s.max_cost_usd,
                            deadline=deadline)
            self.tree = TreeBudget(self.bus, self.message.message_id, limits)

    async def account(self, used: Totals, *, asking: int = 0) -> Totals | None:
        """Write this turn's counts into its tree and read the tree's (None: the turn is in no tree)."""
        return None if self.tree is None else await self.tree.update(self.message.message_id, used, asking=asking)

    async def run(self, call_id: str, args: dict[str, Any], spec: ToolSpec, used: Totals, publish: Publish,
                  deadline: int) -> ToolResult:
        """Start the child for one delegate call and wait for its answer; every path ends in a result."""
        refused = self._refusal(call_id, args, spec) or self._not_allowed(args.get("agent"))
        if refused is not None:
            return local_failure(call_id, spec.name, *refused)
        self.start_tree(deadline)
        assert self.tree is not None
        over = self.tree.limits.exceeded(await self.account(used) or used)
        if over is not None:
            return local_failure(call_id, spec.name, ErrorCode.BUDGET_EXHAUSTED, over, recoverable=False)
        msg, settings = self.message, self.settings
        agent = args.get("agent") or msg.agent_id
        limits = self.tree.limits
        child = ChatMessage(
            session_id=child_session(msg.session_id, call_id), message_id=child_message_id(call_id), agent_id=agent,
            sender=msg.sender, agents=msg.agents, text=args["task"], reply_to=self.inbox.stream, job=msg.job,
            instructions=role(self.depth + 1, settings.delegation.max_depth, args.get("context")),
            delegation=Delegation(root=msg.delegation.root if msg.delegation else msg.message_id,
                                  parent_session=msg.session_id, parent_call=call_id, depth=self.depth + 1,
                                  deadline=limits.deadline, max_tokens=limits.max_tokens,
                                  max_tool_calls=limits.max_tool_calls, max_cost_usd=limits.max_cost_usd))
        await self.sessions.adopt(child.session_id, like=msg.session_id)

        async def relay(event: Message) -> None:
            """The child's tool calls, approvals and questions, shown in this turn's stream under the delegate call."""
            if isinstance(event, ChatTool):
                await publish(event.model_copy(update={"session_id": msg.session_id, "message_id": msg.message_id,
                                                       "parent_call_id": event.parent_call_id or call_id}))
            elif isinstance(event, (ApprovalRequest, QuestionRequest)):
                await publish(event.model_copy(update={"session_id": msg.session_id, "message_id": msg.message_id}))

        started = time.monotonic()
        self.running[call_id] = (child.session_id, child.message_id)
        log.info("sub-agent started %s", kv(session=msg.session_id, call=call_id, child=child.session_id,
                                             agent=agent, depth=self.depth + 1))
        try:
            answer = await self.inbox.request(self.bus.keys.brain_inbox, child, child.message_id,
                                              timeout=max(0.0, (limits.deadline - now_ms()) / 1000) + ANSWER_GRACE_S,
                                              final=(ChatReply, ChatError), on_event=relay)
        except TimeoutError:
            await self.cancel("the delegating turn's time ran out", only=call_id)
            answer = ChatError(session_id=child.session_id, message_id=child.message_id, code=ErrorCode.TIMEOUT,
                               message="no answer before the delegating turn's time ran out")
        self.running.pop(call_id, None)
        await self.sessions.follow_expiry(child.session_id, like=msg.session_id)
        meta = ResultMetadata(tool_name=spec.name, worker_id=f"agent:{agent}",
                              duration_ms=int((time.monotonic() - started) * 1000))
        shown = child.session_id.rpartition("/")[2]
        if isinstance(answer, ChatReply):
            return ToolResult(call_id=call_id, success=True, metadata=meta,
                              data={"agent": agent, "session": shown, "answer": answer.text})
        assert isinstance(answer, ChatError)
        failed = local_failure(call_id, spec.name, answer.code, f"the sub-agent ({agent}, session {shown}) did not "
                               f"finish: {answer.message}", recoverable=answer.code is not ErrorCode.CANCELLED)
        return failed.model_copy(update={"metadata": meta})

    def _refusal(self, call_id: str, args: dict[str, Any], spec: ToolSpec) -> tuple[ErrorCode, str] | None:
        """Arguments, depth and fan-out, checked here: the call never reaches Hands, which would check them."""
        from jsonschema import Draft202012Validator  # here: only a delegation needs it (~2 MB with its deps)

        errors = sorted(Draft202012Validator(spec.parameters).iter_errors(args), key=lambda e: list(e.path))
        if errors:
            where = "/".join(str(p) for p in errors[0].path) or "(the arguments)"
            return ErrorCode.INVALID_ARGUMENTS, f"{where}: {errors[0].message}"
        limits = self.settings.delegation
        if not self.may_delegate:
            return ErrorCode.PERMISSION_DENIED, (
                f"sub-agents may not delegate further (brain.delegation.max_depth = {limits.max_depth}, and this "
                f"turn is at level {self.depth}): do the task yourself")
        if self.ordinals.get(call_id, 0) > limits.max_children:
            return ErrorCode.RESOURCE_EXHAUSTED, (
                f"this turn has started its {limits.max_children} sub-agents (brain.delegation.max_children): "
                "wait for their answers and do the rest yourself, or combine tasks into fewer delegations")
        agent = args.get("agent")
        if agent is not None and self.settings.for_agent(agent) is None:
            return ErrorCode.INVALID_ARGUMENTS, (f"no agent named {agent!r}; agents you may delegate to: "
                                                 f"{', '.join(self._allowed())}")
        if agent is not None and agent not in self._allowed():
            return ErrorCode.PERMISSION_DENIED, (
                f"agent {self.message.agent_id!r} may not hand tasks to {agent!r}; it may to: "
                f"{', '.join(self._allowed())} (brain.delegation.agents.{self.message.agent_id})")
        return None

    def _allowed(self) -> list[str]:
        own = self.message.agent_id
        return [own, *(a for a in self.settings.delegation.agents.get(own, []) if a != own)]

    def _not_allowed(self, agent: str | None) -> tuple[ErrorCode, str] | None:
        """An identity limited to some agents (by its token, its channel or its hook, as its door stamped the
        turn) cannot reach others through a sub-agent; a turn nobody stamped reaches none."""
        msg = self.message
        if agent is None or stamp_allows(msg.agents, msg.agent_id, agent):
            return None
        if msg.agents is None:
            return ErrorCode.PERMISSION_DENIED, (f"{msg.sender!r} may not use agent {agent!r}: this turn came "
                                                 "with no agents stamped by a door, so it may use its own agent only")
        return ErrorCode.PERMISSION_DENIED, (f"{msg.sender!r} may not use agent {agent!r} (it may use "
                                             f"{', '.join(msg.agents) or 'none'})")

    async def cancel(self, reason: str, *, only: str | None = None) -> None:
        """Stop the children still running (and, through theirs, their children and tools). One not
        started yet finds its mark when it starts."""
        for call_id, (session_id, message_id) in list(self.running.items()):
            if only is not None and call_id != only:
                continue
            await self.bus.redis.set(self.bus.keys.delegation_cancelled(message_id), reason[:500], ex=86_400)
            await self.bus.publish(self.bus.keys.brain_control, ChatCancel(session_id=session_id,
                                                                            by=f"its parent turn: {reason}"[:600]))
            log.info("sub-agent cancelled %s", kv(session=session_id, reason=reason))


async def cancelled_before_start(bus: Bus, message: ChatMessage) -> str | None:
    """Why a sub-agent's turn was cancelled before it started, or None (not cancelled, or not a sub-agent)."""
    if message.delegation is None:
        return None
    why = await bus.redis.get(bus.keys.delegation_cancelled(message.message_id))
    return None if why is None else text(why)
