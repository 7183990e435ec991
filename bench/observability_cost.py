"""What metrics and trace propagation cost on the Hands path.

Two parts, one run:

- in process, the work they add to one tool call: the worker's counters
  (a count and a histogram observation per answer) and a traceparent written
  on the request and on its answer and read back by the consumer;
- end to end, a real `pincer hands` worker and a private redis-server, in
  alternating rounds: calls whose client starts a trace (every request and
  answer carries a traceparent) against calls that carry none. Counters
  are always on, so this part prices propagation; the first part prices both
  against the per-call CPU the same machine spends.

Run: .venv/bin/python bench/observability_cost.py [--rounds 6]
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
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bus_roundtrip import bench_env, measure, wait_for_workers  # noqa: E402
from bus import trace  # noqa: E402
from bus.codec import decode, encode  # noqa: E402
from bus.metrics import Meter  # noqa: E402
from bus.protocol import ToolResult  # noqa: E402
from bus.redis_server import EmbeddedRedis  # noqa: E402
from bus.service import run_loop  # noqa: E402


def in_process_us(n: int = 200_000) -> dict[str, float]:
    meter = Meter()
    result = ToolResult(call_id="c" * 32, success=True, data={"ok": True}, metadata={"tool_name": "noop"})
    traceparent = trace.start()
    fields_plain, fields_traced = encode(result), encode(result, traceparent=traceparent)

    def counters() -> None:
        meter.count("pincer_tool_calls", "noop", "ok")
        meter.observe("pincer_tool_call_seconds", 0.0004, "noop")

    def plain() -> None:
        decode(encode(result))

    def traced() -> None:
        decode(encode(result, traceparent=trace.current.get()))
        trace.current.set(trace.from_entry(fields_traced))

    trace.current.set(traceparent)
    per = {name: min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
           for name, fn in (("counters", counters), ("plain", plain), ("traced", traced))}
    assert fields_plain != fields_traced
    return {"counters_us": per["counters"], "traceparent_us": 2 * (per["traced"] - per["plain"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--sequential", type=int, default=500)
    parser.add_argument("--total", type=int, default=6000)
    parser.add_argument("--in-flight", type=int, default=64)
    args = parser.parse_args()
    micro = in_process_us()
    results: dict[str, list[dict[str, float]]] = {"traced": [], "untraced": []}
    with tempfile.TemporaryDirectory() as tmp:
        redis = EmbeddedRedis(Path(tmp))
        url = redis.start()
        worker = subprocess.Popen([sys.executable, "-m", "gateway", "hands"], env=bench_env(url, tmp),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            asyncio.run(wait_for_workers(url, 1))
            for round_ in range(args.rounds):
                for kind in (("traced", "untraced") if round_ % 2 == 0 else ("untraced", "traced")):
                    async def run(kind: str = kind) -> dict[str, float]:
                        trace.current.set(trace.start() if kind == "traced" else None)
                        return await measure(url, sequential=args.sequential, total=args.total,
                                             in_flight=args.in_flight)

                    results[kind].append(run_loop(run()))
        finally:
            worker.terminate()
            worker.wait()
            redis.stop()
    print(f"\n{platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()} · "
          f"{time.strftime('%Y-%m-%d')} · {args.rounds} alternating rounds\n")
    print(f"in process, per call: counters {micro['counters_us']:.2f} µs, traceparent on request and answer "
          f"{micro['traceparent_us']:.2f} µs\n")
    print("| calls | sequential p50 | calls/s, 64 in flight |\n|---|---|---|")
    for kind, rows in results.items():
        print(f"| {kind} | {statistics.median(r['p50_ms'] for r in rows):.3f} ms | "
              f"{statistics.median(r['calls_per_s'] for r in rows):,.0f} |")
    ratio = statistics.median(t["calls_per_s"] / u["calls_per_s"] for t, u in zip(results["traced"],
                                                                                 results["untraced"], strict=True))
    print(f"\ntraced / untraced calls/s, median of per-round ratios: {ratio:.3f}")


if __name__ == "__main__":
    main()
