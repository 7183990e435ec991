"""`pincer channels`: each chat channel's state, and who is let in by pairing."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from bus.config import Config
from bus.pool import channel_rows
from bus.redis_client import RedisAway
from gateway.channels import access
from gateway.channels.config import KNOWN as KNOWN_CHANNELS
from gateway.channels.config import ChannelSettings
from gateway.cli.channel_setup import add_arguments
from gateway.cli.connect import connected_bus


def command(args: argparse.Namespace, config: Config) -> int:
    if args.action == "add":
        from gateway.cli.channel_setup import add

        return add(args, config)
    return asyncio.run(_channels(config, args.action, args.arg, channel=args.channel, as_json=args.json))


async def _channels(config: Config, action: str, arg: str | None, *, channel: str, as_json: bool) -> int:
    if action in ("pair", "unpair") and not arg:
        print(f"pincer: error: `pincer channels {action}` needs a "
              f"{'CODE (the one the stranger was given)' if action == 'pair' else 'USER (their user id)'}",
              file=sys.stderr)
        return 2
    try:
        async with connected_bus(config) as bus:
            if action == "pair":
                assert arg is not None
                who = await access.pair(bus, channel, arg, by="cli")
                if who is None:
                    print(f"pincer: error: no pending pairing code {arg!r} on {channel}: it was used, expired, "
                          "or mistyped (a stranger is given a new one when they write again)", file=sys.stderr)
                    return 1
                name = f" (@{who['username']})" if who.get("username") else ""
                print(f"{channel} user {who['user']}{name} may talk to the agent now, as "
                      f"{access.identity_name(channel, who['user'])}")
                return 0
            if action == "unpair":
                assert arg is not None
                stopped = await access.unpair_and_forget(bus, channel, arg)
                if stopped is None:
                    print(f"pincer: error: {channel} user {arg} was not paired", file=sys.stderr)
                    return 1
                print(f"{channel} user {arg} is a stranger again (allow_from still lets in whoever it names)"
                      + (f"; their jobs removed: {', '.join(stopped)}" if stopped else ""))
                return 0
            if action == "paired":
                found = await access.paired(bus, channel)
                print(json.dumps(found, indent=2) if as_json else
                      "\n".join(f"{user}  {how}" for user, how in sorted(found.items())) or "nobody is paired")
                return 0
            rows = await channel_rows(bus, config.section("channels", ChannelSettings).enabled())
    except RedisAway as exc:
        print(f"pincer: error: cannot reach Redis: {exc}", file=sys.stderr)
        return 1
    return _show(rows, as_json=as_json)


def _show(rows: list[dict[str, Any]], *, as_json: bool) -> int:
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no channel is enabled (channels.<name>.enabled in the config: telegram, email)")
        return 0
    print_channels(Console(), rows)
    return 0


def print_channels(console: Console, rows: list[dict[str, Any]]) -> None:
    table = Table("channel", "state", "bot", "replicas", "last progress", "in", "out", "errors", "last error",
                  title="Channels")
    for row in rows:
        ago = f"{row['last_progress_s_ago']}s ago" if row["last_progress_s_ago"] is not None else "-"
        table.add_row(row["channel"], row["state"], row["bot"] or "-", str(row["replicas"]),
                      ago, str(row["in"]), str(row["out"]), str(row["errors"]), row["last_error"])
    console.print(table)


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _channels_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", default="list", choices=["list", "add", "pair", "paired", "unpair"])
    parser.add_argument("arg", nargs="?", metavar="NAME|CODE|USER", help="add: the channel (telegram, slack, "
                        "discord, matrix, email); pair: the code a stranger was given; unpair: their user id")
    parser.add_argument("--channel", default="telegram", choices=KNOWN_CHANNELS)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--redis", metavar="URL")
    parser.add_argument("-y", "--yes", action="store_true", help="add: take every default without asking")
    add_arguments(parser)


ARGUMENTS = {"channels": _channels_arguments}
