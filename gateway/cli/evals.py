"""`pincer eval PATH`: eval cases run offline against their recordings (or `--live` against the configured
model), checked, shown as a table, written as JUnit XML, and compared with a baseline run (brain/evals)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from brain.config import BrainSettings
from brain.evals.cases import Case, CaseError, load_cases
from brain.evals.checks import failures
from brain.evals.report import Result, junit, load_baseline, regressions, save
from brain.evals.run import live, offline
from brain.llm import LLMClient
from brain.replay import Replayer
from brain.worker import default_llm
from bus.config import Config
from bus.redis_client import RedisAway
from gateway.cli.connect import connected_bus
from memory.flight import RecordError

NEEDS_A_MODEL = "a conversation runs against a model: add --live (or give the case a recording, `session: FILE`)"


def command(args: argparse.Namespace, config: Config) -> int:
    settings = config.section("brain", BrainSettings)
    try:
        cases = load_cases(Path(args.path))
        baseline = load_baseline(Path(args.baseline)) if args.baseline else None
    except (CaseError, ValueError) as exc:
        return _fail(str(exc), 2)
    model = default_llm(settings) if args.live else None
    if args.live and model is None:
        return _fail("--live needs a model (brain.model, or a provider key in the environment)", 2)
    try:
        results = asyncio.run(_run(config, settings, cases, model, args.jobs))
    except RedisAway as exc:
        return _fail(f"cannot reach Redis (a case runs through the running pool's tool list): {exc}", 1)
    worse = regressions(results, baseline, tolerance=args.tolerance) if baseline is not None else []
    if args.save:
        save(results, Path(args.save))
    if args.junit:
        junit(results, Path(args.junit))
    if args.json:
        print(json.dumps({"results": [r.as_json() for r in results], "regressions": worse}, indent=2))
    else:
        show(Console(), results, worse if baseline is not None else None)
    return 1 if worse or any(r.failures for r in results) else 0


async def _run(config: Config, settings: BrainSettings, cases: list[Case], model: LLMClient | None,
               jobs: int) -> list[Result]:
    async with connected_bus(config) as bus, Replayer(bus, settings) as replayer:
        return await run_cases(replayer, cases, model, jobs=jobs)


async def run_cases(replayer: Replayer, cases: list[Case], model: LLMClient | None, *, jobs: int = 1) -> list[Result]:
    """Every case, ``jobs`` at a time (each its own scratch session), the results in the cases' order."""
    room = asyncio.Semaphore(max(1, jobs))

    async def one(case: Case) -> Result:
        async with room:
            return await run_case(replayer, case, model)

    return list(await asyncio.gather(*(one(case) for case in cases)))


async def run_case(replayer: Replayer, case: Case, model: LLMClient | None) -> Result:
    """One case, its failures checked; a recording that does not read fails the case, not the run."""
    mode = "live" if model is not None else "offline"
    if model is None and case.session is None:
        return Result(case.name, case.source, "skipped", skipped=NEEDS_A_MODEL)
    started = time.perf_counter()
    try:
        outcome = await (live(replayer.bus, replayer.settings, case, model) if model is not None
                         else offline(replayer, case))
    except RecordError as exc:
        return Result(case.name, case.source, mode, failures=[f"the recording: {exc}"])
    return Result(case.name, case.source, mode, outcome, failures(case.expect, outcome),
                  time.perf_counter() - started)


def show(console: Console, results: list[Result], worse: list[str] | None) -> None:
    table = Table("case", "mode", "result", "tools", "tokens", "cache", "cost", "slowest turn")
    for r in results:
        o = r.outcome
        verdict = "[green]pass[/]" if r.passed else ("[yellow]skipped[/]" if r.skipped else "[red]FAIL[/]")
        table.add_row(r.name, r.mode, verdict, ", ".join(o.trajectory) or "-", f"{o.tokens:,}",
                      f"{o.cache_hit:.0%}", f"${o.cost_usd:.5f}", f"{o.latency_ms:,.0f} ms")
    console.print(table)
    for r in results:
        if r.failures or r.skipped:
            console.print(f"[bold]{r.name}[/] ({r.source}):", highlight=False)
            for line in r.failures or [r.skipped]:
                console.print(f"  {line}", markup=False, highlight=False)
    passed = sum(r.passed for r in results)
    skipped = sum(bool(r.skipped) for r in results)
    console.print(f"{passed} passed, {len(results) - passed - skipped} failed, {skipped} skipped.")
    if worse is None:
        return
    if not worse:
        console.print("No regression against the baseline.")
        return
    console.print(f"{len(worse)} regression(s) against the baseline:")
    for line in worse:
        console.print(f"  {line}", markup=False, highlight=False)


def _fail(message: str, status: int) -> int:
    print(f"pincer: error: {message}", file=sys.stderr)
    return status


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="a case file (YAML: one case or a list) or a directory of them")
    parser.add_argument("--live", action="store_true", help="send each case's messages to the configured model "
                        "(this spends; tools run in the pool for the case's sender); default: offline, each case "
                        "with a recording replayed from it, the others skipped")
    parser.add_argument("--junit", metavar="FILE", help="also write JUnit XML (a failed expectation is a <failure>)")
    parser.add_argument("--save", metavar="FILE", help="keep this run's results (JSON): a baseline for the next")
    parser.add_argument("--baseline", metavar="FILE", help="a run kept with --save: name every regression against it")
    parser.add_argument("--tolerance", type=float, default=0.1, metavar="SHARE",
                        help="how much more tokens, cost or time (and how much less cache hit) is not yet a "
                        "regression (default 0.1: 10%%)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="cases run at once (default 1; a live run "
                        "waits on the model, so more at once go faster)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--redis", metavar="URL")


ARGUMENTS = {"eval": _eval_arguments}
