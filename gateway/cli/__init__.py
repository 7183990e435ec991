"""The ``pincer`` command line: run the processes, chat, inspect."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bus.config import EX_CONFIG, Config, ConfigError, load_config

if TYPE_CHECKING:
    from gateway.config import GatewaySettings

SECTIONS = {"redis", "runtime", "hands", "brain", "gateway"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pincer", description="Pincer agent runtime")
    parser.add_argument("--config", metavar="PATH", help="config file (default: $PINCER_CONFIG or ./config.yaml)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="run everything on this machine: Redis, Gateway, Brain, Hands")
    up.add_argument("--hands", type=int, default=1, metavar="N", help="Hands workers to start (default 1)")
    up.add_argument("-d", "--detach", action="store_true",
                    help="run in the background; return once the stack is ready")
    up.add_argument("--local-model", action="store_true",
                    help="chat with a small model on this machine, no key needed (brain.model: local); the first "
                    "start fetches ~1.1 GB and builds llama.cpp's bindings (~5 min), later starts are offline")
    up.add_argument("--listen", metavar="ADDR", help="the embedded Redis also on ADDR, for Hands workers on other "
                    "hosts (TLS only: needs redis.tls_cert_file and redis.tls_key_file)")

    stop = sub.add_parser("stop", help="stop the `pincer up` of this data dir (workers drain first)")
    stop.add_argument("--timeout", type=float, metavar="S", help="seconds before what is left is killed "
                      "(default: redis.drain_timeout_s + 20)")
    restart = sub.add_parser("restart", help="stop, then start again in the background, as it was started")
    restart.add_argument("--timeout", type=float, metavar="S", help="as for stop")

    service = sub.add_parser("service", help="systemd units: install (start at boot, restart on failure) | uninstall")
    service.add_argument("action", choices=["install", "uninstall"])
    service.add_argument("--dry-run", action="store_true", help="print the units instead of writing them")
    service.add_argument("--system", action="store_true", help="system units in /etc/systemd/system (root)")
    service.add_argument("--hands", type=int, default=1, metavar="N", help="Hands workers pincer.service starts")
    service.add_argument("--local-model", action="store_true", help="pincer.service runs `pincer up --local-model`")
    service.add_argument("--run-as", metavar="USER", help="--system: the unprivileged user the units run as "
                         "(default: the one who ran sudo; never root)")

    mcp = sub.add_parser("mcp", help="MCP: `pincer mcp serve` offers the pool's tools to any MCP client")
    mcp.add_argument("action", choices=["serve"])
    served = mcp.add_mutually_exclusive_group()
    served.add_argument("--stdio", action="store_true", help="serve over stdin/stdout (the default)")
    served.add_argument("--http", type=int, metavar="PORT",
                        help="serve streamable HTTP at http://HOST:PORT/mcp; every request needs a Pincer token")
    mcp.add_argument("--host", default="127.0.0.1", help="with --http: the address to listen on (127.0.0.1)")
    mcp.add_argument("--agent", default="main", help="whose tools: the policy of this agent applies (default main)")
    mcp.add_argument("--sender", default="mcp", help="the sender the tool policy sees (owner_only tools)")
    mcp.add_argument("--timeout", type=float, default=120.0, metavar="S", help="longest a call may take (120)")
    mcp.add_argument("--redis", metavar="URL")

    trace = sub.add_parser("trace", help="a session's turns as timelines: model calls, tool calls, waits")
    trace.add_argument("session", help="NAME (the owner token's session) or OWNER/NAME")
    trace.add_argument("--turn", type=int, metavar="N", help="only turn N (1 is the first)")
    trace.add_argument("--json", action="store_true", help="print JSON")
    trace.add_argument("--redis", metavar="URL")

    logs = sub.add_parser("logs", help="read the logs `pincer up` writes (runtime.log_dir)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument("--role", help="one role: gateway, brain, hands-1, model, supervisor, ...")
    logs.add_argument("-n", "--lines", type=int, default=50, metavar="N", help="last N lines of each (default 50)")

    hands = sub.add_parser("hands", help="run one Hands worker (joins the pool on the configured Redis)")
    hands.add_argument("--redis", metavar="URL", help="Redis URL (default: redis.url or the local `pincer up`)")
    hands.add_argument("--concurrency", type=int, metavar="N", help="calls this worker runs at once")

    brain = sub.add_parser("brain", help="run one Brain")
    brain.add_argument("--redis", metavar="URL")

    gateway = sub.add_parser("gateway", help="run the Gateway's HTTP API")
    gateway.add_argument("--redis", metavar="URL")
    gateway.add_argument("--port", type=int)

    chat = sub.add_parser("chat", help="chat with the agent through a running Gateway")
    chat.add_argument("-m", "--message", help="send one message, print the reply and exit")
    chat.add_argument("--session", default="main",
                      help="session name (default: main, your own); an operator reaches another's as OWNER/NAME")
    chat.add_argument("--url", help="Gateway URL (default: from gateway.host/port)")
    chat.add_argument("--token-file", metavar="FILE", help="read the Gateway token from FILE ('-': standard "
                      "input; default: $PINCER_TOKEN, gateway.token, or the one `pincer up` made in the data dir). "
                      "Never on the command line: any local user can read those")

    opener = sub.add_parser("open", help="open the chat page in a browser, signed in by a one-time link")
    opener.add_argument("--print", action="store_true", help="only print the link (for another machine's browser)")
    opener.add_argument("--url", help="Gateway URL (default: from gateway.host/port)")
    opener.add_argument("--token-file", metavar="FILE", help="read the Gateway token from FILE (as for `pincer chat`)")

    token = sub.add_parser("token", help="Gateway tokens: create NAME | list | revoke NAME")
    token.add_argument("action", choices=["create", "list", "revoke"])
    token.add_argument("name", nargs="?", metavar="NAME", help="who the token is for (its sender name)")
    token.add_argument("--scope", choices=["chat", "operator"], default="chat",
                       help="chat: its own sessions only (default); operator: every session, approvals, ops")
    token.add_argument("--agent", action="append", default=[], metavar="AGENT",
                       help="an agent it may use (repeat; default: every agent)")
    token.add_argument("--json", action="store_true", help="print JSON (list)")
    token.add_argument("--redis", metavar="URL")

    skills = sub.add_parser("skills", help="list the skills this machine's Hands would load, and the refused ones")
    skills.add_argument("--json", action="store_true", help="print JSON")

    policy = sub.add_parser("policy", help="the tool policy: `pincer policy explain TOOL` says why it is (not) allowed")
    policy.add_argument("action", choices=["explain"])
    policy.add_argument("tool")
    policy.add_argument("--agent", default="main")
    policy.add_argument("--sender", default="")

    status = sub.add_parser("status", help="the pool at a glance: instances, queues, pending work, dead letters")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument("--redis", metavar="URL")

    dead = sub.add_parser("dead", help="the dead-letter stream: list | show ID | retry ID...|--all | purge ID...|--all")
    dead.add_argument("action", choices=["list", "show", "retry", "purge"])
    dead.add_argument("ids", nargs="*", metavar="ID", help="dead-letter entry ids (from `pincer dead list`)")
    dead.add_argument("--all", action="store_true", help="retry or purge every entry")
    dead.add_argument("--limit", type=int, default=50, help="entries to list (default 50)")
    dead.add_argument("--json", action="store_true", help="print JSON")
    dead.add_argument("--redis", metavar="URL")

    tools = sub.add_parser("tools", help="list the tools Hands offers")
    tools.add_argument("--json", action="store_true", help="print JSON")
    tools.add_argument("--redis", metavar="URL")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if getattr(args, "redis", None):
        os.environ["PINCER_REDIS_URL"] = args.redis
    if getattr(args, "listen", None):
        os.environ["PINCER_REDIS__LISTEN"] = args.listen  # the supervisor and its children see the same
    try:
        config = load_config(args.config)
        config.check_sections(SECTIONS)
        return _dispatch(args, config)
    except ConfigError as exc:
        print(f"pincer: error: {exc}", file=sys.stderr)
        return EX_CONFIG
    except KeyboardInterrupt:
        return 130


def validate_all(config: Config) -> None:
    """Check every section now, so a bad value stops start-up before any process runs."""
    from brain.config import BrainSettings
    from gateway.config import GatewaySettings
    from gateway.runtime.supervisor import listen_tls
    from hands.config import HandsSettings, check_workspace

    config.redis, config.runtime  # noqa: B018 - validated on access
    listen_tls(config.redis)
    check_workspace(config.section("hands", HandsSettings), data_dir=config.runtime.data_path)
    config.section("brain", BrainSettings)
    config.section("gateway", GatewaySettings)


def _dispatch(args: argparse.Namespace, config: Config) -> int:
    match args.command:
        case "up":
            return _up(args, config)
        case "stop" | "restart":
            return _stop(args, config)
        case "service":
            from gateway.runtime import service

            if args.action == "uninstall":
                return service.uninstall(system=args.system)
            validate_all(config)
            source = Path(config.source).resolve() if config.source and args.config else None
            return service.install(hands=args.hands, system=args.system, dry_run=args.dry_run,
                                   stop_timeout_s=int(config.redis.drain_timeout_s + 30), config=source,
                                   local_model=args.local_model, run_as=args.run_as)
        case "mcp":
            from gateway.server.mcp_serve import main as serve_mcp

            return serve_mcp(config, agent_id=args.agent, sender=args.sender, call_timeout_s=args.timeout,
                             http=(args.host, args.http) if args.http is not None else None)
        case "trace":
            from gateway.cli.trace import show_trace

            return asyncio.run(show_trace(config, args.session, turn=args.turn, as_json=args.json))
        case "logs":
            from gateway.runtime.logfiles import show_logs

            return show_logs(config.runtime.logs_path, role=args.role, lines=args.lines, follow=args.follow)
        case "hands":
            from hands.main import main as hands_main

            validate_all(config)
            return hands_main(config, concurrency=args.concurrency)
        case "brain":
            from brain.main import main as brain_main

            validate_all(config)
            return brain_main(config)
        case "gateway":
            from gateway.server.main import main as gateway_main

            validate_all(config)
            return gateway_main(config, port=args.port)
        case "chat":
            from gateway.cli.chat import run_chat
            from gateway.config import GatewaySettings

            settings = config.section("gateway", GatewaySettings)
            return run_chat(args.url or settings.url, args.session, args.message,
                            token=caller_token(args, config, settings))
        case "open":
            from gateway.cli.opener import open_page
            from gateway.config import GatewaySettings

            settings = config.section("gateway", GatewaySettings)
            return open_page(args.url or settings.url, caller_token(args, config, settings), only_print=args.print,
                             data_dir=config.runtime.data_path)
        case "token":
            from gateway.cli.tokens import manage_tokens

            return asyncio.run(manage_tokens(config, args.action, args.name, scope=args.scope, agents=args.agent,
                                             as_json=args.json))
        case "tools":
            return asyncio.run(_tools(config, as_json=args.json))
        case "status":
            from gateway.cli.ops import show_status

            return asyncio.run(show_status(config, as_json=args.json))
        case "dead":
            from gateway.cli.ops import manage_dead

            return asyncio.run(manage_dead(config, args.action, args.ids, every=args.all, limit=args.limit,
                                           as_json=args.json))
        case "skills":
            return _skills(config, as_json=args.json)
        case "policy":
            from gateway.cli.policy import explain

            return explain(config, args.tool, agent=args.agent, sender=args.sender)
    raise AssertionError(args.command)


def caller_token(args: argparse.Namespace, config: Config, settings: GatewaySettings) -> str | None:
    """The token a client command uses: --token-file, else $PINCER_TOKEN, else the owner's (as `pincer up` made it)."""
    return given_token(args.token_file) or os.environ.get("PINCER_TOKEN") or chat_token(config, settings)


def given_token(path: str | None) -> str | None:
    """The token in ``path`` ('-': standard input): a secret never rides on a command line."""
    if path is None:
        return None
    try:
        text = sys.stdin.readline() if path == "-" else Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--token-file {path}: cannot read it ({exc})") from None
    token = text.strip()
    if not token:
        raise ConfigError(f"--token-file {path}: it holds no token")
    return token


def chat_token(config: Config, settings: GatewaySettings) -> str | None:
    """The configured owner token, else the one `pincer up` made in the data dir."""
    from gateway.tokens import read_owner_token

    return settings.static_token() or read_owner_token(Path(config.runtime.data_dir))


def _up(args: argparse.Namespace, config: Config) -> int:
    from gateway.runtime.supervisor import Supervisor

    if args.hands < 1:
        raise ConfigError("--hands must be at least 1")
    validate_all(config)
    env = dict(os.environ)
    if config.source is not None:
        env["PINCER_CONFIG"] = str(Path(config.source).resolve())
    argv = ["up", "--hands", str(args.hands), *(["--local-model"] if args.local_model else [])]
    if args.detach:
        from brain.config import BrainSettings
        from brain.llm import LOCAL
        from gateway.runtime.daemon import detach

        # A first local-model start installs and fetches for minutes: wait that long for it.
        local = args.local_model or config.section("brain", BrainSettings).model == LOCAL
        return detach(argv, data_dir=config.runtime.data_path, log_dir=config.runtime.logs_path, env=env,
                      **({"timeout_s": 1800} if local else {}))
    return asyncio.run(Supervisor(config, hands=args.hands, env=env, argv=argv, local_model=args.local_model).run())


def _stop(args: argparse.Namespace, config: Config) -> int:
    from gateway.runtime.daemon import StateFile, detach, stop

    data_dir = config.runtime.data_path
    timeout = args.timeout if args.timeout is not None else config.redis.drain_timeout_s + 20
    was = StateFile(data_dir).read()  # before stop removes it: restart starts it as it was started
    code = stop(data_dir, timeout_s=timeout)
    if args.command == "stop" or code != 0:
        return code
    env = dict(os.environ)
    if config.source is not None:
        env["PINCER_CONFIG"] = str(Path(config.source).resolve())
    return detach(was.argv if was else ["up"], data_dir=data_dir, log_dir=config.runtime.logs_path, env=env)


def _skills(config: Config, *, as_json: bool) -> int:
    from rich.console import Console
    from rich.table import Table

    from hands.config import HandsSettings
    from hands.worker import load_registry

    settings = config.section("hands", HandsSettings)
    registry, report = load_registry(settings)
    tools = {name: registry.get(name) for name in report.tools}
    if as_json:
        print(json.dumps({
            "tools": [{"name": n, "location": t.source} for n, t in tools.items()],
            "instructions": [s.model_dump() for s in report.instructions],
            "refused": [{"location": r.location, "reason": r.reason} for r in report.refused],
        }, indent=2))
        return 0
    table = Table(
        "skill", "kind", "status", "where / why", title="skills in " + ", ".join(map(str, settings.skill_dirs))
    )
    for name, tool in tools.items():
        table.add_row(name, "tool", "[green]loaded[/green]", tool.source)
    for skill in report.instructions:
        table.add_row(skill.name, "instructions", "[green]loaded[/green]", skill.location)
    for refusal in report.refused:
        table.add_row(Path(refusal.location).parent.name, "?", "[red]refused[/red]", refusal.reason)
    Console().print(table)
    return 0


async def _tools(config: Config, *, as_json: bool) -> int:
    from rich.console import Console
    from rich.table import Table

    from bus.protocol import ToolsAvailable, ToolsList
    from bus.replies import ReplyInbox
    from bus.service import new_instance_id
    from gateway.cli.ops import connected_bus

    try:
        async with connected_bus(config) as bus:  # Redis answers first, or the error says it does not
            inbox = ReplyInbox(bus, new_instance_id("cli"), block_ms=100)
            await inbox.start()
            try:
                request = ToolsList(reply_to=inbox.stream)
                reply = await inbox.request(bus.keys.hands_requests, request, request.request_id, timeout=5)
            finally:
                await inbox.close()
    except TimeoutError:
        print("pincer: error: no Hands worker answered within 5s; start one with `pincer hands`", file=sys.stderr)
        return 1
    except Exception as exc:  # Redis unreachable, auth failed: say so plainly
        print(f"pincer: error: cannot reach Redis: {exc}", file=sys.stderr)
        return 1
    assert isinstance(reply, ToolsAvailable)
    if as_json:
        print(json.dumps([tool.model_dump(mode="json") for tool in reply.tools], indent=2))
        return 0
    table = Table("tool", "category", "description")
    for tool in reply.tools:
        table.add_row(tool.name, str(tool.metadata.get("category", "")), tool.description)
    Console().print(table)
    return 0
