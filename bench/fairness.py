"""Fairness between sessions: how long one session's single call waits while another holds 1,000 queued.

Three Hands workers (10 slots each) run the bench `nap` skill. A greedy session
keeps about 1,000 calls of `nap` (s seconds each) queued in the pool; every
`--every` seconds another session sends one call. Its wait is the time from
publishing it to its answer less its own run time (the result's duration).
A FIFO queue would make it wait behind the whole burst: 1,000 x s / 30 slots.
Run: .venv/bin/python bench/fairness.py
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

from bench.bus_roundtrip import bench_env, wait_for_workers  # noqa: E402
from bus.protocol import ToolExecute, ToolResult, now_ms  # noqa: E402
from bus.redis_server import EmbeddedRedis  # noqa: E402
from bus.replies import ReplyInbox  # noqa: E402
from bus.settings import RedisSettings  # noqa: E402
from bus.streams import Bus  # noqa: E402


async def call(bus: Bus, inbox: ReplyInbox, session: str, nap_s: float) -> tuple[float, ToolResult]:
    request = ToolExecute(tool="nap", args={"s": nap_s}, session_id=session, reply_to=inbox.stream,
                          deadline=now_ms() + 600_000)
    started = time.perf_counter()
    result = await inbox.request(bus.keys.hands_requests, request, request.call_id, timeout=600, final=(ToolResult,))
    assert isinstance(result, ToolResult) and result.success, result
    return time.perf_counter() - started, result


async def measure(url: str, *, samples: int, queued: int, nap_s: float, every_s: float) -> dict[str, float]:
    bus = Bus.from_settings(RedisSettings(), url)
    inbox = ReplyInbox(bus, "bench", block_ms=1000)
    await inbox.start()
    greedy: set[asyncio.Task[tuple[float, ToolResult]]] = set()
    waits: list[float] = []
    greedy_done = 0
    try:
        for _ in range(samples):
            while len(greedy) < queued:  # keep the greedy session's backlog full
                greedy.add(asyncio.create_task(call(bus, inbox, "greedy", nap_s)))
            await asyncio.sleep(every_s)
            latency, result = await call(bus, inbox, f"polite-{len(waits)}", nap_s)
            waits.append(latency - result.metadata.duration_ms / 1000)
            finished = {task for task in greedy if task.done()}
            greedy_done += len(finished)
            greedy -= finished
        await asyncio.gather(*greedy)
    finally:
        await inbox.close()
        await bus.close()
    ordered = sorted(waits)
    return {"p50_ms": statistics.median(ordered) * 1000, "p99_ms": ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000,
            "max_ms": ordered[-1] * 1000, "greedy_done": greedy_done}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--queued", type=int, default=1000)
    parser.add_argument("--nap", type=float, default=0.05, help="seconds each call runs")
    parser.add_argument("--every", type=float, default=0.05, help="seconds between the polite calls")
    parser.add_argument("--workers", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "ws").mkdir()
        url = EmbeddedRedis(Path(tmp)).start()
        env = {**bench_env(url, tmp), "PINCER_HANDS__CONCURRENCY__GLOBAL": "10",
               "PINCER_HANDS__CONCURRENCY__SKILL": "10", "PINCER_HANDS__QUEUE__WAIT_S": "600"}
        workers = [subprocess.Popen([sys.executable, "-m", "hands"], env=env, cwd=ROOT) for _ in range(args.workers)]
        try:
            asyncio.run(wait_for_workers(url, args.workers))
            found = asyncio.run(measure(url, samples=args.samples, queued=args.queued, nap_s=args.nap,
                                        every_s=args.every))
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                worker.wait(30)
    slots = args.workers * 10
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {os.cpu_count()} cpu, Python {platform.python_version()}")
    print(f"{args.workers} workers x 10 slots, calls of {args.nap * 1000:.0f} ms, greedy session holding "
          f"{args.queued} queued ({found['greedy_done']:.0f} of its calls ran meanwhile); a FIFO would make "
          f"the single call wait ~{args.queued * args.nap / slots * 1000:.0f} ms")
    print("| single call's wait before it starts | p50 | p99 | max |\n|---|---|---|---|")
    print(
        f"| {args.samples} samples | {found['p50_ms']:.1f} ms | {found['p99_ms']:.1f} ms | {found['max_ms']:.1f} ms |"
    )


if __name__ == "__main__":
    main()
