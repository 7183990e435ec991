"""Exec approvals: whether a command may run (deny | allowlist | ask | full), asked before it runs.

An allowlist entry names a program by its resolved path (a glob) and may
constrain its arguments with a regex. A shell line matches only when every
segment of it (split on pipes, ``;``, ``&&``, ``||``, ``&``) runs an allowed
program; redirections, command substitution and subshells never match (they
can do anything). In ``ask`` mode a miss becomes a question to the person:
an ``approval:request`` goes to their Gateway, and the call waits for the
``approval:decision``. No answer in time is a ``deny``. Nothing runs before
the answer. ``allow-always`` widens what one identity may run, never anyone
else's: the programs join the always-rules of the call's sender on that
agent (kept with who allowed them and when, for ``pincer policy explain``);
the agent-wide allowlist is the operator's, in the configuration.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from bus.protocol import ApprovalDecision, ApprovalRequest, ErrorCode, ToolExecute, now_ms
from bus.records import PendingApproval
from bus.replies import ReplyInbox
from bus.streams import Bus
from hands.config import AllowEntry, ExecSettings
from hands.errors import ToolFailure
from memory.flight import FlightRecorder, Step

log = logging.getLogger("hands.approvals")

SEPARATORS = frozenset({"|", "||", "&&", ";", "&", ";;", "|&"})
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
# A person reads the whole command before allowing it; past this it is cut, said plainly, and
# "allow always" is off (nobody can approve for ever what they were not shown).
SUMMARY_CHARS = 20_000
# Programs that run whatever their arguments say: allow-always pins their exact arguments.
RUNS_ITS_ARGUMENTS = frozenset({
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "csh", "tcsh", "busybox", "env", "xargs", "find",
    "python", "python3", "perl", "ruby", "node", "nodejs", "php", "lua", "tclsh", "expect", "awk", "gawk",
    "mawk", "sed", "sudo", "su", "doas", "nice", "nohup", "timeout", "stdbuf", "setsid", "chroot", "unshare",
    "nsenter", "strace", "ltrace", "gdb", "watch", "parallel", "make", "git", "ssh", "script", "flock",
})
GLOB = frozenset("*?[~")


def _uncertain(command: str) -> str | None:
    """Why Python's shlex might not see what /bin/sh will run, or None when they agree."""
    for char in command:
        if (ord(char) < 32 and char != "\t") or ord(char) == 127:
            return "it holds a newline or a control character (sh runs each line; the check would see one)"
    if "#" in command:
        return "it holds '#' (sh may read the rest as a comment where the check would not, or the other way)"
    if "\\" in command:
        return "it uses backslash escapes"
    if "$" in command:
        return "it expands variables or quotes with $ (only known when it runs)"
    return None

@dataclass(frozen=True)
class Segment:
    path: str | None  # the resolved program, None when it cannot be known
    args: list[str]
    problem: str | None = None  # why it can never match an allowlist


def segments(command: str | None, argv: list[str] | None) -> list[Segment]:
    """The programs a command would run, as far as can be known without running it."""
    if argv is not None:
        return [_segment(list(argv))]
    assert command is not None
    if "$(" in command or "`" in command:
        return [Segment(None, [], "it uses command substitution")]
    uncertain = _uncertain(command)
    if uncertain:
        return [Segment(None, [], uncertain)]
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError as exc:
        return [Segment(None, [], f"it does not parse ({exc})")]
    found: list[Segment] = []
    current: list[str] = []
    for token in [*tokens, ";"]:
        if token in SEPARATORS:
            if current:
                found.append(_segment(current))
            current = []
        elif token[:1] in "<>()" or token.endswith((">", "<")):
            return [Segment(None, [], f"it uses {token!r} (redirections and subshells need approval)")]
        else:
            current.append(token)
    return found or [Segment(None, [], "it is empty")]


def _segment(argv: list[str]) -> Segment:
    program = argv[0]
    if "$" in program or "=" in program:
        return Segment(None, argv[1:], f"its program {program!r} is only known when it runs")
    resolved = program if "/" in program else shutil.which(program, path=SANDBOX_PATH)
    if resolved is None or not os.path.isabs(resolved):
        return Segment(None, argv[1:], f"program {program!r} is not found on {SANDBOX_PATH}")
    return Segment(os.path.realpath(resolved), argv[1:])


def matches(segment: Segment, entries: list[AllowEntry]) -> bool:
    if segment.path is None:
        return False
    # sh expands a glob or ~ to names no regex saw: such arguments match only entries without one.
    expands = any(GLOB & set(arg) for arg in segment.args)
    return any(fnmatchcase(segment.path, e.path)
               and (e.args is None or (not expands and re.fullmatch(e.args, shlex.join(segment.args))))
               for e in entries)


def remembered_entry(segment: Segment) -> dict[str, str]:
    """What allow-always adds for a segment: the program, or for one that runs its arguments
    (a shell, an interpreter, a wrapper) the program with exactly these arguments."""
    assert segment.path is not None
    if os.path.basename(segment.path).rstrip("0123456789.") in RUNS_ITS_ARGUMENTS:
        return {"path": segment.path, "args": re.escape(shlex.join(segment.args))}
    return {"path": segment.path}


def made_visible(text: str, *, keep: str = "\n\t") -> str:
    """``text`` with every control character but those in ``keep`` written out (``\\x1b``): what a person
    is shown of a model's words never drives their terminal or fakes a line."""
    return "".join(c if c in keep or (32 <= ord(c) != 127 and not 0x80 <= ord(c) < 0xA0)
                   else f"\\x{ord(c):02x}" for c in text)


def shown(summary: str) -> tuple[str, bool]:
    """The summary a person reads: control characters made visible (an escape sequence must not
    reach their terminal), whole up to SUMMARY_CHARS or plainly cut; and whether it is whole."""
    visible = made_visible(summary)
    if len(visible) <= SUMMARY_CHARS:
        return visible, True
    cut = len(visible) - SUMMARY_CHARS
    return f"{visible[:SUMMARY_CHARS]}\n[... {cut:,} more characters not shown: allow-always is off]", False


class ApprovalGate:
    def __init__(self, settings: ExecSettings, *, bus: Bus | None, inbox: ReplyInbox | None) -> None:
        self.settings, self.bus, self.inbox = settings, bus, inbox

    async def check(self, *, command: str | None, argv: list[str] | None, call: ToolExecute, summary: str) -> None:
        """Return when the command may run; raise ``PERMISSION_DENIED`` / ``APPROVAL_DENIED`` otherwise."""
        mode = self.settings.mode
        if mode == "full":
            return
        if mode == "deny":
            raise ToolFailure(ErrorCode.PERMISSION_DENIED, "running commands is turned off (hands.exec.mode: deny)",
                              suggestions=["do it without running a command"])
        parts = segments(command, argv)
        entries = [*self.settings.allowlist, *[r.entry for r in await remembered(self.bus, call.agent_id, call.sender)]]
        misses = [s for s in parts if not matches(s, entries)]
        if not misses:
            return
        why = "; ".join(m.problem or f"{m.path} is not on the allowlist" for m in misses)
        if mode == "allowlist":
            raise ToolFailure(ErrorCode.PERMISSION_DENIED, f"not allowed: {why} (hands.exec.mode: allowlist)",
                              suggestions=["use only allowlisted programs, without redirections",
                                           "an operator can add entries to hands.exec.allowlist"])
        decision, by = await self._ask(call, summary)
        if decision == "allow-always":
            await self._remember(call, [m for m in parts if m.path is not None], by=by)

    async def _ask(self, call: Any, summary: str) -> tuple[str, str]:
        """The person's decision and who made it."""
        if self.bus is None or self.inbox is None or not call.approvals_to:
            raise ToolFailure(ErrorCode.APPROVAL_DENIED, "this command needs a person's approval, and this call "
                              "came from no chat that could ask one")
        timeout = min(self.settings.approval_timeout_s, max(1.0, (call.deadline - now_ms()) / 1000 - 2))
        text, whole = shown(summary)
        request = ApprovalRequest(call_id=call.call_id, session_id=call.session_id, message_id=call.message_id or "",
                                  tool=call.tool, summary=text, expires_at=now_ms() + int(timeout * 1000),
                                  reply_to=self.inbox.stream, always_allowed=whole)
        key = self.bus.keys.approval(request.approval_id)
        pending = PendingApproval(reply_to=request.reply_to, session_id=call.session_id, tool=call.tool,
                                  summary=request.summary, expires_at=request.expires_at)
        await self.bus.redis.hset(key, mapping=pending.encode())  # type: ignore[arg-type]  # an invariant key type
        await self.bus.redis.expire(key, int(timeout) + 5)
        log.info("approval asked approval=%s call=%s", request.approval_id, call.call_id)
        try:
            reply = await self.inbox.request(call.approvals_to, request, request.approval_id, timeout=timeout,
                                             final=(ApprovalDecision,))
        except TimeoutError:
            await self._record(call, request, "no answer", "")
            raise ToolFailure(ErrorCode.APPROVAL_DENIED, f"no one approved the command within {timeout:g}s; "
                              "it was not run") from None
        finally:
            await self.bus.redis.delete(key)
        assert isinstance(reply, ApprovalDecision)
        await self._record(call, request, reply.decision, reply.by)
        log.info("approval answered approval=%s decision=%s by=%s", request.approval_id, reply.decision, reply.by)
        if reply.decision == "deny":
            raise ToolFailure(ErrorCode.APPROVAL_DENIED, f"{reply.by or 'the person'} denied running it",
                              suggestions=["ask the person what they want instead"])
        if reply.decision == "allow-always" and not whole:
            log.warning("allow-always for a command that was not shown whole taken as allow-once approval=%s",
                        request.approval_id)
            return "allow-once", reply.by
        return reply.decision, reply.by

    async def _record(self, call: Any, request: ApprovalRequest, decision: str, by: str) -> None:
        """The decision in the session's flight record (when it keeps one), before the command runs or not."""
        assert self.bus is not None
        step = Step(kind="approval", message_id=call.message_id or "",
                    data={"call_id": call.call_id, "tool": call.tool, "summary": request.summary,
                          "decision": decision, "by": by, "approval_id": request.approval_id})
        await FlightRecorder(self.bus.redis, self.bus.keys, keep_s=0).add_if_kept(call.session_id, step)

    async def _remember(self, call: ToolExecute, parts: list[Segment], *, by: str) -> None:
        if self.bus is None or not parts:
            return
        if not call.sender:  # a call from no identity: there is no one whose rules could widen
            log.warning("allow-always for a call with no sender taken as allow-once call=%s", call.call_id)
            return
        why = json.dumps({"by": by, "at": now_ms()})
        await self.bus.redis.hset(self.bus.keys.exec_allowlist(call.agent_id, call.sender),
                                  mapping={json.dumps(remembered_entry(p)): why for p in parts})


@dataclass(frozen=True)
class AlwaysRule:
    """An allow-always rule: what it allows, whom it covers, who allowed it and when (Unix ms)."""

    entry: AllowEntry
    covers: str
    by: str
    at: int


async def remembered(bus: Bus | None, agent_id: str, sender: str) -> list[AlwaysRule]:
    """The always-rules that cover ``sender`` on ``agent_id`` (none for a call with no sender)."""
    if bus is None or not sender:
        return []
    raw = await bus.redis.hgetall(bus.keys.exec_allowlist(agent_id, sender))
    rules = []
    for entry, why in sorted(raw.items()):
        meta = json.loads(why)
        rules.append(AlwaysRule(AllowEntry.model_validate(json.loads(entry)), sender, str(meta.get("by", "")),
                                int(meta.get("at", 0))))
    return rules
