"""``pincer trace SESSION [--turn N]``: a turn's timeline from what Pincer records, no collector needed.

Every transcript entry carries its time; a model answer its model, iteration
and tokens; a tool result its worker, duration, attempts and sandbox. So a
model call lasted from the entry before it to its answer, and a tool call
waited (in queues, on the bus) for the time from the call to its result
less the time it ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime
from typing import Any

from bus.config import Config
from gateway.cli.connect import connected_bus, qualified
from memory.sessions import SessionStore, TranscriptEntry


def turns_of(entries: list[TranscriptEntry]) -> list[list[TranscriptEntry]]:
    """The transcript cut into turns, each starting at a person's message (history a client sent is left out)."""
    turns: list[list[TranscriptEntry]] = []
    for entry in entries:
        if entry.metadata.get("from_client"):
            continue
        if entry.role == "user" or not turns:
            turns.append([])
        turns[-1].append(entry)
    return turns


def timeline(turn: list[TranscriptEntry], start: int | None = None) -> list[dict[str, Any]]:
    """One row per step of a turn: when (ms from ``start``, its own by default), what, and how long."""
    start = turn[0].timestamp if start is None else start
    rows: list[dict[str, Any]] = []
    previous = start
    asked: dict[str, int] = {}  # the model's call id -> when the model asked for it
    for entry in turn:
        meta = entry.metadata
        at = entry.timestamp - start
        if entry.role == "user":
            rows.append({"at_ms": at, "step": "message", "detail": f"from {meta.get('sender') or '?'}",
                         "trace_id": meta.get("trace_id")})
        elif entry.role == "assistant":
            usage = meta.get("usage") or {}
            calls = [c["function"]["name"] for c in entry.tool_calls or ()]
            what = f"asks for {', '.join(calls)}" if calls else ("answers" if meta.get("final") else "stops")
            if meta.get("stopped"):
                what = f"turn stopped: {meta['stopped']}"
            if meta.get("summary_until") is not None:
                what = f"compacts the earlier conversation ({meta.get('compaction')})"
            rows.append({"at_ms": at, "step": f"model {meta.get('model', '')}".strip(), "detail": what,
                         "ms": entry.timestamp - previous, "tokens_so_far": usage.get("total_tokens")})
            for call in entry.tool_calls or ():
                asked[call["id"]] = entry.timestamp
        elif entry.role == "tool":
            ran = meta.get("duration_ms")
            waited = entry.timestamp - asked.get(entry.tool_call_id or "", entry.timestamp) - (ran or 0)
            outcome = "ok" if meta.get("success") else meta.get("error_code") or ("cancelled" if meta.get("cancelled")
                                                                                 else "failed")
            where = ", ".join(str(x) for x in (meta.get("worker_id"), meta.get("sandbox")) if x)
            rows.append({"at_ms": at, "step": f"tool {entry.name}", "detail": f"{outcome} ({where})" if where else
                         outcome, "ms": ran, "waited_ms": max(0, waited) if ran is not None else None,
                         "attempts": meta.get("attempts"), "child_session": meta.get("child_session")})
        previous = entry.timestamp
    return rows


async def with_children(store: SessionStore, turn: list[TranscriptEntry], start: int | None = None,
                        depth: int = 0) -> list[dict[str, Any]]:
    """A turn's rows with each sub-agent's turn under its delegate call, indented, on the same clock."""
    start = turn[0].timestamp if start is None else start
    rows: list[dict[str, Any]] = []
    for row in timeline(turn, start):
        child = row.pop("child_session", None)
        rows.append({**row, "depth": depth})
        if child and depth < 10:
            child_turns = turns_of(await store.load(child))
            if child_turns:
                rows[-1]["child_session"] = child
                rows.extend(await with_children(store, child_turns[-1], start, depth + 1))
    return rows


async def show_trace(config: Config, session_id: str, *, turn: int | None, as_json: bool) -> int:
    """``session_id``: ``OWNER/NAME``, or a bare ``NAME`` for the owner token's session of that name."""
    session_id = qualified(session_id)
    try:
        async with connected_bus(config) as bus:
            store = SessionStore(bus.redis, bus.keys)
            turns = turns_of(await store.load(session_id))
            if not turns:
                print(f"pincer: error: no session {session_id!r} (or it has no turns)", file=sys.stderr)
                return 1
            if turn is not None and not 1 <= turn <= len(turns):
                print(f"pincer: error: session {session_id!r} has turns 1 to {len(turns)}", file=sys.stderr)
                return 2
            chosen = [turn] if turn is not None else list(range(1, len(turns) + 1))
            found: list[dict[str, Any]] = [
                {"turn": n, "started": turns[n - 1][0].timestamp, "steps": await with_children(store, turns[n - 1])}
                for n in chosen]
    except Exception as exc:  # redis-py's connection and auth errors
        print(f"pincer: error: cannot reach Redis: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(found, indent=2))
        return 0
    for item in found:
        started = datetime.fromtimestamp(item["started"] / 1000).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        print(f"turn {item['turn']} of {session_id}, {started}")
        for row in item["steps"]:
            took = f"{row['ms']:>6} ms" if row.get("ms") is not None else " " * 9
            waited = f"  waited {row['waited_ms']} ms" if row.get("waited_ms") else ""
            tries = f"  {row['attempts']} attempts" if (row.get("attempts") or 1) > 1 else ""
            trace = f"  trace {row['trace_id']}" if row.get("trace_id") else ""
            indent = "    " * row["depth"]
            sub = f"  -> {row['child_session']}" if row.get("child_session") else ""
            print(f"  +{row['at_ms']:>7} ms  {took}  {indent}{row['step']:<28} {row['detail']}{waited}{tries}"
                  f"{trace}{sub}")
    return 0


def command(args: argparse.Namespace, config: Config) -> int:
    return asyncio.run(show_trace(config, args.session, turn=args.turn, as_json=args.json))


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _trace_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", help="NAME (the owner token's session) or OWNER/NAME")
    parser.add_argument("--turn", type=int, metavar="N", help="only turn N (1 is the first)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--redis", metavar="URL")


ARGUMENTS = {"trace": _trace_arguments}
