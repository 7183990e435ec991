"""`pincer fork SESSION --at N --name NEW`: a new session holding a session's first N messages and what
answered them, through the Gateway as the token's identity; no model is asked for any of it."""

from __future__ import annotations

import argparse
import json
from typing import Any

from bus.config import Config
from gateway.cli.credentials import gateway_arguments


def command(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.gateway_api import NO_ANSWER, ask_gateway

    params: dict[str, Any] = {"owner": args.owner} if args.owner else {}
    name = args.name or f"{args.session}-at-{args.at}"
    found = ask_gateway(args, config, lambda client: client.post(
        f"/v1/sessions/{args.session}/fork", params=params, json={"at": args.at, "name": name}))
    if found is NO_ANSWER:
        return 1
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        print(f"{found['session_id']}: {found['from']} up to message {found['at']} ({found['entries']} entries, "
              f"{found['record_steps']} recorded steps); continue it with `pincer chat --session "
              f"{found['session_id']}`")
    return 0


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _fork_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", metavar="SESSION", help="the session to fork (your own, by name)")
    parser.add_argument("--at", type=int, required=True, metavar="N",
                        help="keep messages 1 to N and what answered them (1 is the first)")
    parser.add_argument("--name", metavar="NEW", help="the new session's name (default: SESSION-at-N)")
    parser.add_argument("--owner", metavar="NAME", help="another identity's session (an operator token)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    gateway_arguments(parser)


ARGUMENTS = {"fork": _fork_arguments}
