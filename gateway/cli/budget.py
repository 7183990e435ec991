"""`pincer budget`: what the pool, each agent and each identity spent today and this month, against
their limits (brain.budget), the share of prompt tokens read from the provider's cache, and the latest
alerts."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from brain.config import BrainSettings
from brain.spend import report
from bus.config import Config
from bus.redis_client import RedisAway
from gateway.cli.connect import connected_bus


def command(args: argparse.Namespace, config: Config) -> int:
    settings = config.section("brain", BrainSettings)
    try:
        found = asyncio.run(_report(config, settings))
    except RedisAway as exc:
        print(f"pincer: error: cannot reach Redis: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    show(Console(), found)
    return 0


async def _report(config: Config, settings: BrainSettings) -> dict[str, Any]:
    async with connected_bus(config) as bus:
        return await report(bus, settings)


def show(console: Console, found: dict[str, Any]) -> None:
    table = Table("scope", "period", "spent", "held", "limit", "left", "calls", "tokens in/out", "cache hit",
                  title=f"Spend (days and months in {found['timezone']})")
    for row in found["budgets"]:
        limit = "-" if row["limit_usd"] is None else f"${row['limit_usd']:.2f}"
        left = "-" if row["left_usd"] is None else f"${row['left_usd']:.4f}"
        table.add_row(row["scope"], row["period"], f"${row['spent_usd']:.4f}",
                      f"${row['held_usd']:.4f}" if row["held_usd"] else "-", limit, left, str(row["calls"]),
                      f"{row['input_tokens']:,}/{row['output_tokens']:,}",
                      "-" if row["cache_hit"] is None else f"{row['cache_hit']:.0%}")
    console.print(table)
    for alert in found["alerts"]:
        console.print(f"alert: {alert.get('text', '')}")
    if not any(row["limit_usd"] is not None for row in found["budgets"]):
        console.print("No spend limit is set (brain.budget in the config): calls are counted, never refused.")


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _budget_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--redis", metavar="URL")


ARGUMENTS = {"budget": _budget_arguments}
