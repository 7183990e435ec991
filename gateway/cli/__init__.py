"""The ``pincer`` command line: run the processes, chat, inspect."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import cast

from bus.config import EX_CONFIG, Config, ConfigError, load_config
from bus.secrets_file import apply_secrets, private_enough, secrets_path

SECTIONS = {"redis", "runtime", "hands", "brain", "gateway", "channels"}

# Each command: the function that runs it ("module:function" in gateway/cli) and its line of help. The
# module declares the command's arguments beside the function, in its ARGUMENTS; it is imported only
# when its command runs (so `pincer chat` never loads the Hands engine).
COMMANDS: dict[str, tuple[str, str]] = {
    "setup": ("setup:command", "first run: the model (and its key), a chat app, your name: writes the data dir's "
                               "config.yaml and secrets.env (0600)"),
    "up": ("runtime:up", "run everything on this machine: Redis, Gateway, Brain, Hands"),
    "stop": ("runtime:stop", "stop the `pincer up` of this data dir (workers drain first)"),
    "restart": ("runtime:stop", "stop, then start again in the background, as it was started"),
    "service": ("runtime:service", "systemd units: install (start at boot, restart on failure) | uninstall"),
    "mcp": ("runtime:mcp", "MCP: `pincer mcp serve` offers the pool's tools to any MCP client"),
    "trace": ("trace:command", "a session's turns as timelines: model calls, tool calls, waits"),
    "record": ("record:command", "a session's flight record: show SESSION | export SESSION | import FILE"),
    "fork": ("fork:command", "a new session from a session's first N messages, no model asked for them"),
    "replay": ("replay:command", "run a recorded session again through the current config, answered from its "
                                 "record: what changed, where it first shows"),
    "eval": ("evals:command", "run eval cases (YAML) offline against recordings or --live: a table, "
                              "JUnit XML, regressions against a baseline"),
    "logs": ("runtime:logs", "read the logs `pincer up` writes (runtime.log_dir)"),
    "hands": ("runtime:hands", "run one Hands worker (joins the pool on the configured Redis)"),
    "brain": ("runtime:brain", "run one Brain"),
    "gateway": ("runtime:gateway", "run the Gateway's HTTP API"),
    "chat": ("chat:command", "chat with the agent through a running Gateway"),
    "open": ("opener:command", "open the chat page in a browser, signed in by a one-time link"),
    "token": ("tokens:command", "Gateway tokens: create NAME | list | revoke NAME"),
    "skills": ("catalog:skills", "list the skills this machine's Hands would load, and the refused ones"),
    "policy": ("policy:command", "the tool policy: `pincer policy explain TOOL` says why it is (not) allowed"),
    "status": ("ops:status", "the pool at a glance: instances, queues, pending work, dead letters"),
    "dead": ("ops:dead", "the dead-letter stream: list | show ID | retry ID...|--all | purge ID...|--all"),
    "channel": ("runtime:channel", "run one chat channel's process (as `pincer up` does per enabled one)"),
    "channels": ("channels:command", "chat channels: list (state) | add NAME (check its credentials, save them) "
                                     "| pair CODE | paired | unpair USER"),
    "hooks": ("hooks:command", "signed webhooks that start turns: add NAME | list | rotate NAME | rm NAME"),
    "cron": ("cron:command", "scheduled jobs: add NAME | list | show | pause | resume | rm | run | runs "
                             "(as the token's identity, through the Gateway)"),
    "memory": ("memory:command", "long-term notes: list | rm KEY (as the token's identity, through the "
                                 "Gateway; a deleted note leaves no copy)"),
    "budget": ("budget:command", "spend today and this month per pool, agent and identity, against "
                                 "brain.budget's limits"),
    "tools": ("catalog:tools", "list the tools Hands offers"),
    "backup": ("backup:backup", "one verified archive of everything Pincer keeps (Redis at one instant, the data "
                                "dir, the workspaces), taken while the pool runs; secrets only if asked"),
    "restore": ("backup:restore_command", "bring a backup into a fresh data dir and an empty Redis "
                                          "(--verify-only: check it, change nothing)"),
}


def _parser(command: str | None) -> argparse.ArgumentParser:
    """Every command with its help; the arguments of ``command`` alone (from its own module)."""
    from bus.release import VERSION  # the release itself: bus.presence (its other home) brings redis-py along

    parser = argparse.ArgumentParser(prog="pincer", description="Pincer agent runtime")
    parser.add_argument("--version", action="version", version=f"pincer {VERSION}")
    parser.add_argument("--config", metavar="PATH", help="config file (default: $PINCER_CONFIG, else "
                        "config.yaml in the data dir, else the packaged defaults)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (target, help_text) in COMMANDS.items():
        own = sub.add_parser(name, help=help_text)
        if name == command:
            module = importlib.import_module(f"gateway.cli.{target.partition(':')[0]}")
            module.ARGUMENTS[name](own)
    return parser


def _command(argv: list[str]) -> str | None:
    """The command named on the line: the first word that is not an option (nor --config's value)."""
    words = iter(argv)
    for word in words:
        if word == "--config":
            next(words, None)
        elif not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(_command(argv)).parse_args(argv)
    if getattr(args, "redis", None):
        os.environ["PINCER_REDIS_URL"] = args.redis
    if getattr(args, "listen", None):
        os.environ["PINCER_REDIS__LISTEN"] = args.listen  # the supervisor and its children see the same
    try:
        read_secrets_file()
        config = load_config(args.config)
        config.check_sections(SECTIONS)
        return runner(args.command)(args, config)
    except ConfigError as exc:
        print(f"pincer: error: {exc}", file=sys.stderr)
        return EX_CONFIG
    except KeyboardInterrupt:
        return 130


def read_secrets_file() -> None:
    """The data dir's secrets.env into this process's environment, under what the environment already sets:
    `pincer up` hands each role its share of both alike (bus/secrets_file.py)."""
    path = secrets_path(os.environ)
    if not private_enough(path):
        print(f"pincer: warning: {path} may be read by others than its owner: chmod 600 {path}", file=sys.stderr)
    apply_secrets(os.environ, path)


def runner(command: str) -> Callable[[argparse.Namespace, Config], int]:
    module, _, function = COMMANDS[command][0].partition(":")
    return cast(Callable[[argparse.Namespace, Config], int],
                getattr(importlib.import_module(f"gateway.cli.{module}"), function))
