"""``pincer token create | list | revoke``: the Gateway's tokens, kept hashed in Redis."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime

from rich.console import Console
from rich.table import Table

from bus.config import Config
from bus.redis_client import RedisAway, RedisRefused
from gateway.cli.connect import connected_bus
from gateway.config import GatewaySettings
from gateway.tokens import NAME_PATTERN, TokenError, TokenStore, revoke_and_forget


async def manage_tokens(config: Config, action: str, name: str | None, *, scope: str, agents: list[str],
                        as_json: bool) -> int:
    if action in ("create", "revoke") and not name:
        print(f"pincer: error: `pincer token {action}` needs a NAME", file=sys.stderr)
        return 2
    settings = config.section("gateway", GatewaySettings)
    try:
        async with connected_bus(config) as bus:
            store = TokenStore(bus.redis, bus.keys, static=settings.static_token())
            if action == "create":
                assert name is not None
                token = await store.create(name, scope=scope, agents=agents or None)  # type: ignore[arg-type]  # argparse choices
                print(token)
                print(f"token {name!r} ({scope}{', agents ' + ', '.join(agents) if agents else ''}) created; "
                      "it is shown this once: keep it somewhere safe", file=sys.stderr)
                return 0
            if action == "revoke":
                assert name is not None
                stopped = await revoke_and_forget(bus, store, name)
                if stopped is None:
                    print(f"pincer: error: no token named {name!r} (`pincer token list` shows them)", file=sys.stderr)
                    return 1
                print(f"token {name!r} revoked (Gateways stop accepting it within seconds)"
                      + (f"; its jobs removed: {', '.join(stopped)}" if stopped else ""), file=sys.stderr)
                return 0
            identities = await store.list()
    except TokenError as exc:
        print(f"pincer: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # the name does not fit NAME_PATTERN
        print(f"pincer: error: token names are 1-64 letters, digits and _ . @ - ({NAME_PATTERN}): {exc}",
              file=sys.stderr)
        return 2
    except (RedisAway, RedisRefused) as exc:
        print(f"pincer: error: cannot reach Redis: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps([i.model_dump(mode="json") for i in identities], indent=2))
        return 0
    table = Table("name", "scope", "agents", "created")
    for identity in identities:
        created = datetime.fromtimestamp(identity.created, UTC).strftime("%Y-%m-%d %H:%M UTC")
        table.add_row(identity.name, identity.scope, ", ".join(identity.agents or ("(all)",)), created)
    if settings.static_token():
        table.add_row("owner", "operator", "(all)", "(gateway.token)")
    Console().print(table)
    return 0


def command(args: argparse.Namespace, config: Config) -> int:
    return asyncio.run(manage_tokens(config, args.action, args.name, scope=args.scope, agents=args.agent,
                                     as_json=args.json))


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _token_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["create", "list", "revoke"])
    parser.add_argument("name", nargs="?", metavar="NAME", help="who the token is for (its sender name)")
    parser.add_argument("--scope", choices=["chat", "operator"], default="chat",
                       help="chat: its own sessions only (default); operator: every session, approvals, ops")
    parser.add_argument("--agent", action="append", default=[], metavar="AGENT",
                       help="an agent it may use (repeat; default: every agent)")
    parser.add_argument("--json", action="store_true", help="print JSON (list)")
    parser.add_argument("--redis", metavar="URL")


ARGUMENTS = {"token": _token_arguments}
