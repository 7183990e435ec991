"""`pincer memory`: long-term notes, listed and deleted through the Gateway as the token's identity (the
owner's by default, as `pincer chat`); an operator token also reaches another's (--owner) and the shared ones."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from bus.config import Config
from gateway.cli.credentials import gateway_arguments


def command(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.gateway_api import NO_ANSWER, ask_gateway

    if args.action == "rm" and not args.key:
        print("pincer: error: `pincer memory rm` needs the note's KEY", file=sys.stderr)
        return 2
    params: dict[str, Any] = {"agent": args.agent, **({"owner": args.owner} if args.owner else {}),
                              **({"shared": "1"} if args.shared else {})}
    found = ask_gateway(args, config, lambda client: client.delete(f"/v1/memory/{args.key}", params=params)
                        if args.action == "rm" else client.get("/v1/memory", params=params))
    if found is NO_ANSWER:
        return 1
    if args.json:
        print(json.dumps(found, indent=2))
    elif args.action == "rm":
        print(f"note {found['key']!r} ({found['scope']}) deleted, with every copy memory search kept",
              file=sys.stderr)
    else:
        table = Table("key", "scope", "chars", "preview")
        for note in found["notes"]:
            table.add_row(note["key"], note["scope"], str(note["chars"]), note["preview"])
        Console().print(table)
    return 0


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _memory_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", default="list", choices=["list", "rm"])
    parser.add_argument("key", nargs="?", metavar="KEY", help="rm: the note's name")
    parser.add_argument("--agent", default="main", help="the agent whose notes (default main)")
    parser.add_argument("--owner", metavar="NAME", help="another identity's notes (an operator token)")
    parser.add_argument("--shared", action="store_true", help="the agent's shared notes (rm: an operator token)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    gateway_arguments(parser)


ARGUMENTS = {"memory": _memory_arguments}
