"""`pincer hooks`: signed webhooks that start turns (add, list, rotate, rm)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from bus.config import Config
from bus.redis_client import RedisAway
from gateway.cli.connect import connected_bus
from gateway.server.hooks import HookStore, remove_and_forget


def command(args: argparse.Namespace, config: Config) -> int:
    return asyncio.run(_hooks(config, args))


async def _hooks(config: Config, args: argparse.Namespace) -> int:
    if args.action != "list" and not args.name:
        print(f"pincer: error: `pincer hooks {args.action}` needs the hook's NAME", file=sys.stderr)
        return 2
    try:
        async with connected_bus(config) as bus:
            store = HookStore(bus.redis, bus.keys)
            if args.action == "add":
                if not args.template:
                    print("pincer: error: --template TEXT is needed: what the agent is asked, with {payload} "
                          "where the request's body goes", file=sys.stderr)
                    return 2
                secret = await store.add(args.name, agent=args.agent, template=args.template, deliver=args.deliver)
                print(secret)
                print(f"hook {args.name!r} made: POST /v1/hooks/{args.name}, signed with the secret above "
                      "(shown this once; keep it where the sender can read it)", file=sys.stderr)
                return 0
            if args.action == "rotate":
                secret = await store.rotate(args.name, grace_s=args.grace)
                print(secret)
                print(f"hook {args.name!r} has a new secret (shown this once); the old one is good for "
                      f"{args.grace:g}s more", file=sys.stderr)
                return 0
            if args.action == "rm":
                stopped = await remove_and_forget(bus, store, args.name)
                if stopped is None:
                    print(f"pincer: error: no hook named {args.name!r}", file=sys.stderr)
                    return 1
                print(f"hook {args.name!r} removed: its requests are refused from now on"
                      + (f"; its jobs removed: {', '.join(stopped)}" if stopped else ""), file=sys.stderr)
                return 0
            hooks = await store.list()
    except (ValueError, ValidationError) as exc:
        print(f"pincer: error: {_plain(exc)}", file=sys.stderr)
        return 1
    except RedisAway as exc:
        print(f"pincer: error: cannot reach Redis: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([h.shown() for h in hooks], indent=2))
        return 0
    table = Table("hook", "agent", "delivers to", "template")
    for hook in hooks:
        table.add_row(hook.name, hook.agent, hook.deliver or "-", hook.template[:60])
    Console().print(table if hooks else "no hooks (`pincer hooks add NAME --template TEXT`)")
    return 0


def _plain(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
    return str(exc)


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _hooks_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", default="list", choices=["add", "list", "rotate", "rm"])
    parser.add_argument("name", nargs="?", metavar="NAME", help="lowercase letters, digits, _ and -")
    parser.add_argument("--agent", default="main", help="the agent that answers (default main)")
    parser.add_argument("--template", metavar="TEXT", help="add: what the agent is asked; {payload} marks where "
                       "the request's body goes (as untrusted data)")
    parser.add_argument("--deliver", metavar="URL", help="add: POST each turn's outcome here, signed the same way")
    parser.add_argument("--grace", type=float, default=3600.0, metavar="S",
                       help="rotate: seconds the old secret stays good (default 3600; 0: at once)")
    parser.add_argument("--json", action="store_true", help="print JSON (list)")
    parser.add_argument("--redis", metavar="URL")


ARGUMENTS = {"hooks": _hooks_arguments}
