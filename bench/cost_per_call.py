"""What one tool call costs, process by process: CPU µs, Redis commands and bytes per call.

Runs the floor (bench/floor.py), an inline echo (bench/echo_worker.py --inline:
Pincer's models, no task or future per call), Pincer's transport alone
(bench/echo_worker.py: the same consumer, models and batcher as Hands, no
lifecycle) and Pincer's Hands path (no-op skill), each with one worker and 64
calls in flight on a private Redis, interleaved with the floor, and reads each process's CPU
time and write system calls (/proc) and Redis' command counters around the measured calls. Throughput
on a small machine is CPU per call summed over the client, the worker and
redis-server, so this says where a change helps. Run: .venv/bin/python bench/cost_per_call.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis import Redis  # noqa: E402

from bench import floor  # noqa: E402
from bench.bus_roundtrip import bench_env, measure, wait_for_workers  # noqa: E402
from bus.redis_server import EmbeddedRedis  # noqa: E402
from bus.service import run_loop  # noqa: E402


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def writes(pid: int) -> int:
    """The process's write system calls so far: each one a socket send that may wake a reader,
    which on a small VM costs more than most of the Python around it."""
    io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(io["syscw"])


def counters(url: str) -> dict[str, float]:
    with Redis.from_url(url) as redis:
        stats = {name.removeprefix("cmdstat_"): float(v["calls"]) for name, v in redis.info("commandstats").items()}
        net = redis.info("stats")
        return {**stats, "bytes in": net["total_net_input_bytes"], "bytes out": net["total_net_output_bytes"]}


def cost(redis: EmbeddedRedis, worker_pid: int, run: Callable[[int], Any], calls: int) -> dict[str, float]:
    run(200)  # warm up
    url = redis.url
    before = counters(url)
    assert redis.process is not None, "start the server first"
    pids = {"worker": worker_pid, "client": os.getpid(), "redis-server": redis.process.pid}
    cpu_before = {name: cpu_s(pid) for name, pid in pids.items()}
    writes_before = {name: writes(pid) for name, pid in pids.items()}
    measured = run(calls)  # its own calls/s: timed around the calls only, not the client's start and stop
    after = counters(url)
    row = {f"cpu µs {name}": (cpu_s(pid) - cpu_before[name]) / calls * 1e6 for name, pid in pids.items()}
    row |= {f"writes {name}": (writes(pid) - writes_before[name]) / calls for name, pid in pids.items()}
    row |= {k: (after[k] - before.get(k, 0)) / calls for k in after if after[k] != before.get(k, 0)}
    return {"calls/s": measured["calls_per_s"], **row}


def floor_run(url: str) -> Callable[[int], Any]:
    return lambda n: run_loop(floor.measure(url, "floor:cost", sequential=1, total=n, in_flight=64))


def pincer_run(url: str) -> Callable[[int], Any]:
    return lambda n: run_loop(measure(url, sequential=1, total=n, in_flight=64))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    quiet = {"cwd": ROOT, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    echo = [sys.executable, str(ROOT / "bench" / "echo_worker.py")]
    columns = {"inline echo": [*echo, "{url}", "--inline"], "transport": [*echo, "{url}"],
               "pincer": [sys.executable, "-m", "gateway", "hands"]}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in ["floor", *columns]}
    with tempfile.TemporaryDirectory() as tmp:
        redis = EmbeddedRedis(Path(tmp))
        url = redis.start()
        floor_worker = subprocess.Popen([sys.executable, str(ROOT / "bench" / "floor.py"), "worker", url,
                                         "floor:cost"], **quiet)
        try:
            time.sleep(1.0)
            for name, command in columns.items():  # one at a time: they read the same request stream
                worker = subprocess.Popen([part.format(url=url) for part in command], env=bench_env(url, tmp),
                                          **quiet)
                try:
                    if name == "pincer":
                        run_loop(wait_for_workers(url, 1))
                    else:
                        time.sleep(1.0)
                    for _ in range(args.repeat):  # interleaved with the floor: the VM's speed drifts
                        rows["floor"].append(cost(redis, floor_worker.pid, floor_run(url), args.calls))
                        rows[name].append(cost(redis, worker.pid, pincer_run(url), args.calls))
                finally:
                    worker.terminate()
                    worker.wait()
        finally:
            floor_worker.terminate()
            floor_worker.wait()
            redis.stop()
    print(f"median of {args.repeat} runs of {args.calls:,} calls each (the floor's: of all its runs, interleaved "
          "with the others), 64 in flight, 1 worker")
    keys = [k for k in rows["pincer"][0] if k.startswith(("cpu", "calls", "writes")) or
            max(statistics.median(r.get(k, 0.0) for r in rows[name]) for name in rows) >= 0.01]
    print(f"  {'':20}" + "".join(f"{name:>13}" for name in rows) + "  (× floor)")
    for key in keys:
        values = [statistics.median(r.get(key, 0.0) for r in rows[name]) for name in rows]
        ratios = " ".join(f"{v / values[0]:.2f}×" if values[0] else "-" for v in values[1:])
        print(f"  {key:20}" + "".join(f"{v:13.2f}" for v in values) + f"  ({ratios})")


if __name__ == "__main__":
    main()
