"""The ``pincer`` command line: run the processes, chat, inspect."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import cast

from bus.config import EX_CONFIG, Config, ConfigError, load_config
from gateway.channels.config import KNOWN as KNOWN_CHANNELS

SECTIONS = {"redis", "runtime", "hands", "brain", "gateway", "channels"}


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

    channel = sub.add_parser("channel", help="run one chat channel's process (as `pincer up` does per enabled one)")
    channel.add_argument("name", choices=KNOWN_CHANNELS)
    channel.add_argument("--redis", metavar="URL")

    channels = sub.add_parser("channels", help="chat channels: list (state) | pair CODE | paired | unpair USER")
    channels.add_argument("action", nargs="?", default="list", choices=["list", "pair", "paired", "unpair"])
    channels.add_argument("arg", nargs="?", metavar="CODE|USER", help="pair: the code a stranger was given; "
                          "unpair: their user id")
    channels.add_argument("--channel", default="telegram", choices=KNOWN_CHANNELS)
    channels.add_argument("--json", action="store_true", help="print JSON")
    channels.add_argument("--redis", metavar="URL")

    hooks = sub.add_parser("hooks", help="signed webhooks that start turns: add NAME | list | rotate NAME | rm NAME")
    hooks.add_argument("action", nargs="?", default="list", choices=["add", "list", "rotate", "rm"])
    hooks.add_argument("name", nargs="?", metavar="NAME", help="lowercase letters, digits, _ and -")
    hooks.add_argument("--agent", default="main", help="the agent that answers (default main)")
    hooks.add_argument("--template", metavar="TEXT", help="add: what the agent is asked; {payload} marks where "
                       "the request's body goes (as untrusted data)")
    hooks.add_argument("--deliver", metavar="URL", help="add: POST each turn's outcome here, signed the same way")
    hooks.add_argument("--grace", type=float, default=3600.0, metavar="S",
                       help="rotate: seconds the old secret stays good (default 3600; 0: at once)")
    hooks.add_argument("--json", action="store_true", help="print JSON (list)")
    hooks.add_argument("--redis", metavar="URL")

    cron = sub.add_parser("cron", help="scheduled jobs: add NAME | list | show | pause | resume | rm | run | runs "
                          "(as the token's identity, through the Gateway)")
    cron.add_argument("action", choices=["add", "list", "show", "pause", "resume", "rm", "run", "runs"])
    cron.add_argument("name", nargs="?", metavar="NAME", help="lowercase letters, digits, _ and -")
    when = cron.add_mutually_exclusive_group()
    when.add_argument("--every", metavar="DURATION", help="add: run every 10s, 30m, 2h, 1d")
    when.add_argument("--cron", metavar="EXPR", help="add: a cron expression, such as \"0 8 * * 1-5\"")
    when.add_argument("--at", metavar="WHEN", help="add: once, at an ISO 8601 time (2026-12-24T18:00)")
    cron.add_argument("--tz", default="UTC", help="add: the time zone of --cron and of an --at without offset")
    cron.add_argument("--message", "-m", help="add: what the agent is asked each time")
    cron.add_argument("--agent", default="main", help="add: the agent that runs it (default main)")
    cron.add_argument("--session", help="add: the session it runs in (default cron-NAME)")
    cron.add_argument("--deliver", action="append", metavar="CHANNEL:CHAT",
                      help="add: also send the answer to this chat (repeatable), e.g. telegram:123456789")
    cron.add_argument("--catch-up", default="run_once", choices=["run_once", "skip", "all"],
                      help="add: what to do with instants missed while no scheduler ran (default run_once)")
    cron.add_argument("--window", default="1h", metavar="DURATION",
                      help="add: with --catch-up all, how far back missed instants are run (default 1h)")
    cron.add_argument("--daily-usd", type=float, metavar="USD", help="add: the job's own spend limit per day "
                      "(its turns also count in its owner's and the pool's budgets)")
    cron.add_argument("--limit", type=int, default=50, help="runs: how many records (default 50)")
    cron.add_argument("--json", action="store_true", help="print JSON")
    cron.add_argument("--url", help="Gateway URL (default: from gateway.host/port)")
    cron.add_argument("--token-file", metavar="FILE", help="read the Gateway token from FILE (as for `pincer chat`)")

    memory = sub.add_parser("memory", help="long-term notes: list | rm KEY (as the token's identity, through the "
                            "Gateway; a deleted note leaves no copy)")
    memory.add_argument("action", nargs="?", default="list", choices=["list", "rm"])
    memory.add_argument("key", nargs="?", metavar="KEY", help="rm: the note's name")
    memory.add_argument("--agent", default="main", help="the agent whose notes (default main)")
    memory.add_argument("--owner", metavar="NAME", help="another identity's notes (an operator token)")
    memory.add_argument("--shared", action="store_true", help="the agent's shared notes (rm: an operator token)")
    memory.add_argument("--json", action="store_true", help="print JSON")
    memory.add_argument("--url", help="Gateway URL (default: from gateway.host/port)")
    memory.add_argument("--token-file", metavar="FILE", help="read the Gateway token from FILE (as for `pincer chat`)")

    budget = sub.add_parser("budget", help="spend today and this month per pool, agent and identity, "
                            "against brain.budget's limits")
    budget.add_argument("--json", action="store_true", help="print JSON")
    budget.add_argument("--redis", metavar="URL")

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
        return runner(args.command)(args, config)
    except ConfigError as exc:
        print(f"pincer: error: {exc}", file=sys.stderr)
        return EX_CONFIG
    except KeyboardInterrupt:
        return 130


# Each command: the function that runs it, as "module:function" in gateway/cli, imported only when it runs
# (so `pincer chat` never loads the Hands engine).
COMMANDS = {
    "up": "runtime:up", "stop": "runtime:stop", "restart": "runtime:stop", "service": "runtime:service",
    "logs": "runtime:logs", "hands": "runtime:hands", "brain": "runtime:brain", "gateway": "runtime:gateway",
    "mcp": "runtime:mcp",
    "chat": "chat:command", "open": "opener:command", "token": "tokens:command", "trace": "trace:command",
    "status": "ops:status", "dead": "ops:dead", "policy": "policy:command",
    "tools": "catalog:tools", "skills": "catalog:skills",
    "channel": "runtime:channel", "channels": "channels:command", "hooks": "hooks:command",
    "budget": "budget:command", "cron": "cron:command", "memory": "memory:command",
}


def runner(command: str) -> Callable[[argparse.Namespace, Config], int]:
    module, _, function = COMMANDS[command].partition(":")
    return cast(Callable[[argparse.Namespace, Config], int],
                getattr(importlib.import_module(f"gateway.cli.{module}"), function))
