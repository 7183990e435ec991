"""`pincer memory`: long-term notes, listed and deleted through the Gateway as the token's identity (the
owner's by default, as `pincer chat`); an operator token also reaches another's (--owner) and the shared ones."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bus.config import Config


def command(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.credentials import caller_token
    from gateway.config import GatewaySettings

    settings = config.section("gateway", GatewaySettings)
    if args.action == "rm" and not args.key:
        print("pincer: error: `pincer memory rm` needs the note's KEY", file=sys.stderr)
        return 2
    base = (args.url or settings.url).rstrip("/")
    token = caller_token(args, config, settings)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    params: dict[str, Any] = {"agent": args.agent, **({"owner": args.owner} if args.owner else {}),
                              **({"shared": "1"} if args.shared else {})}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            response = (client.delete(f"/v1/memory/{args.key}", params=params) if args.action == "rm"
                        else client.get("/v1/memory", params=params))
    except httpx.HTTPError as exc:
        print(f"pincer: error: cannot reach the Gateway at {base} ({exc}); is `pincer up` running?", file=sys.stderr)
        return 1
    if response.status_code >= 400:
        try:
            said = response.json().get("error", {}).get("message") or response.text
        except ValueError:
            said = response.text
        print(f"pincer: error: {said}", file=sys.stderr)
        return 1
    found = response.json()
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
