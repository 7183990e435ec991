"""The Hands lifecycle for one call: validate, limit, execute (with retries), shape, answer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from bus.log import kv
from bus.metrics import Meter
from bus.protocol import (
    ErrorCode,
    ToolError,
    ToolExecute,
    ToolProgress,
    ToolResult,
    now_ms,
)
from hands.config import HandsSettings, workspaces
from hands.errors import ToolFailure, to_tool_error
from hands.limits import Limiter, check_memory
from hands.notes import CallersNotes
from hands.permissions import PermissionPolicy
from hands.registry import (
    Category,
    ToolContext,
    ToolDefinition,
    ToolRegistry,
)
from hands.shaping import Batch, shape
from hands.timeouts import time_limit
from hands.toolpolicy import ToolPolicy

if TYPE_CHECKING:  # the worker's services, passed in (they import nothing of the executor)
    from hands.seams import ApprovalAsking, BackgroundKeeping, NoteKeeping, PoolGates, QuestionAsking, Sandboxing
    from memory.jobs import JobStore

log = logging.getLogger("hands.executor")

MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1.0, 120.0
PROGRESS_CATEGORIES = frozenset({Category.NETWORK, Category.CODE})

ProgressSink = Callable[[str, ToolProgress], Awaitable[Any]]
"""Sends a ``tool:progress`` to a stream (the call's ``reply_to``)."""


async def _drop_progress(_stream: str, _progress: ToolProgress) -> None:
    return None


@dataclass
class _CallState:
    """What one call accumulates on its way through the lifecycle."""

    ctx: ToolContext
    started: float
    attempts: int = 0


class Executor:
    def __init__(self, registry: ToolRegistry, settings: HandsSettings, *, worker_id: str,
                 memory: NoteKeeping | None = None, sandbox: Sandboxing | None = None,
                 background: BackgroundKeeping | None = None, approvals: ApprovalAsking | None = None,
                 questions: QuestionAsking | None = None,
                 pool: PoolGates | None = None, progress: ProgressSink = _drop_progress, meter: Meter | None = None,
                 schedules: JobStore | None = None) -> None:
        self.registry, self.settings, self.worker_id = registry, settings, worker_id
        # Resolved once, not per call; files it creates belong to the sandbox's uid.
        self.workspaces = workspaces(settings, owner=sandbox.owner if sandbox else None)
        self.workspace = self.workspaces.main
        self.policy = PermissionPolicy(settings.policy, self.workspace.root)
        self.limiter = Limiter(settings.concurrency, settings.queue)
        self._retry_policy = settings.retry
        self.tool_policy = ToolPolicy(settings.tools)
        self.memory, self.sandbox, self.background, self.progress = memory, sandbox, background, progress
        self.schedules = schedules
        self.meter = meter or Meter()  # what /metrics shows of this worker's calls (sent with its heartbeat)
        self.approvals, self.questions = approvals, questions
        self.pool = pool  # limits across every worker, when configured
        self._admitted: set[tuple[str, str, str]] = set()
        self._wanted: dict[str, float] = {}  # tool name -> its time limit before the call's deadline

    async def execute(self, call: ToolExecute) -> ToolResult:
        state = _CallState(ctx=self._context(call), started=time.monotonic())
        started = state.started
        try:
            if call.deadline <= now_ms():
                raise ToolFailure(ErrorCode.TIMEOUT,
                                  "the call's deadline passed before a worker could start it; it was not run")
            tool = self.registry.get(call.tool)
            self._admit(tool, call)
            self.registry.validate(tool.name, call.args)
            check_memory(self.settings.memory_watermark)
            if tool.category in PROGRESS_CATEGORIES:
                async with self._reporting(tool, call, started):
                    data = await self._with_retries(tool, call, state)
            else:
                data = await self._with_retries(tool, call, state)
            data, failures = _unbatch(tool, data)
            shaped, truncated = shape(data, self.settings.max_result_bytes)
            result = self._result(call, state, data=shaped, truncated=truncated, partial_failure=failures or None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure becomes an answer the LLM can read
            error = to_tool_error(exc)
            if error.code is ErrorCode.UNHANDLED:
                log.exception("tool raised %s", kv(call=call.call_id, tool=call.tool))
            result = self._result(call, state, error=error)
        if log.isEnabledFor(logging.INFO):  # formatting costs on the hot path: only when it is shown
            log.info("call done %s", kv(call=call.call_id, session=call.session_id, tool=call.tool,
                                        ok=result.success, code=result.error.code if result.error else None,
                                        attempts=result.metadata.attempts, ms=result.metadata.duration_ms))
        return result

    def cancelled(self, call: ToolExecute, reason: str) -> ToolResult:
        """The answer for a call stopped by ``tool:cancel`` (its processes are already gone)."""
        return self.unrun(call, ToolFailure(ErrorCode.CANCELLED, "the call was cancelled"
                                            + (f": {reason}" if reason else ""), recoverable=False))

    def unrun(self, call: ToolExecute, failure: ToolFailure) -> ToolResult:
        """An answer for a call that is not (or no longer) run: cancelled, lost with a dead worker, ..."""
        state = _CallState(ctx=self._context(call), started=time.monotonic())
        log.info("call not run %s", kv(call=call.call_id, session=call.session_id, tool=call.tool,
                                        code=failure.code))
        return self._result(call, state, error=failure.to_error())

    def _admit(self, tool: ToolDefinition, call: ToolExecute) -> None:
        """The tool policy and the permission policy; both depend only on settings fixed for the
        worker's life, so an admitted (tool, agent, sender) is not checked again."""
        key = (tool.name, call.agent_id, call.sender)
        if key in self._admitted:
            return
        self._check_tool_policy(tool, call)
        self._check_permissions(tool)
        if len(self._admitted) >= 10_000:
            self._admitted.clear()
        self._admitted.add(key)

    def _check_tool_policy(self, tool: ToolDefinition, call: ToolExecute) -> None:
        decision = self.tool_policy.decide(tool, agent=call.agent_id, sender=call.sender)
        if not decision.allowed:
            raise ToolFailure(
                ErrorCode.PERMISSION_DENIED, f"{tool.name} is not allowed for agent {call.agent_id!r}: {decision.rule}",
                suggestions=["use one of the tools you were given", f"`pincer policy explain {tool.name}` shows why"],
            )

    def _check_permissions(self, tool: ToolDefinition) -> None:
        violations = self.policy.violations(tool.permissions)
        if violations:
            raise ToolFailure(
                ErrorCode.PERMISSION_DENIED,
                f"{tool.name} needs more than the policy allows: " + "; ".join(violations),
                suggestions=self.policy.suggestions(violations), details={"violations": violations},
            )

    async def _with_retries(self, tool: ToolDefinition, call: ToolExecute, state: _CallState) -> Any:
        """Run the tool; retry retryable failures with backoff (idempotent tools only)."""
        policy = tool.retry or self._retry_policy
        retries = policy.retries if tool.idempotent else 0  # a side effect may have happened
        state.attempts = 1
        try:  # the first attempt without tenacity's machinery: most calls need no other
            return await self._attempt(tool, call, state.ctx)
        except ToolFailure as exc:
            if not retries or not _retryable(exc) or call.deadline <= now_ms():
                raise
        retrying = AsyncRetrying(
            stop=stop_after_attempt(retries),
            before_sleep=None,
            wait=wait_exponential_jitter(multiplier=policy.base_s, max=policy.max_s, jitter=policy.base_s),
            retry=retry_if_exception(lambda exc: _retryable(exc) and call.deadline > now_ms()),
        )
        try:
            # tenacity's own pause before attempt two (the first ran without its machinery, above)
            await asyncio.sleep(retrying.wait(RetryCallState(retrying, fn=None, args=(), kwargs={})))
            async for attempt in retrying:
                with attempt:
                    state.attempts = attempt.retry_state.attempt_number + 1
                    return await self._attempt(tool, call, state.ctx)
        except RetryError as exc:
            last = exc.last_attempt.exception()
            assert isinstance(last, ToolFailure)
            raise ToolFailure(
                ErrorCode.RETRY_EXHAUSTED,
                f"{tool.name} failed {state.attempts} times; last error {last.code.value}: {last.message}",
                details={"attempts": state.attempts, "last_error": last.code.value},
                suggestions=["try again later, or another way"],
            ) from None
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _pool_slot(self, gates: tuple[tuple[str, int], ...], tool: ToolDefinition) -> Any:
        assert self.pool is not None  # only called when pool limits are configured
        return self.pool.slot(list(dict.fromkeys([gate for gate, _ in gates] + [f"tool:{tool.name}"])))

    async def _attempt(self, tool: ToolDefinition, call: ToolExecute, ctx: ToolContext) -> Any:
        limiter = self.limiter
        gates = limiter.gates(tool.category, tool.name, tool.max_concurrency)  # a StrEnum: no .value on the hot path
        if not limiter.take_if_free(gates):  # the common case needs no await: most calls find a slot
            await limiter.wait(gates)
        try:
            if self.pool is not None and self.pool.limits:
                async with self._pool_slot(gates, tool):
                    return await self._timed(tool, call, ctx)
            return await self._timed(tool, call, ctx)
        finally:
            limiter.release(gates)

    async def _timed(self, tool: ToolDefinition, call: ToolExecute, ctx: ToolContext) -> Any:
        timeout = self._timeout(tool, call)
        try:
            with time_limit(timeout):
                if self.registry.is_async(tool.name):
                    return await tool.handler(call.args, ctx)
                return await asyncio.to_thread(tool.handler, call.args, ctx)  # keep the loop free
        except TimeoutError:
            raise ToolFailure(ErrorCode.TIMEOUT, f"{tool.name} did not finish within its {timeout:g}s limit",
                              suggestions=["ask for less work per call"]) from None

    def _timeout(self, tool: ToolDefinition, call: ToolExecute) -> float:
        wanted = self._wanted.get(tool.name)
        if wanted is None:  # settings are fixed for the worker's life
            # A category without a setting of its own (delegate's, run in the Brain) gets the shortest.
            default: float = getattr(self.settings.timeouts, tool.category.key, MIN_TIMEOUT_S)
            wanted = self._wanted[tool.name] = tool.timeout_s or default
        left = (call.deadline - now_ms()) / 1000
        if tool.category is Category.PERSON:  # a person answers at their pace: only the call's deadline bounds it
            return max(MIN_TIMEOUT_S, left)
        return max(MIN_TIMEOUT_S, min(wanted, MAX_TIMEOUT_S, left))

    def _context(self, call: ToolExecute) -> ToolContext:
        return ToolContext(call_id=call.call_id, session_id=call.session_id, agent_id=call.agent_id,
                           worker_id=self.worker_id, settings=self.settings,
                           workspace=self.workspaces.of(call.sender),
                           memory=None if self.memory is None else CallersNotes(
                               self.memory, owner=call.sender, turn=call.message_id or "",
                               may_share=call.sender in self.settings.tools.owners),
                           sandbox=self.sandbox, policy=self.policy, background=self.background,
                           approvals=self.approvals, questions=self.questions, call=call,
                           send_progress=self._progress_sender(call), schedules=self.schedules)

    def _progress_sender(self, call: ToolExecute) -> Callable[[str], Awaitable[Any]]:
        started = time.monotonic()

        def send(message: str) -> Awaitable[Any]:  # a closure only: most calls never report
            return self.progress(call.reply_to, ToolProgress(
                call_id=call.call_id, status="output", message=message,
                elapsed_ms=int((time.monotonic() - started) * 1000)))

        return send

    @contextlib.asynccontextmanager
    async def _reporting(self, tool: ToolDefinition, call: ToolExecute, started: float) -> AsyncIterator[None]:
        """For network and code tools: ``started`` at once, then ``running`` every interval."""
        async def report(status: Literal["started", "running", "output"]) -> None:
            elapsed = int((time.monotonic() - started) * 1000)
            await self.progress(call.reply_to, ToolProgress(
                call_id=call.call_id, status=status, message=f"{tool.name} {status}", elapsed_ms=elapsed))

        async def beat() -> None:
            while True:
                await asyncio.sleep(self.settings.progress_interval_s)
                await report("running")

        await report("started")
        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _result(self, call: ToolExecute, state: _CallState, *, data: Any = None, error: ToolError | None = None,
                truncated: bool = False, partial_failure: list[dict[str, Any]] | None = None) -> ToolResult:
        elapsed, attempts = time.monotonic() - state.started, max(state.attempts, 1)
        self.meter.count("pincer_tool_calls", call.tool, "ok" if error is None else error.code.value)
        self.meter.observe("pincer_tool_call_seconds", elapsed, call.tool)
        if attempts > 1:
            self.meter.count("pincer_tool_retries", call.tool, value=attempts - 1)
        # Validated from a dict by pydantic-core itself: half the cost of the two constructors' Python
        # wrappers; model_construct is slower still (it inspects default factories). Figures: docs/bus.md.
        return _validate_result({
            "call_id": call.call_id, "success": error is None, "data": data, "error": error,
            "partial_failure": partial_failure,
            "metadata": {"tool_name": call.tool, "duration_ms": int(elapsed * 1000),
                         "timestamp": now_ms(), "truncated": truncated, "worker_id": self.worker_id,
                         "attempts": attempts, "sandbox": state.ctx.notes.get("sandbox")},
        })


_validate_result: Callable[[dict[str, Any]], ToolResult] = ToolResult.__pydantic_validator__.validate_python


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, ToolFailure) and exc.retryable


def _unbatch(tool: ToolDefinition, data: Any) -> tuple[Any, list[dict[str, Any]]]:
    """A batch tool's outcome: all good, partial (data plus the failures), or ``ALL_FAILED``."""
    if not isinstance(data, Batch):
        return data, []
    failures = [item for item in data.items if not item.get("success")]
    if data.items and len(failures) == len(data.items):
        raise ToolFailure(
            ErrorCode.ALL_FAILED, f"every one of the {len(failures)} items of {tool.name} failed",
            details={"failures": failures}, recoverable=True,
            suggestions=["check the failures listed in details and fix the inputs"],
        )
    return {"items": data.items, "succeeded": len(data.items) - len(failures), "failed": len(failures)}, failures
