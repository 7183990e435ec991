"""Spawn overhead of each sandbox tier against a plain subprocess, on the same run.

Runs `true` and `python3 -c pass` N times each way and prints the medians; the bwrap tier twice: cold (a
bwrap per command) and warm (one session's sandbox kept warm, started before the timing).
Run as root (as Hands does in CI): .venv/bin/python bench/sandbox_spawn.py
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hands.config import SandboxSettings
from hands.sandbox.env import sandbox_env
from hands.sandbox.runner import Sandbox

RUNS = 40


async def plain(argv: list[str]) -> float:
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(*argv)
    await process.wait()
    return time.perf_counter() - started


async def sandboxed(sandbox: Sandbox, argv: list[str]) -> float:
    started = time.perf_counter()
    result = await sandbox.run(argv, workdir="", env=sandbox_env(None), timeout_s=30)
    assert result.exit_code == 0, result
    return time.perf_counter() - started


async def main() -> None:
    workspace = Path(tempfile.mkdtemp(prefix="pincer-bench-"))
    os.chmod(workspace, 0o755)
    if os.geteuid() == 0:
        os.chown(workspace, 65534, 65534)
    tiers = {
        tier: Sandbox(SandboxSettings(tier=tier, allow_degraded=True, warm=False), workspace)
        for tier in ("bwrap", "landlock", "rlimits")
    }
    warm = Sandbox(SandboxSettings(tier="bwrap", warm=True), workspace)
    assert warm.warm is not None, "the bwrap tier is not usable here"
    await sandboxed(warm, ["/usr/bin/true"])  # the session's sandbox starts here, not in the timing
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {os.cpu_count()} cpu, kernel {platform.release()}, "
          f"median of {RUNS}")
    print("| command | plain subprocess | rlimits tier | landlock tier | bwrap tier, cold | bwrap tier, warm |\n"
          "|---|---|---|---|---|---|")
    for argv in (["/usr/bin/true"], ["/usr/bin/python3", "-c", "pass"]):
        row = [statistics.median([await plain(argv) for _ in range(RUNS)])]
        for tier in ("rlimits", "landlock", "bwrap"):
            assert tiers[tier].tier == tier, f"{tier} is not usable here"
            row.append(statistics.median([await sandboxed(tiers[tier], argv) for _ in range(RUNS)]))
        row.append(statistics.median([await sandboxed(warm, argv) for _ in range(RUNS)]))
        print(f"| `{' '.join(argv)}` | " + " | ".join(f"{t * 1000:.1f} ms" for t in row) + " |")
    firsts = []
    for index in range(RUNS // 4):  # a new session each time: its bwrap and runner start in the timing
        started = time.perf_counter()
        result = await warm.run(["/usr/bin/true"], workdir="", env=sandbox_env(None), timeout_s=30,
                                session=f"first-{index}")
        assert result.exit_code == 0, result
        firsts.append(time.perf_counter() - started)
    print(f"\nA session's first `true`, warm (its sandbox starts): {statistics.median(firsts) * 1000:.1f} ms, "
          f"median of {len(firsts)}")
    await warm.close()


if __name__ == "__main__":
    asyncio.run(main())
