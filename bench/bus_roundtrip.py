"""Tool-call round trip through the real bus and real Hands worker processes.

Starts a private redis-server and N `pincer hands` processes, then measures
from a Brain-like client: sequential latency (p50/p99) of a cheap tool call,
and throughput with many calls in flight. Run: .venv/bin/python bench/bus_roundtrip.py
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
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bus.presence import alive  # noqa: E402
from bus.protocol import ToolExecute, now_ms  # noqa: E402
from bus.redis_server import EmbeddedRedis  # noqa: E402
from bus.replies import ReplyInbox  # noqa: E402
from bus.service import run_loop  # noqa: E402
from bus.settings import RedisSettings  # noqa: E402
from bus.streams import Bus  # noqa: E402


async def one_call(bus: Bus, inbox: ReplyInbox, tool: str = "noop") -> float:
    call = ToolExecute(tool=tool, args={}, reply_to=inbox.stream, deadline=now_ms() + 30_000)
    started = time.perf_counter()
    result = await inbox.request(bus.keys.hands_requests, call, call.call_id, timeout=30)
    assert result.success, result
    return time.perf_counter() - started


async def measure(url: str, *, sequential: int, total: int, in_flight: int,
                  settings: RedisSettings | None = None, before: Callable[[Bus], Awaitable[None]] | None = None,
                  ) -> dict[str, float]:
    """Sequential latency, then throughput with ``in_flight`` calls at once (``before``: a step first)."""
    bus = Bus.from_settings(settings or RedisSettings(), url)
    if before is not None:
        await before(bus)
    inbox = ReplyInbox(bus, "bench", block_ms=1000)
    await inbox.start()
    try:
        for _ in range(50):  # warm up
            await one_call(bus, inbox)
        latencies = sorted([await one_call(bus, inbox) for _ in range(sequential)])
        slots = asyncio.Semaphore(in_flight)

        async def bounded() -> None:
            async with slots:
                await one_call(bus, inbox)

        started = time.perf_counter()
        await asyncio.gather(*(bounded() for _ in range(total)))
        elapsed = time.perf_counter() - started
    finally:
        await inbox.close()
        await bus.close()
    return {"p50_ms": statistics.median(latencies) * 1000, "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
            "calls_per_s": total / elapsed}


def bench_env(url: str, tmp: str) -> dict[str, str]:
    """Workers with the bench skills (noop, nap) and room for every call in flight."""
    return {**os.environ, "PINCER_REDIS_URL": url, "PINCER_WORKSPACE": f"{tmp}/ws", "PINCER_DATA_DIR": tmp,
            "PINCER_RUNTIME__LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT),
            "PINCER_HANDS__SKILL_DIRS": f'["{ROOT / "bench" / "skills"}"]',
            "PINCER_HANDS__CONCURRENCY__GLOBAL": "256", "PINCER_HANDS__CONCURRENCY__SKILL": "256"}


async def wait_for_workers(url: str, n: int) -> None:
    bus = Bus.from_settings(RedisSettings(), url)
    try:
        for _ in range(200):
            if len(await alive(bus, "hands")) >= n:
                return
            await asyncio.sleep(0.1)
        raise SystemExit("workers did not come up")
    finally:
        await bus.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sequential", type=int, default=1000)
    parser.add_argument("--total", type=int, default=4000)
    parser.add_argument("--in-flight", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        redis = EmbeddedRedis(Path(tmp))
        url = redis.start()
        env = bench_env(url, tmp)
        print(
            f"# {time.strftime('%Y-%m-%d')} {platform.node()} {os.cpu_count()} cpu, Python {platform.python_version()}"
        )
        print("| workers | sequential p50 | sequential p99 | throughput (calls/s, "
              f"{args.in_flight} in flight) | redis-server CPU per call |\n|---|---|---|---|---|")
        try:
            for n in args.workers:
                procs = [subprocess.Popen([sys.executable, "-m", "gateway", "hands"], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
                try:
                    asyncio.run(wait_for_workers(url, n))
                    assert redis.process is not None
                    before = _cpu_s(redis.process.pid)
                    r = run_loop(measure(url, sequential=args.sequential, total=args.total,
                                            in_flight=args.in_flight))
                    per_call = (_cpu_s(redis.process.pid) - before) / (50 + args.sequential + args.total) * 1e6
                    print(f"| {n} | {r['p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms | {r['calls_per_s']:,.0f} | "
                          f"{per_call:.0f} µs |")
                finally:
                    for proc in procs:
                        proc.terminate()
                    for proc in procs:
                        proc.wait()
                    asyncio.run(_forget_workers(url))
        finally:
            redis.stop()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _forget_workers(url: str) -> None:
    bus = Bus.from_settings(RedisSettings(), url)
    await bus.redis.delete(bus.keys.alive("hands"))
    await bus.close()


if __name__ == "__main__":
    main()
