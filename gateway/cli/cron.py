"""`pincer cron`: scheduled jobs, through the Gateway as the identity of the token used (the owner's by
default, as `pincer chat`)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bus.config import Config
from gateway.cli.credentials import gateway_arguments

ACTIONS = ("add", "list", "show", "pause", "resume", "rm", "run", "runs")


def command(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.gateway_api import NO_ANSWER, ask_gateway

    if args.action not in ("list",) and not args.name:
        print(f"pincer: error: `pincer cron {args.action}` needs the job's NAME", file=sys.stderr)
        return 2
    if args.action == "add" and args.owner:
        print("pincer: error: a job is made for the token's own identity; --owner is for list and a job's "
              "actions (an operator's)", file=sys.stderr)
        return 2
    if args.action == "add" and not args.message:
        print("pincer: error: `pincer cron add` needs --message TEXT (what the agent is asked each time)",
              file=sys.stderr)
        return 2
    found = ask_gateway(args, config, lambda client: _call(client, args))
    if found is NO_ANSWER:
        return 1
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        _show(Console(), args.action, found)
    return 0


def _call(client: httpx.Client, args: argparse.Namespace) -> httpx.Response:
    name = args.name
    whose = {"owner": args.owner} if args.owner else {}  # another identity's jobs: the API lets operators alone
    if args.action == "add":
        body: dict[str, Any] = {"name": name, "message": args.message or "", "tz": args.tz, "agent": args.agent,
                                "catch_up": args.catch_up, "window": args.window, "deliver": args.deliver or []}
        if args.session:
            body["session"] = args.session
        if args.daily_usd is not None:
            body["daily_usd"] = args.daily_usd
        for kind in ("every", "cron", "at"):
            if getattr(args, kind):
                body[kind] = getattr(args, kind)
        return client.post("/v1/cron", json=body)
    if args.action == "list":
        return client.get("/v1/cron", params=whose)
    if args.action == "show":
        return client.get(f"/v1/cron/{name}", params=whose)
    if args.action == "rm":
        return client.delete(f"/v1/cron/{name}", params=whose)
    if args.action == "runs":
        return client.get(f"/v1/cron/{name}/runs", params={"limit": args.limit, **whose})
    return client.post(f"/v1/cron/{name}/{args.action}", params=whose)


def _when(moment: float | None) -> str:
    return datetime.fromtimestamp(moment).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z") if moment else "-"


def _show(console: Console, action: str, found: dict[str, Any]) -> None:
    if action == "list":
        table = Table("owner", "name", "schedule", "next due", "agent", "session", "state", title="Jobs")
        for job in found["jobs"]:
            table.add_row(job["owner"], job["name"], job["schedule"], _when(job["next_due"]), job["agent"],
                          job["session_id"], "paused" if job["paused"] else "active")
        console.print(table if found["jobs"] else "no jobs (pincer cron add NAME --every 30m --message TEXT)")
    elif action == "runs":
        table = Table("due", "status", "fired", "outcome", "turn", "why / answer", title=f"Runs of {found['job']}")
        for run in found["runs"]:
            table.add_row(_when(run["due"]), run["status"], _when(run["fired_at"]), run["outcome"] or "-",
                          run["turn"] or "-", (run["reason"] or run["answer"])[:80])
        console.print(table)
    elif action == "run":
        console.print(f"fired by hand: turn {found['turn']} (pincer cron runs shows its outcome)")
    elif action == "rm":
        console.print(f"removed {found['removed']}")
    else:
        console.print(f"{found['id']}: {found['schedule']}, next due {_when(found['next_due'])}, "
                      f"{'paused' if found['paused'] else 'active'}; runs as {found['owner']} in "
                      f"{found['session_id']} (agent {found['agent']})")


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _cron_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["add", "list", "show", "pause", "resume", "rm", "run", "runs"])
    parser.add_argument("name", nargs="?", metavar="NAME", help="lowercase letters, digits, _ and -")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--every", metavar="DURATION", help="add: run every 10s, 30m, 2h, 1d")
    when.add_argument("--cron", metavar="EXPR", help="add: a cron expression, such as \"0 8 * * 1-5\"")
    when.add_argument("--at", metavar="WHEN", help="add: once, at an ISO 8601 time (2026-12-24T18:00)")
    parser.add_argument("--tz", default="UTC", help="add: the time zone of --cron and of an --at without offset")
    parser.add_argument("--message", "-m", help="add: what the agent is asked each time")
    parser.add_argument("--agent", default="main", help="add: the agent that runs it (default main)")
    parser.add_argument("--session", help="add: the session it runs in (default cron-NAME)")
    parser.add_argument("--deliver", action="append", metavar="CHANNEL:CHAT",
                      help="add: also send the answer to this chat (repeatable), e.g. telegram:123456789")
    parser.add_argument("--catch-up", default="run_once", choices=["run_once", "skip", "all"],
                      help="add: what to do with instants missed while no scheduler ran (default run_once)")
    parser.add_argument("--window", default="1h", metavar="DURATION",
                      help="add: with --catch-up all, how far back missed instants are run (default 1h)")
    parser.add_argument("--daily-usd", type=float, metavar="USD", help="add: the job's own spend limit per day "
                      "(its turns also count in its owner's and the pool's budgets)")
    parser.add_argument("--limit", type=int, default=50, help="runs: how many records (default 50)")
    parser.add_argument("--owner", metavar="NAME", help="an operator's: another identity's jobs (list, show, "
                        "pause, resume, run, runs, rm); list --owner '*': every identity's")
    parser.add_argument("--json", action="store_true", help="print JSON")
    gateway_arguments(parser)


ARGUMENTS = {"cron": _cron_arguments}
