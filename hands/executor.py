"""The Hands lifecycle for one call: validate, execute, shape, answer."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import Any

from bus.log import kv
from bus.protocol import ErrorCode, ResultMetadata, ToolExecute, ToolResult, now_ms
from hands.config import HandsSettings
from hands.errors import ToolFailure, to_tool_error
from hands.registry import ToolContext, ToolDefinition, ToolRegistry
from hands.shaping import shape
from hands.workspace import Workspace

log = logging.getLogger("hands.executor")

MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1.0, 120.0


class Executor:
    def __init__(self, registry: ToolRegistry, settings: HandsSettings, *, worker_id: str) -> None:
        self.registry, self.settings, self.worker_id = registry, settings, worker_id
        self.workspace = Workspace(settings.workspace)  # resolved once, not per call

    async def execute(self, call: ToolExecute) -> ToolResult:
        started = time.monotonic()
        try:
            if call.deadline <= now_ms():
                raise ToolFailure(
                    ErrorCode.TIMEOUT,
                    "the call's deadline passed before a worker could start it; it was not run",
                    recoverable=True,
                )
            tool = self.registry.get(call.tool)
            self.registry.validate(tool.name, call.args)
            timeout = self._timeout(tool, call)
            data = await self._run(tool, call, timeout)
            shaped, truncated = shape(data, self.settings.max_result_bytes)
            result = self._result(call, started, success=True, data=shaped, truncated=truncated)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure becomes an answer the LLM can read
            error = to_tool_error(exc)
            if error.code is ErrorCode.UNHANDLED:
                log.exception("tool raised %s", kv(call=call.call_id, tool=call.tool))
            result = self._result(call, started, success=False, error=error)
        log.info(
            "call done %s",
            kv(call=call.call_id, session=call.session_id, tool=call.tool, ok=result.success,
               code=result.error.code if result.error else None, ms=result.metadata.duration_ms),
        )
        return result

    def _timeout(self, tool: ToolDefinition, call: ToolExecute) -> float:
        wanted = tool.timeout_s or self.settings.default_timeout_s
        left = (call.deadline - now_ms()) / 1000
        return max(MIN_TIMEOUT_S, min(wanted, MAX_TIMEOUT_S, left))

    async def _run(self, tool: ToolDefinition, call: ToolExecute, timeout: float) -> Any:
        ctx = ToolContext(call_id=call.call_id, session_id=call.session_id, worker_id=self.worker_id,
                          settings=self.settings, workspace=self.workspace)
        try:
            async with asyncio.timeout(timeout):
                if inspect.iscoroutinefunction(tool.handler):
                    return await tool.handler(call.args, ctx)
                return await asyncio.to_thread(tool.handler, call.args, ctx)  # keep the loop free
        except TimeoutError:
            raise ToolFailure(
                ErrorCode.TIMEOUT, f"{tool.name} did not finish within its {timeout:.1f}s limit", recoverable=True
            ) from None

    def _result(self, call: ToolExecute, started: float, *, success: bool, data: Any = None,
                error: Any = None, truncated: bool = False) -> ToolResult:
        metadata = ResultMetadata(
            tool_name=call.tool, duration_ms=int((time.monotonic() - started) * 1000),
            truncated=truncated, worker_id=self.worker_id,
        )
        return ToolResult(call_id=call.call_id, success=success, data=data, error=error, metadata=metadata)
