"""What the pool can do: `pincer tools` (asked of the running Hands) and `pincer skills` (read from disk)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from bus.config import Config


def skills(args: argparse.Namespace, config: Config) -> int:
    return _skills(config, as_json=args.json)


def tools(args: argparse.Namespace, config: Config) -> int:
    return asyncio.run(_tools(config, as_json=args.json))


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
    from gateway.cli.connect import connected_bus

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


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _skills_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


def _tools_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--redis", metavar="URL")


ARGUMENTS = {"skills": _skills_arguments, "tools": _tools_arguments}
