"""Offline replay's speed: recorded sessions replayed a second (no provider, tools from the record).

One session is recorded by a real Brain against a real Hands worker (a subprocess) on an embedded Redis:
3 turns, the first two calling ``noop`` twice each, so 8 model calls and 4 tool calls. It is exported,
then replayed ``--sessions`` times one after another, then as many ``--concurrent`` at a time, through one
``brain.replay.Replayer`` as `pincer eval` does (each replay: a scratch session, every request compared;
the pool's tool list asked once).
Run: .venv/bin/python bench/replay_speed.py
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bus_roundtrip import bench_env, wait_for_workers
from brain.config import BrainSettings
from brain.llm import Completion, ToolCall
from brain.replay import Replayer
from brain.worker import BrainWorker
from bus.protocol import ChatMessage, ChatReply
from bus.redis_server import EmbeddedRedis
from bus.replies import ReplyInbox
from bus.service import run_loop
from bus.settings import RedisSettings
from bus.streams import Bus
from memory.flight import FlightRecorder, read_lines

MESSAGES = ["do it twice", "and again twice", "thanks"]


class TwoNoops:
    """noop twice for a message that says "twice", then an answer."""

    async def complete(self, messages: list[dict[str, Any]], tools: Any, on_text: Any, **_options: Any) -> Completion:
        asked = next(m for m in reversed(messages) if m["role"] == "user")["content"]
        done = len(messages) - 1 - max(i for i, m in enumerate(messages) if m["role"] == "user")
        usage = {"prompt_tokens": 100 + len(messages), "completion_tokens": 5, "cached_tokens": 80}
        if "twice" in asked and done < 4:
            return Completion(tool_calls=[ToolCall(id=f"c{len(messages)}", name="noop", arguments="{}")],
                              model="instant", usage=usage)
        return Completion(text=f"done: {asked}", model="instant", usage=usage)


async def measure(url: str, sessions: int, concurrent: int) -> dict[str, float]:
    bus = Bus.from_settings(RedisSettings(), url)
    inbox = ReplyInbox(bus, "bench-client", block_ms=1000)
    await inbox.start()
    settings = BrainSettings()
    brain = BrainWorker(bus, settings, instance_id="bench-brain", llm=TwoNoops())  # type: ignore[arg-type]
    stop = asyncio.Event()
    running = asyncio.create_task(brain.run(stop))
    try:
        for text in MESSAGES:
            message = ChatMessage(session_id="owner/recorded", text=text, reply_to=inbox.stream, sender="owner")
            async with inbox.expect(message.message_id) as queue:
                await bus.publish(bus.keys.brain_inbox, message)
                while not isinstance(await queue.get(), ChatReply):
                    pass
    finally:
        stop.set()
        await running
        await inbox.close()
    steps, parts = read_lines(await FlightRecorder(bus.redis, bus.keys, keep_s=600).export("owner/recorded"))
    took = []
    try:
        async with Replayer(bus, settings) as replayer:  # as `pincer eval` does: one tool list for the run
            for _ in range(5):  # the tool catalog warms
                await replayer.replay(steps, parts)
            for _ in range(sessions):
                started = time.perf_counter()
                report = await replayer.replay(steps, parts)
                took.append(time.perf_counter() - started)
                assert report.diverged is None and all(turn.same for turn in report.turns), report.as_json()
            began = time.perf_counter()
            room = asyncio.Semaphore(concurrent)

            async def one() -> None:
                async with room:
                    assert (await replayer.replay(steps, parts)).diverged is None

            await asyncio.gather(*(one() for _ in range(sessions)))
            together = time.perf_counter() - began
    finally:
        await bus.close()
    model_calls = sum(step.kind == "model" for step in steps)
    return {"sessions_s": len(took) / sum(took), "together_s": sessions / together,
            "p50_ms": statistics.median(took) * 1000,
            "p90_ms": statistics.quantiles(took, n=10)[-1] * 1000, "model_calls": model_calls,
            "tools": sum(step.kind == "tool" for step in steps)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--concurrent", type=int, default=4, help="replays at once in the second run "
                        "(`pincer eval --jobs`)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        redis = EmbeddedRedis(Path(tmp))
        url = redis.start()
        hands = subprocess.Popen([sys.executable, "-m", "gateway", "hands"], env=bench_env(url, tmp),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            asyncio.run(wait_for_workers(url, 1))
            r = run_loop(measure(url, args.sessions, args.concurrent))
        finally:
            hands.terminate()
            hands.wait()
            redis.stop()
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {os.cpu_count()} cpu, Python {platform.python_version()}")
    print(f"a session of {len(MESSAGES)} turns, {r['model_calls']:.0f} model calls, {r['tools']:.0f} tool calls: "
          f"{r['sessions_s']:.1f} sessions/s replayed offline one at a time (p50 {r['p50_ms']:.1f} ms, "
          f"p90 {r['p90_ms']:.1f} ms); {r['together_s']:.1f} sessions/s {args.concurrent} at a time")


if __name__ == "__main__":
    main()
