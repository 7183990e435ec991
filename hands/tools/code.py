"""Code execution tools: run a command or Python code in the sandbox, inside the workspace."""

from __future__ import annotations

from typing import Any

from bus.protocol import ErrorCode
from hands.errors import ToolFailure
from hands.registry import Category, Permissions, ToolContext, ToolDefinition
from hands.sandbox.env import sandbox_env
from hands.sandbox.runner import RunResult, SandboxUnavailable

_PERMS = Permissions(filesystem_read=["{workspace}/**"], filesystem_write=["{workspace}/**"], execute=["*"])
_TIMEOUT = {"type": "number", "minimum": 1, "maximum": 120, "description": "Seconds before it is killed (default 30)"}


async def run_command(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    if ("command" in args) == ("argv" in args):
        raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, "give exactly one of command (a shell line) or argv (a list)")
    argv = ["/bin/sh", "-c", args["command"]] if "command" in args else list(args["argv"])
    return await _run(argv, args, ctx)


async def run_python(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return await _run(["python3", "-I", "-c", args["code"]], args, ctx)


async def _run(argv: list[str], args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    workdir = args.get("workdir", ".")
    with ctx.workspace.open_dir(workdir):  # exists, beneath the workspace, no links on the way
        relative = "/".join(ctx.workspace.parts(workdir))
    env = sandbox_env(args.get("env"))
    timeout = float(args.get("timeout", ctx.settings.sandbox.default_timeout_s))
    if ctx.sandbox is None:
        raise ToolFailure(ErrorCode.SERVICE_UNAVAILABLE, "this worker has no sandbox to run commands in",
                          retryable=False)
    try:
        result: RunResult = await ctx.sandbox.run(argv, workdir=relative, env=env, timeout_s=timeout)
    except SandboxUnavailable as exc:
        raise ToolFailure(ErrorCode.PERMISSION_DENIED, str(exc),
                          suggestions=["ask the operator to install bubblewrap"]) from None
    ctx.notes["sandbox"] = result.tier
    output = {"stdout": result.stdout, "stderr": result.stderr}
    if result.timed_out:
        raise ToolFailure(
            ErrorCode.TIMEOUT,
            f"the command did not finish within its {timeout:g}s limit and was killed, with everything it started",
            details={**output, "sandbox": result.tier},
            suggestions=["give it a longer timeout (up to 120 s), or do less per call"],
        )
    return {"exit_code": result.exit_code, "signal": result.signal, **output, "duration_ms": result.duration_ms,
            "sandbox": result.tier, **({"output_dropped_bytes": result.dropped_bytes} if result.dropped_bytes else {})}


_EXEC_PARAMS = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "minLength": 1, "maxLength": 100_000, "description": "A shell line, run by sh -c"},
        "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1, "description": "A program and its "
                 "arguments, run without a shell"},
        "workdir": {"type": "string", "description": "Directory relative to the workspace (default '.')"},
        "env": {"type": "object", "additionalProperties": {"type": "string"},
                "description": "Extra environment variables"},
        "timeout": _TIMEOUT,
    },
    "additionalProperties": False,
}
_EXEC_DESCRIPTION = ("Run a command in a sandbox with the workspace as its current directory (mounted at "
                     "/workspace). No network. Returns exit_code, stdout and stderr.")


def _exec_tool(name: str) -> ToolDefinition:
    return ToolDefinition(name=name, description=_EXEC_DESCRIPTION, parameters=_EXEC_PARAMS, handler=run_command,
                          category=Category.CODE, permissions=_PERMS, timeout_s=120, idempotent=False)


CODE_TOOLS = [
    _exec_tool("exec"),
    _exec_tool("execute_shell"),
    ToolDefinition(
        name="execute_python",
        description="Run Python 3 code in a sandbox (workspace as current directory, no network). "
                    "Print what you want to see.",
        parameters={"type": "object", "properties": {
            "code": {"type": "string", "minLength": 1, "maxLength": 200_000}, "timeout": _TIMEOUT,
            "workdir": {"type": "string"}}, "required": ["code"], "additionalProperties": False},
        handler=run_python, category=Category.CODE, permissions=_PERMS, timeout_s=120, idempotent=False,
    ),
]
