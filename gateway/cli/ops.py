"""``pincer status`` and ``pincer dead``: gateway/ops.py's answers as tables (or JSON)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from bus import pool as ops
from bus.config import Config
from bus.redis_client import RedisAway
from gateway.cli.connect import connected_bus
from gateway.runtime.daemon import StateFile, describe


def _console() -> Console:
    """Piped output (grep, a log) gets whole lines rather than an 80-column wrap."""
    return Console() if sys.stdout.isatty() else Console(width=200)


def _fail(message: str) -> int:
    print(f"pincer: error: {message}", file=sys.stderr)
    return 1


def _local_daemon(config: Config) -> dict[str, Any] | None:
    """The `pincer up` of this machine's data dir, if one runs: its processes beside the pool."""
    state = StateFile(config.runtime.data_path).running()
    if state is None:
        return None
    return {"pid": state.supervisor.pid, "gateway_url": state.gateway_url, "ready": state.ready,
            "preparing": state.preparing, "up_s": round(time.time() - state.since), "log_dir": state.log_dir,
            "processes": describe(state)}


async def show_status(config: Config, *, as_json: bool) -> int:
    local = _local_daemon(config)
    try:
        async with connected_bus(config) as bus:
            found = await ops.status(bus)
    except Exception as exc:  # redis-py's connection and auth errors
        if local is not None and local["preparing"]:  # the first start: Redis and the pool come after the model
            if as_json:
                print(json.dumps({"local": local}, indent=2, default=str))
            else:
                _print_local(_console(), local)
                print("the pool starts once the local model is ready")
            return 0
        if local is not None:
            _print_local(_console(), local)
        return _fail(f"cannot reach Redis: {exc}")
    found["local"] = local
    if as_json:
        print(json.dumps(found, indent=2, default=str))
        return 0
    console = _console()
    if local is not None:
        _print_local(console, local)
    workers = Table("hands worker", "state", "host", "pid", "version", "in flight", "running", "queued", "capacity",
                    "sandbox", "heartbeat", title="Hands")
    for w in found["instances"]["hands"]:
        state = f"[yellow]indexing {w['indexing']}[/]" if w.get("indexing") else "ready"
        workers.add_row(w["id"], state, w.get("host", ""), w.get("pid", ""), w.get("version", ""),
                        w.get("in_flight", ""), w.get("running", ""), w.get("queued", ""), w.get("capacity", ""),
                        w.get("sandbox", ""), f"{w['last_heartbeat_s']}s ago")
    console.print(workers if found["instances"]["hands"] else "[yellow]no Hands worker alive[/]")
    servers = Table(
        "hands worker", "MCP server", "transport", "state", "tools", "starts", "problem", title="MCP servers"
    )
    for w in found["instances"]["hands"]:
        for name, server in (w.get("mcp") or {}).items():
            problem = "; ".join([server.get("error") or "", *server.get("refused", [])]).strip("; ")
            servers.add_row(w["id"], name, server.get("transport", ""), server.get("state", ""),
                            str(server.get("tools", "")), str(server.get("starts", "")), problem)
    if servers.row_count:
        console.print(servers)
    others = Table("role", "instance", "host", "pid", "version", "in flight", "waiting", "capacity", "heartbeat",
                   title="Brains and Gateways")
    for role in ("brain", "gateway"):
        for inst in found["instances"][role]:
            others.add_row(role, inst["id"], inst.get("host", ""), inst.get("pid", ""), inst.get("version", ""),
                           inst.get("in_flight", ""), inst.get("waiting", ""), inst.get("capacity", ""),
                           f"{inst['last_heartbeat_s']}s ago")
    console.print(others)
    if found["channels"]:
        from gateway.cli.channels import print_channels

        print_channels(console, found["channels"])
    queues = Table("stream", "length", "group", "consumers", "pending", "undelivered", "oldest pending",
                   title="Streams")
    for q in found["streams"]:
        oldest = "" if q["oldest_pending_s"] is None else f"{q['oldest_pending_s']}s"
        queues.add_row(q["stream"], str(q["length"]), q["group"], str(q["consumers"]), str(q["pending"]),
                       str(q["undelivered"]), oldest)
    console.print(queues)
    backlog = Table("lane", "ready", "waiting", "oldest", title="Backlog (calls no worker could start yet)")
    for lane, held in found["backlog"].items():
        backlog.add_row(lane, str(held.get("ready", "")), str(held.get("waiting", "")), f"{held.get('oldest_s', '')}s")
    console.print(backlog if backlog.row_count else "backlog: empty")
    scheduler = found["scheduler"]
    if scheduler["jobs"]:
        overdue = f", {scheduler['overdue_job']} {scheduler['overdue_s']:.0f}s overdue" if scheduler["overdue_job"] \
            else ""
        console.print(f"scheduler: {scheduler['state']}, {scheduler['jobs']} job(s) scheduled, last looked "
                      f"{scheduler['last_tick_s_ago']}s ago{overdue}")
    dead = found["dead"]
    console.print(f"dead letters: {dead}" + (" (see `pincer dead list`)" if dead else ""))
    for warning in found["redis_memory"]["warnings"]:
        console.print(f"[yellow]{warning}[/]")
    if len(found["versions"]) > 1:
        mix = ", ".join(f"{v} ({len(ids)} process{'es' if len(ids) > 1 else ''})"
                        for v, ids in found["versions"].items())
        console.print(f"[yellow]versions differ: {mix}; finish the upgrade (docs/upgrades.md)[/]")
    return 0


def _starting(local: dict[str, Any]) -> str:
    """How far a start has come: nothing once ready, else "starting" and what it is doing (the local model)."""
    if local["ready"]:
        return ""
    return f", starting: {local['preparing']}" if local.get("preparing") else ", starting"


def _print_local(console: Console, local: dict[str, Any]) -> None:
    table = Table("role", "pid", "alive", "resident MB",
                  title=f"This machine: pincer up (pid {local['pid']}, up {local['up_s']}s, Gateway on "
                        f"{local['gateway_url']}{_starting(local)})")
    for proc in local["processes"]:
        rss = "" if proc["rss_mb"] is None else f"{proc['rss_mb']:.0f}"
        table.add_row(proc["role"], str(proc["pid"]), "yes" if proc["alive"] else "[red]no[/]", rss)
    console.print(table)


async def manage_dead(config: Config, action: str, ids: list[str], *, every: bool, limit: int,
                      as_json: bool) -> int:
    if action in ("retry", "purge") and not ids and not every:
        return _fail(f"say which entries to {action}: their ids (from `pincer dead list`), or --all")
    if action == "show" and len(ids) != 1:
        return _fail("`pincer dead show` takes one entry id (from `pincer dead list`)")
    try:
        async with connected_bus(config) as bus:
            result: Any
            if action == "list":
                result = await ops.dead_list(bus, limit=limit)
            elif action == "show":
                result = await ops.dead_show(bus, ids[0])
                if result is None:
                    return _fail(f"no dead-letter entry {ids[0]!r}; `pincer dead list` shows the ids")
            elif action == "retry":
                result = await ops.dead_retry(bus, None if every else ids)
            else:
                result = {"purged": await ops.dead_purge(bus, None if every else ids)}
    except RedisAway as exc:
        return _fail(f"cannot reach Redis: {exc}")
    except Exception as exc:  # Redis refusing: auth, a malformed id
        return _fail(f"{type(exc).__name__}: {exc}")
    if as_json or action == "show":
        print(json.dumps(result, indent=2, default=str))
        return 0
    console = _console()
    if action == "list":
        if not result:
            console.print("no dead letters")
            return 0
        table = Table("id", "at", "type", "source", "reason")
        for entry in result:
            table.add_row(entry["id"], entry["at"], entry["type"], entry["source"], entry["reason"])
        console.print(table)
    elif action == "retry":
        for moved in result:
            console.print(f"{moved['dead_id']} → {moved['stream']} as {moved['new_id']}")
        console.print(f"{len(result)} entr{'y' if len(result) == 1 else 'ies'} sent back")
    else:
        console.print(f"{result['purged']} entr{'y' if result['purged'] == 1 else 'ies'} purged")
    return 0


def status(args: argparse.Namespace, config: Config) -> int:
    return asyncio.run(show_status(config, as_json=args.json))


def dead(args: argparse.Namespace, config: Config) -> int:
    return asyncio.run(manage_dead(config, args.action, args.ids, every=args.all, limit=args.limit,
                                   as_json=args.json))




# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--redis", metavar="URL")


def _dead_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["list", "show", "retry", "purge"])
    parser.add_argument("ids", nargs="*", metavar="ID", help="dead-letter entry ids (from `pincer dead list`)")
    parser.add_argument("--all", action="store_true", help="retry or purge every entry")
    parser.add_argument("--limit", type=int, default=50, help="entries to list (default 50)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--redis", metavar="URL")


ARGUMENTS = {"status": _status_arguments, "dead": _dead_arguments}
