"""What `redis.min_replicas: 1` costs: the same no-op calls with and without WAIT, one primary and one replica.

Starts a redis-server primary and a replica of it on loopback, one Hands worker
(bench skills) per setting, and a caller on the same setting, then measures
sequential latency and throughput with 64 in flight, alternating the settings
in rounds. Run: .venv/bin/python bench/replica_wait.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis import Redis  # noqa: E402

from bench.bus_roundtrip import bench_env, measure  # noqa: E402
from bus.presence import alive  # noqa: E402
from bus.redis_server import free_port  # noqa: E402
from bus.settings import RedisSettings  # noqa: E402
from bus.streams import Bus  # noqa: E402


def server(where: Path, name: str, port: int, *extra: str) -> subprocess.Popen[bytes]:
    (where / name).mkdir()
    return subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port), "--save", "",
                             "--appendonly", "no", "--dir", str(where / name), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sequential", type=int, default=500)
    parser.add_argument("--total", type=int, default=4000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        primary, replica = free_port(), free_port()
        servers = [server(where, "primary", primary), server(where, "replica", replica, "--replicaof", "127.0.0.1",
                                                             str(primary))]
        url = f"redis://127.0.0.1:{primary}/0"
        try:
            for _ in range(100):
                try:
                    with Redis(port=replica) as r:
                        if r.info("replication").get("master_link_status") == "up":
                            break
                except Exception:
                    pass
                time.sleep(0.1)
            rows: dict[int, list[dict[str, float]]] = {0: [], 1: []}
            for _ in range(args.rounds):
                for setting in (0, 1):
                    env = {**bench_env(url, tmp), "PINCER_REDIS__MIN_REPLICAS": str(setting),
                           "PINCER_REDIS__PREFIX": f"wait{setting}:"}
                    worker = subprocess.Popen([sys.executable, "-m", "hands"], env=env, cwd=ROOT)
                    try:
                        rows[setting].append(asyncio.run(measure(
                            url, sequential=args.sequential, total=args.total, in_flight=64,
                            settings=RedisSettings(min_replicas=setting, prefix=f"wait{setting}:"),
                            before=wait_for_worker)))
                    finally:
                        worker.terminate()
                        worker.wait(30)
        finally:
            for process in servers:
                process.kill()
                process.wait()
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {os.cpu_count()} cpu, Python {platform.python_version()}")
    print("| redis.min_replicas | sequential p50 | p99 | calls/s, 64 in flight |\n|---|---|---|---|")
    for setting, found in rows.items():
        print(f"| {setting} | {statistics.median(r['p50_ms'] for r in found):.2f} ms | "
              f"{statistics.median(r['p99_ms'] for r in found):.2f} ms | "
              f"{statistics.median(r['calls_per_s'] for r in found):.0f} |")


async def wait_for_worker(bus: Bus) -> None:
    for _ in range(200):
        if await alive(bus, "hands"):
            return
        await asyncio.sleep(0.1)
    raise SystemExit("the worker did not come up")


if __name__ == "__main__":
    main()
