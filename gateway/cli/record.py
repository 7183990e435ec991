"""`pincer record`: a session's flight record (memory/flight.py) shown step by step, exported as one
JSONL file, or imported from one."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from brain.config import BrainSettings
from bus.config import Config
from bus.redis_client import RedisAway
from gateway.cli.connect import connected_bus, qualified
from memory.archive import SessionArchive
from memory.flight import FlightRecorder, RecordError, Step
from memory.session_ids import SEPARATOR, owner_in


def command(args: argparse.Namespace, config: Config) -> int:
    keep_s = config.section("brain", BrainSettings).record.keep_s
    lines: list[str] = []
    if args.action == "import":
        try:
            lines = (sys.stdin.read() if args.target == "-" else Path(args.target).read_text()).splitlines()
        except OSError as exc:
            print(f"pincer: error: cannot read {args.target}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    try:
        code, exported = asyncio.run(_run(args, config, keep_s, lines))
    except RedisAway as exc:
        print(f"pincer: error: cannot reach Redis: {exc}", file=sys.stderr)
        return 1
    except RecordError as exc:
        print(f"pincer: error: {args.target}: {exc}", file=sys.stderr)
        return 2
    if exported is not None:
        if args.output in (None, "-"):
            sys.stdout.write(exported)
        else:
            Path(args.output).write_text(exported)
            print(f"{exported.count(chr(10)) - 1} lines written to {args.output}", file=sys.stderr)
    return code


async def _run(args: argparse.Namespace, config: Config, keep_s: int, lines: list[str]) -> tuple[int, str | None]:
    """The exit code, and the export's text when that was asked."""
    async with connected_bus(config) as bus:
        recorder = FlightRecorder(bus.redis, bus.keys, keep_s=keep_s)
        if args.action == "import":
            return await _import(recorder, args, lines), None
        session = qualified(args.target)
        steps = await recorder.steps(session)
        archived = _archived_record(config, session) if not steps and args.action == "export" else None
        if archived:  # an idle session's record, archived to the data dir (memory/retention.py)
            return 0, "\n".join(archived) + "\n"
        if not steps:
            print(f"pincer: error: session {session!r} has no flight record (none kept, lapsed after "
                  "brain.record.keep_days, or brain.record.enabled is off)", file=sys.stderr)
            return 1, None
        if args.action == "export":
            return 0, "\n".join(await recorder.export(session)) + "\n"
        rows = [summary(step) for step in steps]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            show(Console(), session, rows)
        return 0, None


def _archived_record(config: Config, session: str) -> list[str]:
    """The flight record of an archived session (the CLI runs beside the data dir, as an operator)."""
    archive = SessionArchive(config.runtime.archive_path)
    found = archive.read(owner_in(session), session) or archive.read("", session)
    return found.record if found else []


async def _import(recorder: FlightRecorder, args: argparse.Namespace, lines: list[str]) -> int:
    header = json.loads(lines[0]) if lines and lines[0].startswith("{") else {}
    session = qualified(args.session or str(header.get("session") or ""))
    if session.endswith(SEPARATOR):
        print("pincer: error: the file names no session: give one with --session NAME", file=sys.stderr)
        return 2
    if await recorder.steps(session) and not args.replace:
        print(f"pincer: error: session {session!r} has a record already: import it as another "
              "(--session NAME), or --replace it", file=sys.stderr)
        return 1
    count = await recorder.import_lines(session, lines)
    print(f"{count} steps imported as {session}")
    return 0


def summary(step: Step) -> dict[str, Any]:
    """One row per step: what it was, and for a model call its tokens, cache, cost and time."""
    data = step.data
    row: dict[str, Any] = {"at": step.at, "kind": step.kind, "message_id": step.message_id}
    if step.kind == "model":
        response = data.get("response") or {}
        usage = response.get("usage") or {}
        request = data.get("request") or {}
        calls = [c["function"]["name"] for c in response.get("tool_calls") or ()]
        row.update(model=response.get("model"), messages=len(request.get("messages") or ()),
                   detail=response.get("error") or (f"asks for {', '.join(calls)}" if calls else "answers"),
                   prompt_tokens=usage.get("prompt_tokens"), cached_tokens=usage.get("cached_tokens"),
                   completion_tokens=usage.get("completion_tokens"), cost_usd=response.get("cost_usd"),
                   first_token_ms=response.get("first_token_ms"), total_ms=response.get("total_ms"),
                   finish_reason=response.get("finish_reason"))
    elif step.kind == "tool":
        row.update(detail=f"{data.get('tool')}: {'ok' if data.get('success') else data.get('error_code', 'failed')}",
                   worker=data.get("worker_id"), total_ms=data.get("duration_ms"))
    elif step.kind == "approval":
        by = f" by {data['by']}" if data.get("by") else ""
        row.update(detail=f"{data.get('tool')}: {data.get('decision')}{by}")
    elif step.kind == "question":
        answers = data.get("answers")
        said = "; ".join(map(str, answers)) if answers is not None else "no answer"
        by = f" by {data['by']}" if data.get("by") else ""
        row.update(detail=f"asked {len(data.get('questions') or ())}: {said[:60]}{by}")
    elif step.kind == "turn":
        row.update(detail=f"from {data.get('sender')}: {str(data.get('text'))[:60]}")
    else:
        row.update(detail=str(data.get("reason") or data.get("method") or ""))
    return row


def show(console: Console, session: str, rows: list[dict[str, Any]]) -> None:
    table = Table("#", "step", "detail", "tokens in (cached)/out", "cost", "first token", "total",
                  title=f"Flight record of {session}")
    for n, row in enumerate(rows, 1):
        tokens = ""
        if row.get("prompt_tokens") is not None:
            hit = f" ({row['cached_tokens']:,})" if row.get("cached_tokens") else ""
            tokens = f"{row['prompt_tokens']:,}{hit}/{row.get('completion_tokens') or 0:,}"
        cost = f"${row['cost_usd']:.5f}" if row.get("cost_usd") else ""
        first = f"{row['first_token_ms']:.0f} ms" if row.get("first_token_ms") is not None else ""
        total = f"{row['total_ms']:.0f} ms" if row.get("total_ms") is not None else ""
        table.add_row(str(n), row["kind"], str(row.get("detail") or ""), tokens, cost, first, total)
    console.print(table)
    models = [r for r in rows if r["kind"] == "model" and r.get("prompt_tokens")]
    prompt = sum(r["prompt_tokens"] for r in models)
    cached = sum(r.get("cached_tokens") or 0 for r in models)
    spent = sum(r.get("cost_usd") or 0 for r in rows)
    console.print(f"{len(models)} model calls, {prompt:,} prompt tokens ({cached / prompt:.0%} from the provider's "
                  f"cache), ${spent:.5f}" if prompt else f"{len(rows)} steps")


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _record_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["show", "export", "import"])
    parser.add_argument("target", metavar="SESSION|FILE", help="show, export: the session (NAME for the owner "
                        "token's, or OWNER/NAME); import: the file ('-': standard input)")
    parser.add_argument("-o", "--output", metavar="FILE", help="export: write here (default: standard output)")
    parser.add_argument("--session", metavar="NAME", help="import: as this session (default: the one it was)")
    parser.add_argument("--replace", action="store_true", help="import: over the session's own record")
    parser.add_argument("--json", action="store_true", help="show: print JSON")
    parser.add_argument("--redis", metavar="URL")


ARGUMENTS = {"record": _record_arguments}
