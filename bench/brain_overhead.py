"""The Brain's own cost per loop iteration, without the model's or the tool's time.

A private redis-server and one `pincer hands` process; in this process a
BrainWorker whose model is an instant in-process fake: it asks for
the `noop` skill N times, then answers. The same run measures the bare tool
round trip (`tool:execute` → `tool:result`) from a client, so

    Brain overhead per iteration = turn time / N − tool round trip

is what the loop adds: transcript appends, chat:tool events, the plan, fitting
the context, the tool request itself. Run: .venv/bin/python bench/brain_overhead.py
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bus_roundtrip import bench_env, one_call, wait_for_workers  # noqa: E402
from brain.config import BrainSettings, RecordSettings  # noqa: E402
from brain.llm import Completion, ToolCall  # noqa: E402
from brain.worker import BrainWorker  # noqa: E402
from bus.protocol import ChatMessage, ChatReply  # noqa: E402
from bus.redis_server import EmbeddedRedis  # noqa: E402
from bus.replies import ReplyInbox  # noqa: E402
from bus.service import run_loop  # noqa: E402
from bus.settings import RedisSettings  # noqa: E402
from bus.streams import Bus  # noqa: E402


class InstantLLM:
    """Calls noop until the turn has ``calls`` results, then answers."""

    def __init__(self, calls: int) -> None:
        self.calls = calls

    async def complete(self, messages: list[dict[str, Any]], tools: Any, on_text: Any, **_options: Any) -> Completion:
        done = sum(1 for m in messages[-2 * self.calls:] if m["role"] == "tool")
        if messages[-1]["role"] == "user" or done < self.calls:
            return Completion(tool_calls=[ToolCall(id=f"c{len(messages)}", name="noop", arguments="{}")],
                              model="instant")
        return Completion(text="done", model="instant")


async def measure(url: str, *, iterations: int, turns: int, sequential: int, record: bool = True) -> dict[str, float]:
    bus = Bus.from_settings(RedisSettings(), url)
    inbox = ReplyInbox(bus, "bench-client", block_ms=1000)
    await inbox.start()
    brain = BrainWorker(bus, BrainSettings(max_iterations=iterations + 1, loop_warn_at=0, loop_stop_at=0,
                                           max_tool_calls=10_000, record=RecordSettings(enabled=record)),
                        instance_id="bench-brain",
                        llm=InstantLLM(iterations))
    stop = asyncio.Event()
    running = asyncio.create_task(brain.run(stop))
    try:
        for _ in range(50):
            await one_call(bus, inbox)
        tool_rt = statistics.median([await one_call(bus, inbox) for _ in range(sequential)])
        per_iteration = []
        for n in range(turns + 1):
            message = ChatMessage(session_id=f"bench-{n}", text="go", reply_to=inbox.stream)
            started = time.perf_counter()
            async with inbox.expect(message.message_id) as queue:
                await bus.publish(bus.keys.brain_inbox, message)
                while not isinstance(await queue.get(), ChatReply):
                    pass
            if n:  # the first turn warms the tool catalog
                per_iteration.append((time.perf_counter() - started) / (iterations + 1))
        turn_iteration = statistics.median(per_iteration)
    finally:
        stop.set()
        await running
        await inbox.close()
        await bus.close()
    return {"tool_rt_ms": tool_rt * 1000, "iteration_ms": turn_iteration * 1000,
            "overhead_ms": (turn_iteration - tool_rt * iterations / (iterations + 1)) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=20, help="tool calls per turn")
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--sequential", type=int, default=500)
    parser.add_argument("--no-record", action="store_true", help="brain.record.enabled off (the flight recorder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        redis = EmbeddedRedis(Path(tmp))
        url = redis.start()
        hands = subprocess.Popen([sys.executable, "-m", "gateway", "hands"], env=bench_env(url, tmp),
                                 stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        try:
            asyncio.run(wait_for_workers(url, 1))
            r = run_loop(measure(url, iterations=args.iterations, turns=args.turns, sequential=args.sequential,
                                 record=not args.no_record))
        finally:
            hands.terminate()
            hands.wait()
            redis.stop()
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {os.cpu_count()} cpu, Python {platform.python_version()}")
    print(f"tool round trip p50: {r['tool_rt_ms']:.2f} ms; turn time per model call: {r['iteration_ms']:.2f} ms; "
          f"Brain overhead per iteration: {r['overhead_ms']:.2f} ms")


if __name__ == "__main__":
    main()
