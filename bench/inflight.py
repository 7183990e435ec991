"""How many model calls one Brain keeps in flight against a slow provider, counted at the provider.

A private redis-server, one `pincer hands`, one `pincer brain` and the tests'
scripted OpenAI-compatible model in its own process, each model call sleeping
``--sleep`` seconds (a slow provider). N plain turns are sent at once; the
bench reports their wall time and the most connections the scripted server had
open at once, sampled from the kernel's socket table (`ss`) every 20 ms, so
the count is the provider's view, not the Brain's own. ``--max-turns`` sets
brain.max_turns (default: as shipped).

Run: .venv/bin/python bench/inflight.py [--turns 100,400] [--sleep 0.5] [--max-turns N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.delegation import Pool, turn, until_alive  # noqa: E402
from bench.gateway_turns import ScriptedModel  # noqa: E402
from bus.redis_server import EmbeddedRedis  # noqa: E402
from bus.replies import ReplyInbox  # noqa: E402
from bus.settings import RedisSettings  # noqa: E402
from bus.streams import Bus  # noqa: E402


def connections_open(port: str) -> int:
    """Established connections to the scripted server's port, as the kernel has them."""
    listed = subprocess.run(["ss", "-Htn", "state", "established", f"( sport = :{port} )"],
                            capture_output=True, text=True, check=True).stdout
    return len(listed.splitlines())


async def burst(bus: Bus, inbox: ReplyInbox, port: str, *, turns: int, sleep: float, tag: str) -> tuple[float, int]:
    """``turns`` turns sent at once: their wall time (s) and the most model calls open at once."""
    peak, finished = 0, asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not finished.is_set():
            peak = max(peak, await asyncio.to_thread(connections_open, port))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    started = time.perf_counter()
    await asyncio.gather(*(turn(bus, inbox, f"{tag}-{i}", f"SLEEP {sleep:g}") for i in range(turns)))
    wall = time.perf_counter() - started
    finished.set()
    await sampler
    return wall, peak


async def main(args: argparse.Namespace) -> None:
    counts = [int(n) for n in args.turns.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="pincer-bench-inflight-") as tmp:
        redis = EmbeddedRedis(Path(tmp) / "redis")
        url = redis.start()
        llm = ScriptedModel()
        port = llm.api_base.rsplit(":", 1)[1].split("/")[0]
        bus = Bus.from_settings(RedisSettings(), url)
        inbox = ReplyInbox(bus, "bench-client", block_ms=1000)
        await inbox.start()
        pool = Pool(Path(tmp), url, llm)
        pool.env.pop("PINCER_BRAIN__MAX_WAITING")  # as shipped, brain.max_turns too unless asked
        if args.max_turns:
            pool.env["PINCER_BRAIN__MAX_TURNS"] = str(args.max_turns)
        try:
            pool.start("hands")
            await until_alive(bus, "hands", 1)
            pool.start("brain")
            await until_alive(bus, "brain", 1)
            await asyncio.gather(*(turn(bus, inbox, f"warm-{i}", "hello") for i in range(4)))  # tool list, imports
            for n in counts:
                runs = [await burst(bus, inbox, port, turns=n, sleep=args.sleep, tag=f"{n}-{r}")
                        for r in range(args.runs)]
                rows.append((n, statistics.median(w for w, _ in runs), max(p for _, p in runs)))
        finally:
            pool.stop()
            await inbox.close()
            llm.stop()
            redis.stop()
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.node()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, brain.max_turns {args.max_turns or 'as shipped'}")
    print(f"| turns at once, model call {args.sleep:g} s | wall, median of {args.runs} | most model calls open |")
    print("|---|---|---|")
    for n, wall, peak in rows:
        print(f"| {n} | {wall:.2f} s | {peak} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", default="25,100,400")
    parser.add_argument("--sleep", type=float, default=0.5)
    parser.add_argument("--max-turns", type=int, default=0)
    parser.add_argument("--runs", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
