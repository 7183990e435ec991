"""``pincer mcp serve``: the Hands pool's tools, as one MCP server, to any MCP client.

Claude Code or Desktop (or any client of the official SDKs) lists and calls
the tools the tool policy allows one agent, and the pool runs them over the
bus as it runs the Brain's calls: validated, limited, sandboxed. A tool's
progress becomes MCP progress, a cancelled request a ``tool:cancel``, and a
failed call an ``isError`` result carrying Pincer's error code and message.

Over stdio the caller is whoever started the process (``--sender``). Over
streamable HTTP (``--http PORT``) every request passes the Gateway's own
guard (Host, Origin, body size, a Pincer token) and the token names the
sender; a token limited to other agents is refused. Each sender has a session
of its own (``<sender>/mcp-<server>``: its background processes and its place
in the pool's fair queues are its own), and over HTTP each token's calls count
against the Gateway's per-token limits (calls a minute, calls at once).

The ``mcp`` SDK is pinned to its 2.x line: the current one (1.x is kept for
fixes only), whose low-level ``Server`` takes its handlers as arguments.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from bus.config import Config
from bus.log import setup_logging
from bus.presence import version
from bus.protocol import (
    ErrorCode,
    Message,
    ToolCancel,
    ToolExecute,
    ToolProgress,
    ToolResult,
    ToolsAvailable,
    ToolsList,
    new_id,
    now_ms,
)
from bus.replies import ReplyInbox
from bus.service import new_instance_id, redis_url, run_loop
from bus.streams import Bus
from gateway.config import GatewaySettings
from gateway.tokens import Identity
from gateway.turns.limits import CallerLimits
from gateway.turns.refusal import Refused

log = logging.getLogger("gateway.mcp")

LIST_TIMEOUT_S = 10.0
# Tools that only make sense inside a chat turn: delegate (a Brain starts the sub-agent) and ask_user (a
# person of the turn answers): an MCP client is neither.
IN_A_TURN = frozenset({"agent_delegation", "person_interaction"})


class PoolTools:
    """The pool seen as an MCP server's tools, for one agent and sender."""

    def __init__(self, bus: Bus, inbox: ReplyInbox, *, agent_id: str, sender: str, call_timeout_s: float,
                 limits: CallerLimits | None = None) -> None:
        self.bus, self.inbox, self.limits = bus, inbox, limits
        self.agent_id, self.sender, self.call_timeout_s = agent_id, sender, call_timeout_s
        self.server_id = f"mcp-{new_id()[:12]}"

    def session_of(self, sender: str) -> str:
        """Each sender's own session on this server (never one shared by every token)."""
        return f"{sender}/{self.server_id}"

    def _sender(self, ctx: ServerRequestContext[Any]) -> str:
        """The HTTP request's token name (the guard put it there), or the configured sender over stdio."""
        request = ctx.request
        identity = getattr(request, "scope", {}).get("state", {}).get("identity") if request is not None else None
        if not isinstance(identity, Identity):
            return self.sender
        if not identity.may_use(self.agent_id):
            raise PermissionError(f"the token {identity.name!r} may not use agent {self.agent_id!r}")
        return identity.name

    async def list_tools(self, ctx: ServerRequestContext[Any], _params: Any) -> types.ListToolsResult:
        request = ToolsList(reply_to=self.inbox.stream, deadline=now_ms() + int(LIST_TIMEOUT_S * 1000),
                            agent_id=self.agent_id, sender=self._sender(ctx))
        try:
            reply = await self.inbox.request(self.bus.keys.hands_requests, request, request.request_id,
                                             timeout=LIST_TIMEOUT_S)
        except TimeoutError:
            raise RuntimeError("no Hands worker answered; start one with `pincer hands` or `pincer up`") from None
        assert isinstance(reply, ToolsAvailable)
        return types.ListToolsResult(tools=[
            types.Tool(name=spec.name, description=spec.description, input_schema=spec.parameters)
            for spec in reply.tools if spec.meta.category not in IN_A_TURN])

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            sender = self._sender(ctx)
        except PermissionError as exc:
            return _failure(ErrorCode.FORBIDDEN, str(exc))
        if self.limits is None:
            return await self._call(ctx, params, sender)
        try:  # over HTTP: the token's calls a minute, and its calls at once, as for its chat turns
            await self.limits.take_message(sender)
            hold = self.limits.hold_turn(sender, stream=False)
        except Refused as refused:
            return _failure(refused.code, refused.message)
        try:
            return await self._call(ctx, params, sender)
        finally:
            hold.release()

    async def _call(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams,
                    sender: str) -> types.CallToolResult:
        call = ToolExecute(tool=params.name, args=dict(params.arguments or {}), session_id=self.session_of(sender),
                           agent_id=self.agent_id, sender=sender, reply_to=self.inbox.stream,
                           deadline=now_ms() + int(self.call_timeout_s * 1000))
        token = ctx.meta.get("progress_token") if isinstance(ctx.meta, dict) else \
            getattr(ctx.meta, "progress_token", None)
        steps = 0

        async def progress(event: Message) -> None:
            nonlocal steps
            if token is not None and isinstance(event, ToolProgress):
                steps += 1
                await ctx.session.send_progress_notification(token, steps, message=event.message or event.status)

        try:
            result = await self.inbox.request(self.bus.keys.hands_requests, call, call.call_id,
                                              timeout=self.call_timeout_s, final=(ToolResult,), on_event=progress)
        except TimeoutError:
            return _failure(ErrorCode.TIMEOUT, f"no Hands worker answered within {self.call_timeout_s:g}s")
        except BaseException:  # the client cancelled the request: stop the call wherever it runs
            await self.bus.publish(self.bus.keys.hands_control, ToolCancel(call_id=call.call_id,
                                                                          reason="the MCP client cancelled"))
            raise
        assert isinstance(result, ToolResult)
        if not result.success:
            error = result.error
            assert error is not None
            return _failure(error.code, error.message, suggestions=error.suggestions)
        data = result.data
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)
        structured = data if isinstance(data, dict) else None
        return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=structured)


def _failure(code: ErrorCode, message: str, *, suggestions: list[str] | None = None) -> types.CallToolResult:
    body = {"error": code.value, "message": message, **({"suggestions": suggestions} if suggestions else {})}
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(body, ensure_ascii=False))],
                                is_error=True)


async def serve(config: Config, *, agent_id: str, sender: str, call_timeout_s: float,
                http: tuple[str, int] | None = None) -> int:
    bus = Bus.from_settings(config.redis, redis_url(config))
    inbox = ReplyInbox(bus, new_instance_id("mcp"), block_ms=200)
    await inbox.start()
    limits = CallerLimits(bus, config.section("gateway", GatewaySettings).limits) if http is not None else None
    tools = PoolTools(bus, inbox, agent_id=agent_id, sender=sender, call_timeout_s=call_timeout_s, limits=limits)
    server: Server[Any] = Server("pincer", version=version(), on_list_tools=tools.list_tools,
                                 on_call_tool=tools.call_tool,
                                 instructions=f"The tools of Pincer's agent {agent_id!r}, run by its Hands pool.")
    try:
        if http is None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
        else:
            await _serve_http(config, bus, server, host=http[0], port=http[1])
    finally:
        await inbox.close()
        await bus.close()
    return 0


async def _serve_http(config: Config, bus: Bus, server: Server[Any], *, host: str, port: int) -> None:
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    from bus.metrics import Meter
    from gateway.server.guard import Guard
    from gateway.tokens import TokenStore, read_owner_token

    settings = config.section("gateway", GatewaySettings).model_copy(update={"host": host, "port": port})
    static = settings.static_token() or read_owner_token(config.runtime.data_path)
    # Host and Origin are the guard's to check, as for the Gateway (one rule, one home).
    app = server.streamable_http_app(streamable_http_path="/mcp", host=host,
                                     max_request_body_size=settings.max_body_bytes,
                                     transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    guarded = Guard(app, settings=settings, tokens=TokenStore(bus.redis, bus.keys, static=static), meter=Meter())
    class Listening(uvicorn.Server):
        """Says it serves once its socket listens: a client that reads the line may connect at once."""

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                log.info("serving MCP over streamable HTTP at http://%s:%d/mcp (a Pincer token is required)",
                         host, port)

    await Listening(uvicorn.Config(guarded, host=host, port=port, log_level="warning", lifespan="on")).serve()


def main(config: Config, *, agent_id: str, sender: str, call_timeout_s: float,
         http: tuple[str, int] | None = None) -> int:
    # Over stdio, stdout carries the protocol: every log line goes to stderr.
    setup_logging("mcp", "stdio" if http is None else "http", config.runtime.log_level, fmt=config.runtime.log_format)
    try:
        return run_loop(serve(config, agent_id=agent_id, sender=sender, call_timeout_s=call_timeout_s, http=http))
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout.flush()
