"""Code execution tools: run a command or Python code in the sandbox, inside the workspace."""

from __future__ import annotations

import asyncio
import shlex
from typing import Any

from bus.protocol import ErrorCode
from hands.errors import ToolFailure
from hands.permissions import Permissions
from hands.registry import Category, ToolContext, ToolDefinition
from hands.sandbox.env import sandbox_env
from hands.sandbox.runner import SandboxUnavailable
from hands.sandbox.running import Running

_PERMS = Permissions(filesystem_read=["{workspace}/**"], filesystem_write=["{workspace}/**"], execute=["*"])
_TIMEOUT = {"type": "number", "minimum": 1, "maximum": 86_400,
            "description": "Seconds before it is killed with everything it started (default 30)"}
_NO_BACKGROUND = "this worker keeps no background processes"


async def run_command(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    if ("command" in args) == ("argv" in args):
        raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, "give exactly one of command (a shell line) or argv (a list)")
    if "command" in args:
        await _approve(ctx, command=args["command"], argv=None, summary=args["command"], args=args)
        return await _run(["/bin/sh", "-c", args["command"]], args, ctx)
    await _approve(ctx, command=None, argv=args["argv"], summary=shlex.join(args["argv"]), args=args)
    return await _run(list(args["argv"]), args, ctx)


async def run_python(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    argv = ["python3", "-I", "-c", args["code"]]
    await _approve(ctx, command=None, argv=argv, summary=f"python3 code:\n{args['code']}", args=args)
    return await _run(argv, args, ctx)


async def _approve(ctx: ToolContext, *, command: str | None, argv: list[str] | None, summary: str,
                   args: dict[str, Any]) -> None:
    """Exec approvals come before anything runs (hands.exec.mode)."""
    if ctx.approvals is not None and ctx.call is not None:
        where = args.get("workdir", ".")
        await ctx.approvals.check(command=command, argv=argv, call=ctx.call, summary=f"{summary}\n(in {where})")


async def _run(argv: list[str], args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    workdir = args.get("workdir", ".")
    with ctx.workspace.open_dir(workdir):  # exists, beneath the workspace, no links on the way
        relative = "/".join(ctx.workspace.parts(workdir))
    env = sandbox_env(args.get("env"))
    timeout = min(float(args.get("timeout", ctx.settings.sandbox.default_timeout_s)),
                  ctx.settings.background.max_timeout_s)
    if ctx.sandbox is None:
        raise ToolFailure(ErrorCode.SERVICE_UNAVAILABLE, "this worker has no sandbox to run commands in",
                          retryable=False)
    background = ctx.background
    full = background.room_for(ctx.session_id) if background is not None else _NO_BACKGROUND
    if args.get("background") and full:
        raise ToolFailure(ErrorCode.RESOURCE_EXHAUSTED, f"cannot start a background process: {full}",
                          suggestions=["kill a background process you no longer need (process list, process kill)",
                                       "or run the command in the foreground"])
    try:
        running: Running = await ctx.sandbox.start(argv, workdir=relative, env=env, session=ctx.session_id,
                                                    root=ctx.workspace.root, shared=ctx.workspace.shared)
    except SandboxUnavailable as exc:
        raise ToolFailure(ErrorCode.PERMISSION_DENIED, str(exc),
                          suggestions=["ask the operator to install bubblewrap"]) from None
    ctx.notes["sandbox"] = running.tier
    adopted = False
    try:
        if not args.get("background") and running.process.stdin is not None:
            running.process.stdin.close()  # only background processes take input (process write)
        yield_s = 0.0 if args.get("background") else args.get("yield_ms", 10_000) / 1000
        if not await running.wait(min(yield_s, timeout)) and yield_s < timeout:
            running.timed_out = False  # it yielded, it did not time out
            if background is None or background.room_for(ctx.session_id):  # no room: it runs in the foreground
                await running.wait(timeout - yield_s)
                return _exited(running.result(), timeout)
            proc = await background.adopt(running, session_id=ctx.session_id, command=" ".join(argv),
                                          timeout_s=timeout)
            adopted = True
            proc.polled_out, proc.polled_err = running.out.total, running.err.total
            return {"status": "running", "process_id": proc.id, "stdout": running.out.text(),
                    "stderr": running.err.text(), "sandbox": running.tier,
                    "note": f"still running in the background; use the process tool with process_id {proc.id!r} "
                            "(poll, log, write, kill)"}
    finally:
        if not adopted:
            await running.stop()
    return _exited(running.result(), timeout)


def _exited(result: Any, timeout: float) -> dict[str, Any]:
    """The answer for a command that ran to its end (or its timeout) in the foreground."""
    output = {"stdout": result.stdout, "stderr": result.stderr}
    if result.timed_out:
        raise ToolFailure(
            ErrorCode.TIMEOUT,
            f"the command did not finish within its {timeout:g}s limit and was killed, with everything it started",
            details={**output, "sandbox": result.tier},
            suggestions=["give it a longer timeout, run it in the background, or do less per call"],
        )
    return {"status": "exited", "exit_code": result.exit_code, "signal": result.signal, **output,
            "duration_ms": result.duration_ms, "sandbox": result.tier,
            **({"output_dropped_bytes": result.dropped_bytes} if result.dropped_bytes else {})}


async def process(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Manage background processes: list, poll, log, write, kill."""
    action = args["action"]
    background = ctx.background
    if background is None:
        raise ToolFailure(ErrorCode.SERVICE_UNAVAILABLE, _NO_BACKGROUND, retryable=False)
    if action == "list":
        return {"processes": await background.listing(ctx.session_id)}
    if "process_id" not in args:
        raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, f"process {action} needs a process_id")
    process_id = args["process_id"]
    if process_id not in background.processes:
        owner = await background.owner(process_id)
        if owner is None:
            raise ToolFailure(ErrorCode.FILE_NOT_FOUND,
                              f"no background process {process_id!r} (finished ones are pruned after a while)",
                              suggestions=["process list shows the background processes of this session"])
        raise ToolFailure(ErrorCode.WORKER_LOST,
                          f"background process {process_id!r} ran on worker {owner}, which is gone; the process and "
                          "its output are lost", suggestions=["start the command again"], retryable=False)
    proc = background.local(process_id, session_id=ctx.session_id)  # only the session's own
    running = proc.running
    if action == "poll":
        wait = float(args.get("wait_s", 0))
        deadline = asyncio.get_running_loop().time() + wait
        # The output buffers notify no one: a 50 ms poll, for at most wait_s.
        while (wait and not running.done and running.out.total == proc.polled_out  # noqa: ASYNC110
               and running.err.total == proc.polled_err and asyncio.get_running_loop().time() < deadline):
            await asyncio.sleep(0.05)
        if running.done:
            await running.stop()  # collect the last output
        stdout, proc.polled_out = running.out.since(proc.polled_out)
        stderr, proc.polled_err = running.err.since(proc.polled_err)
        return {**proc.summary(), "stdout": stdout, "stderr": stderr}
    if action == "log":
        lines = int(args.get("lines", 50))
        return {**proc.summary(), "stdout": "\n".join(running.out.text().splitlines()[-lines:]),
                "stderr": "\n".join(running.err.text().splitlines()[-lines:])}
    if action == "write":
        try:
            await running.write(args.get("data", "").encode(), close=bool(args.get("eof")))
        except (BrokenPipeError, ConnectionResetError):
            raise ToolFailure(ErrorCode.INVALID_ARGUMENTS,
                              f"background process {process_id!r} no longer reads its input") from None
        return {**proc.summary(), "written": len(args.get("data", "").encode())}
    if action == "kill":
        await running.stop()
        return proc.summary()
    raise AssertionError(action)  # the schema allows no other action


_EXEC_PARAMS = {
    "type": "object",
    "properties": {
        "command": {
            "type": "string",
            "minLength": 1,
            "maxLength": 100_000,
            "description": "A shell line, run by sh -c",
        },
        "argv": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "description": "A program and its arguments, run without a shell",
        },
        "workdir": {"type": "string", "description": "Directory relative to the workspace (default '.')"},
        "env": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "Extra environment variables",
        },
        "timeout": _TIMEOUT,
        "yield_ms": {
            "type": "integer",
            "minimum": 0,
            "maximum": 120_000,
            "description": "Return with a process_id if it still runs after this long (default 10000)",
        },
        "background": {"type": "boolean", "description": "Start it in the background, return a process_id at once"},
    },
    "additionalProperties": False,
}
_EXEC_DESCRIPTION = ("Run a shell command (sh -c), e.g. `make test`, `grep -rn TODO .` or `pip list`, in a "
                     "sandbox with the workspace as its current directory (mounted at /workspace). No network. "
                     "Returns exit_code, stdout and stderr.")


CODE_TOOLS = [
    # execute_shell: the name the seed gave it, still answered; listed once, it costs every prompt less.
    ToolDefinition(name="exec", aliases=("execute_shell",), description=_EXEC_DESCRIPTION, parameters=_EXEC_PARAMS,
                   handler=run_command, category=Category.CODE, permissions=_PERMS, timeout_s=120, idempotent=False),
    ToolDefinition(
        name="execute_python",
        description="Run Python 3 code in a sandbox (workspace as current directory, no network). "
                    "Print what you want to see.",
        parameters={"type": "object", "properties": {
            "code": {"type": "string", "minLength": 1, "maxLength": 200_000}, "timeout": _TIMEOUT,
            "workdir": {"type": "string"}}, "required": ["code"], "additionalProperties": False},
        handler=run_python, category=Category.CODE, permissions=_PERMS, timeout_s=120, idempotent=False,
    ),
    ToolDefinition(
        name="process",
        description="Manage background processes started by exec: list, poll (new output since the last poll; "
                    "wait_s up to 30 waits for output or exit), log (last lines), write (to stdin), kill.",
        parameters={"type": "object", "properties": {
            "action": {"type": "string", "enum": ["list", "poll", "log", "write", "kill"]},
            "process_id": {"type": "string", "pattern": "^proc-[0-9a-f]{10}$"},
            "wait_s": {"type": "number", "minimum": 0, "maximum": 30},
            "lines": {"type": "integer", "minimum": 1, "maximum": 10_000},
            "data": {"type": "string", "maxLength": 1_000_000},
            "eof": {"type": "boolean", "description": "Close stdin after writing"},
        }, "required": ["action"], "additionalProperties": False},
        handler=process, category=Category.CODE, timeout_s=45, idempotent=False,
    ),
]
