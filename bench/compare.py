"""Pincer's Hands path side by side with the bare floor and Celery, on one private Redis, in one run.

Measures, with the same client shape for each (sequential p50/p99, then
throughput with 64 calls in flight):
- floor: a bare redis-py round trip (bench/floor.py), 1 and 2 worker processes;
- Pincer: `tool:execute` of the no-op skill through `pincer hands` processes, 1 and 2;
  the floor and Pincer run side by side and are measured in alternating rounds (medians of
  ``--rounds``), as this VM's speed drifts ±20% within minutes; Pincer's "vs floor" figures
  are the medians of its per-round ratios to the floor with as many workers, so the drift
  between rounds cancels out;
- Celery 5 (Redis broker and result backend, solo pool): `.delay().get()`, 1 and 2 workers;
- I/O-bound scaling: Pincer's `nap` skill (50 ms asleep) with 1, 2 and 4 workers.
Writes a section to bench/compare-results.md and the chart bench/results.png.

Run: .venv/bin/pip install -e '.[bench]' && .venv/bin/python bench/compare.py
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import floor  # noqa: E402
from bench.bus_roundtrip import bench_env, measure, wait_for_workers  # noqa: E402
from bus.protocol import ToolExecute, ToolResult, now_ms  # noqa: E402
from bus.redis_server import EmbeddedRedis  # noqa: E402
from bus.replies import ReplyInbox  # noqa: E402
from bus.service import run_loop  # noqa: E402
from bus.settings import RedisSettings  # noqa: E402
from bus.streams import Bus  # noqa: E402

Row = dict[str, float | str]


@contextmanager
def processes(commands: list[list[str]], env: dict[str, str]) -> Iterator[None]:
    procs = [subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for cmd in commands]
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_floor_and_pincer(url: str, tmp: str, workers: int, args: argparse.Namespace) -> list[Row]:
    """The floor and Pincer with ``workers`` each, measured in alternating rounds (medians reported):
    this VM's speed drifts ±20% within minutes, so back-to-back runs would compare two machines."""
    stream = f"floor:req:{workers}"
    floor_worker = [sys.executable, str(ROOT / "bench" / "floor.py"), "worker", url, stream]
    with processes([floor_worker] * workers, os.environ.copy()), \
            processes([[sys.executable, "-m", "gateway", "hands"]] * workers, bench_env(url, tmp)):
        asyncio.run(wait_for_workers(url, workers))
        floors, pincers = [], []
        for _ in range(args.rounds):
            floors.append(run_loop(floor.measure(url, stream, sequential=args.sequential, total=args.total,
                                                 in_flight=64)))
            pincers.append(run_loop(measure(url, sequential=args.sequential, total=args.total, in_flight=64)))
    asyncio.run(_forget(url))
    # Each round's Pincer figure against the floor's of the same round: the VM's drift cancels out.
    same_round = {
        "p50_vs_floor": statistics.median(p["p50_ms"] / f["p50_ms"] for f, p in zip(floors, pincers, strict=True)),
        "calls_vs_floor": statistics.median(
            p["calls_per_s"] / f["calls_per_s"] for f, p in zip(floors, pincers, strict=True)
        ),
    }
    return [{"system": "floor (bare redis-py)", "workers": workers, **_medians(floors)},
            {"system": "Pincer (Hands, no-op skill)", "workers": workers, **_medians(pincers), **same_round}]


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def run_celery(url: str, workers: int, args: argparse.Namespace) -> Row:
    env = {**os.environ, "BENCH_REDIS_URL": url, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker", "--pool", "solo", "-Q", "bench",
               "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING"]
    os.environ["BENCH_REDIS_URL"] = url
    from bench import celery_app

    celery_app.app.conf.update(broker_url=url, result_backend=url)
    with processes([[*command, "-n", f"w{i}@%h"] for i in range(workers)], env):
        for _ in range(100):  # wait for the workers, and warm up
            try:
                celery_app.noop.delay().get(timeout=2)
                break
            except Exception:
                time.sleep(0.2)
        for _ in range(100):
            celery_app.noop.delay().get(timeout=10)
        latencies = []
        for _ in range(1000):  # Celery is steady: one long run, no rounds
            started = time.perf_counter()
            celery_app.noop.delay().get(timeout=10)
            latencies.append(time.perf_counter() - started)
        latencies.sort()
        total = min(args.total, 4000)
        started = time.perf_counter()
        for _ in range(total // 64):  # windows of 64 in flight
            for pending in [celery_app.noop.delay() for _ in range(64)]:
                pending.get(timeout=30)
        elapsed = time.perf_counter() - started
    return {"system": "Celery 5 (Redis broker + backend, solo)", "workers": workers,
            "p50_ms": statistics.median(latencies) * 1000,
            "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000, "calls_per_s": (total // 64 * 64) / elapsed}


async def _naps(url: str, total: int, in_flight: int, seconds: float) -> float:
    bus = Bus.from_settings(RedisSettings(), url)
    inbox = ReplyInbox(bus, "bench-naps", block_ms=1000)
    await inbox.start()
    slots = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with slots:
            call = ToolExecute(tool="nap", args={"s": seconds}, reply_to=inbox.stream, deadline=now_ms() + 120_000)
            result = await inbox.request(bus.keys.hands_requests, call, call.call_id, timeout=120,
                                         final=(ToolResult,))
            assert isinstance(result, ToolResult) and result.success, result

    try:
        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(total)))
        return total / (time.perf_counter() - started)
    finally:
        await inbox.close()
        await bus.close()


def run_naps(url: str, tmp: str, workers: int, args: argparse.Namespace) -> Row:
    env = {**bench_env(url, tmp), "PINCER_HANDS__CONCURRENCY__GLOBAL": "100", "PINCER_HANDS__QUEUE__DEPTH": "0"}
    with processes([[sys.executable, "-m", "gateway", "hands"]] * workers, env):
        asyncio.run(wait_for_workers(url, workers))
        rate = run_loop(_naps(url, total=args.naps, in_flight=400, seconds=0.05))
    asyncio.run(_forget(url))
    return {"system": "Pincer nap 50 ms", "workers": workers, "calls_per_s": rate}


async def _forget(url: str) -> None:
    bus = Bus.from_settings(RedisSettings(), url)
    await bus.redis.delete(bus.keys.alive("hands"))
    await bus.close()


def write(rows: list[Row], naps: list[Row], out: Path) -> str:
    floor_1 = next(r for r in rows if r["system"].startswith("floor") and r["workers"] == 1)
    lines = [f"### {time.strftime('%Y-%m-%d')}, {platform.node()} ({os.cpu_count()} vCPU), "
             f"Python {platform.python_version()}, redis-server from {_redis_version()}", "",
             "| system | workers | sequential p50 | sequential p99 | calls/s, 64 in flight | p50 vs floor | "
             "calls/s vs floor |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        # Pincer: the median of its per-round ratios to the floor with as many workers (same rounds);
        # the others: against the one-worker floor's medians.
        p50_ratio = r.get("p50_vs_floor", r["p50_ms"] / floor_1["p50_ms"])
        calls_ratio = r.get("calls_vs_floor", r["calls_per_s"] / floor_1["calls_per_s"])
        lines.append(f"| {r['system']} | {r['workers']} | {r['p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms | "
                     f"{r['calls_per_s']:,.0f} | {p50_ratio:.2f}× | {calls_ratio:.2f}× |")
    lines += ["", "| I/O-bound: nap 50 ms, 400 in flight | workers | calls/s |", "|---|---|---|"]
    lines += [f"| {r['system']} | {r['workers']} | {r['calls_per_s']:,.0f} |" for r in naps]
    _chart(rows, naps, out)
    return "\n".join(lines) + "\n"


def _chart(rows: list[Row], naps: list[Row], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['system'].split(' (')[0]}\n{r['workers']} w" for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    axes[0].bar(labels, [r["p50_ms"] for r in rows], color="#4c72b0")
    axes[0].set_title("sequential round trip p50 (ms, lower is better)")
    axes[1].bar(labels, [r["calls_per_s"] for r in rows], color="#55a868")
    axes[1].set_title("calls/s with 64 in flight (higher is better)")
    axes[2].plot([r["workers"] for r in naps], [r["calls_per_s"] for r in naps], marker="o")
    axes[2].set_title("Pincer nap 50 ms: calls/s by workers")
    axes[2].set_xticks([r["workers"] for r in naps])
    axes[2].set_ylim(bottom=0)
    for ax in axes[:2]:
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(f"Pincer vs the floor and Celery, {time.strftime('%Y-%m-%d')}, {platform.node()}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def _redis_version() -> str:
    from bus.redis_server import find_redis_server

    binary = find_redis_server()
    return subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.split(" ")[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequential", type=int, default=300, help="sequential calls per round")
    # Rounds of ~0.5 s: shorter ones let one scheduler hiccup move the ratio.
    parser.add_argument("--total", type=int, default=10_000, help="calls with 64 in flight, per round")
    parser.add_argument("--naps", type=int, default=2000)
    parser.add_argument("--no-write", action="store_true", help="print, do not touch bench/compare-results.md")
    parser.add_argument("--rounds", type=int, default=15, help="alternating floor/Pincer rounds (medians)")
    parser.add_argument("--only", nargs="+", choices=["pincer", "celery", "naps"],
                        default=["pincer", "celery", "naps"],
                        help="measure only these (implies --no-write); pincer comes with its floor")
    args = parser.parse_args()
    rows: list[Row] = []
    naps: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        redis = EmbeddedRedis(Path(tmp))
        url = redis.start()
        try:
            if "pincer" in args.only:
                pairs = [run_floor_and_pincer(url, tmp, workers, args) for workers in (1, 2)]
                rows += [pair[0] for pair in pairs] + [pair[1] for pair in pairs]
            if "celery" in args.only:
                rows += [run_celery(url, workers, args) for workers in (1, 2)]
            if "naps" in args.only:
                naps += [run_naps(url, tmp, workers, args) for workers in (1, 2, 4)]
        finally:
            redis.stop()
    if len(args.only) < 3:
        for row in rows + naps:
            print(row)
        return
    section = write(rows, naps, ROOT / "bench" / "results.png")
    print(section)
    if not args.no_write:
        results = ROOT / "bench" / "compare-results.md"
        head = results.read_text() if results.exists() else HEADER
        results.write_text(head.rstrip() + "\n\n" + section)


HEADER = """# Pincer side by side (`bench/compare.py`)

Each run appends a section: the bare floor, Pincer and Celery on one private
redis-server, same client shape (see the script's docstring). The chart of the
latest run is `bench/results.png`. Older measurements of single parts (sandbox
spawn, Brain overhead) are in `bench/results.md`.
"""


if __name__ == "__main__":
    main()
