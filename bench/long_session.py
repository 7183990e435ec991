"""What a turn costs as its session grows: one session, many sequential plain turns through the real stack.

A private redis-server, real `pincer gateway`, `brain` and `hands` processes and the scripted model on loopback
(bench/gateway_turns.py's stack). Every turn goes to the same session; for each block of ``--block`` turns it
prints the turn's p50 and the CPU the Brain and redis-server spent per turn (from /proc). What a turn repeats
for every message of its history (reading, fitting, counting, recording) shows as the later blocks' growth;
the request's own JSON grows too, and is inherent (the model is sent the whole conversation). Past the
model's window the turn also fits the conversation to it (brain/context.py).

Run: .venv/bin/python bench/long_session.py [--turns 400] [--block 50] [--window TOKENS]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway_turns import (  # noqa: E402
    TOKEN,
    ScriptedModel,
    cpu_ms,
    native,
    start_stack,
    stop_stack,
    wait_healthy,
)
from bus.redis_server import EmbeddedRedis  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--block", type=int, default=50)
    parser.add_argument("--window", type=int, help="brain.context_window_tokens (default: the model's, or Pincer's)")
    args = parser.parse_args()
    extra = {"PINCER_BRAIN__CONTEXT_WINDOW_TOKENS": str(args.window)} if args.window else {}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        redis = EmbeddedRedis(tmp / "redis")
        url = redis.start()
        llm = ScriptedModel()
        env, procs = start_stack(tmp, url, llm, extra)
        brain = procs[1].pid
        try:
            base = f"http://127.0.0.1:{env['PINCER_GATEWAY_PORT']}"
            wait_healthy(base)
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as client:
                for i in range(5):
                    native(client, f"warm-{i}", "hello")
                print(f"{platform.node()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}; "
                      f"one session, {args.turns} turns")
                print(f"{'turns':>11} {'p50 ms':>8} {'brain cpu ms/turn':>18} {'redis cpu ms/turn':>18}")
                for start in range(0, args.turns, args.block):
                    cpu = cpu_ms(brain), cpu_ms(redis.process.pid)  # type: ignore[union-attr]  # started above
                    times = []
                    for i in range(start, min(start + args.block, args.turns)):
                        began = time.perf_counter()
                        native(client, "long", f"message number {i} with a few words")
                        times.append((time.perf_counter() - began) * 1000)
                    spent = (cpu_ms(brain) - cpu[0]) / len(times), \
                        (cpu_ms(redis.process.pid) - cpu[1]) / len(times)  # type: ignore[union-attr]
                    print(f"{start + 1:>5}-{start + len(times):<5} {statistics.median(times):8.2f} "
                          f"{spent[0]:18.2f} {spent[1]:18.2f}")
        finally:
            stop_stack(procs, llm, redis)


if __name__ == "__main__":
    main()
