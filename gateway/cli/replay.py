"""`pincer replay SESSION|FILE`: a recorded session run again through the current code, config and tool
policy (brain/replay.py), answered from its record; what changed is shown where it first shows."""

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
from brain.llm import LLMClient
from brain.replay import Report, replay
from brain.worker import default_llm
from bus.config import Config
from bus.redis_client import RedisAway
from gateway.cli.connect import connected_bus, qualified
from hands.config import HandsSettings
from hands.scratch import ScratchHands
from memory.flight import FlightRecorder, RecordError, Step, read_lines


def command(args: argparse.Namespace, config: Config) -> int:
    settings = config.section("brain", BrainSettings)
    source = Path(args.source)
    recording: tuple[list[Step], dict[str, Any]] | None = None
    try:
        if source.suffix == ".jsonl" or source.is_file():
            recording = read_lines(source.read_text().splitlines())
    except (OSError, RecordError) as exc:
        print(f"pincer: error: {args.source}: {exc}", file=sys.stderr)
        return 2
    live = default_llm(settings) if args.live else None
    if args.live and live is None:
        print("pincer: error: --live needs a model (brain.model, or a provider key in the environment)",
              file=sys.stderr)
        return 2
    try:
        report = asyncio.run(_replay(config, settings, args.source, recording, live, tools_live=args.tools == "live"))
    except RedisAway as exc:
        print(f"pincer: error: cannot reach Redis (a replay lists tools through the running pool): {exc}",
              file=sys.stderr)
        return 1
    if report is None:
        print(f"pincer: error: session {qualified(args.source)!r} has no flight record", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        show(Console(), report)
    return 0 if report.diverged is None else 3


async def _replay(config: Config, settings: BrainSettings, source: str,
                  recording: tuple[list[Step], dict[str, Any]] | None, live: LLMClient | None, *,
                  tools_live: bool) -> Report | None:
    async with connected_bus(config) as bus:
        if recording is None:
            recorder = FlightRecorder(bus.redis, bus.keys, keep_s=1)
            session = qualified(source)
            steps = await recorder.steps(session)
            if not steps:
                return None
            recording = steps, await recorder.parts(session)
        if not tools_live:
            return await replay(bus, settings, recording[0], recording[1], live=live)
        sender = next((str(s.data.get("sender") or "user") for s in recording[0] if s.kind == "turn"), "user")
        scratch = ScratchHands(config.section("hands", HandsSettings), sender)
        try:
            return await replay(bus, settings, recording[0], recording[1], live=live, run_tool=scratch.call)
        finally:
            scratch.close()


def show(console: Console, report: Report) -> None:
    table = Table("turn", "message", "model calls from the record", "live", "tools", "same answer and tools")
    for number, turn in enumerate(report.turns, 1):
        same = "yes" if turn.same else ("stopped: " + turn.error if turn.error else "no")
        table.add_row(str(number), turn.text[:40], f"{turn.matched}/{turn.model_steps}", str(turn.live),
                      ", ".join(turn.tools) or "-", same)
    console.print(table)
    r = report.recorded
    console.print(f"The recording: {r['model_calls']:.0f} model calls, {r['prompt_tokens']:,.0f} prompt tokens "
                  f"({r['cache_hit']:.0%} cached), ${r['cost_usd']:.5f}, {r['model_ms']:,.0f} ms at the model. "
                  f"Replayed in {report.seconds * 1000:.0f} ms.")
    if report.diverged is None:
        console.print("Every model request matched the recording: no provider was asked"
                      + (", the tools ran in a scratch copy of the workspace." if report.tools_live else
                         ", no tool ran."))
        return
    d = report.diverged
    console.print(f"Diverged at turn {d.turn}, model call {d.step}: the request now differs from the recorded one:")
    console.print(d.diff, markup=False, highlight=False)


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SESSION|FILE", help="a session (NAME for the owner token's, OWNER/NAME) "
                        "or a file from `pincer record export`")
    parser.add_argument("--live", action="store_true", help="from the first difference on, ask the configured "
                        "model (this spends); default: stop there, so a replay never spends")
    parser.add_argument("--tools", choices=("record", "live"), default="record",
                        help="record (default): tool calls answered from the recording; live: run again, on this "
                        "machine, in a scratch copy of the sender's workspace (the agent's own files untouched)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--redis", metavar="URL")


ARGUMENTS = {"replay": _replay_arguments}
