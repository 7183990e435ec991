"""What an MCP tool costs over a skill: a no-op call of each through one Hands worker, same run.

The MCP server is tests/mcp_servers/raw_server.py (the wire alone, no SDK:
its own cost is a thread per call) run by the sandbox (bwrap where it works)
as any stdio server is; the skill is bench/skills/noop. Calls alternate in
rounds so both see the same machine. Run: .venv/bin/python bench/mcp_call.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

from bench.bus_roundtrip import bench_env, one_call, wait_for_workers  # noqa: E402
from bus.redis_server import EmbeddedRedis  # noqa: E402
from bus.replies import ReplyInbox  # noqa: E402
from bus.settings import RedisSettings  # noqa: E402
from bus.streams import Bus  # noqa: E402


async def measure(url: str, *, rounds: int, in_flight: int, total: int) -> dict[str, dict[str, float]]:
    bus = Bus.from_settings(RedisSettings(), url)
    inbox = ReplyInbox(bus, "bench", block_ms=1000)
    await inbox.start()
    tools = {"skill": "noop", "mcp": "mcp_raw_noop"}
    try:
        for deadline in range(600):  # the server starts in the background
            if deadline and await _offered(bus, inbox, tools["mcp"]):
                break
            await asyncio.sleep(0.1)
        latencies: dict[str, list[float]] = {kind: [] for kind in tools}
        for _ in range(50):
            for tool in tools.values():
                await one_call(bus, inbox, tool)
        for _ in range(rounds):
            for kind, tool in tools.items():
                latencies[kind].append(await one_call(bus, inbox, tool))
        found: dict[str, dict[str, float]] = {}
        for kind, tool in tools.items():
            slots = asyncio.Semaphore(in_flight)

            async def bounded(tool: str = tool, slots: asyncio.Semaphore = slots) -> None:
                async with slots:
                    await one_call(bus, inbox, tool)

            started = time.perf_counter()
            await asyncio.gather(*(bounded() for _ in range(total)))
            elapsed = time.perf_counter() - started
            ordered = sorted(latencies[kind])
            found[kind] = {"p50_ms": statistics.median(ordered) * 1000,
                           "p99_ms": ordered[int(len(ordered) * 0.99) - 1] * 1000, "calls_per_s": total / elapsed}
        return found
    finally:
        await inbox.close()
        await bus.close()


async def _offered(bus: Bus, inbox: ReplyInbox, tool: str) -> bool:
    try:
        await one_call(bus, inbox, tool)
    except AssertionError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--total", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server_dir = Path(tmp) / "mcp"
        server_dir.mkdir()
        for path in (Path(tmp), server_dir):
            path.chmod(0o755)
        shutil.copy(ROOT / "tests" / "mcp_servers" / "raw_server.py", server_dir / "raw_server.py")
        (Path(tmp) / "ws").mkdir(mode=0o755)
        url = EmbeddedRedis(Path(tmp)).start()
        servers = {"raw": {"command": "/usr/bin/python3", "args": ["-u", str(server_dir / "raw_server.py")],
                           "read_only": [str(server_dir)]}}
        env = {**bench_env(url, tmp), "PINCER_HANDS__MCP__SERVERS": json.dumps(servers),
               "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true"}
        worker = subprocess.Popen([sys.executable, "-m", "hands"], env=env, cwd=ROOT)
        try:
            asyncio.run(wait_for_workers(url, 1))
            found = asyncio.run(measure(url, rounds=args.rounds, in_flight=args.in_flight, total=args.total))
        finally:
            worker.terminate()
            worker.wait(30)
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {os.cpu_count()} cpu, Python {platform.python_version()}")
    print(
        f"| no-op call | sequential p50 | sequential p99 | throughput ({args.in_flight} in flight) |\n|---|---|---|---|"
    )
    for kind, row in found.items():
        print(f"| {kind} | {row['p50_ms']:.2f} ms | {row['p99_ms']:.2f} ms | {row['calls_per_s']:.0f} calls/s |")


if __name__ == "__main__":
    main()
