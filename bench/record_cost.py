"""The flight recorder's own CPU per model step, in the Brain's process (no Redis: the commands are built and
handed to a stand-in pipeline). A turn of 40 steps, each request one message longer than the last, with a
2,000-character system prompt and 17 tools: the first step digests and sends every part, the later ones
only the new message. Run: .venv/bin/python bench/record_cost.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bus.keys import Keys
from memory.flight import FlightRecorder
from memory.record_parts import Parts

STEPS = 40


class Pipe:
    """Takes the commands a step adds, as a pipeline would, and does nothing with them."""

    def hsetnx(self, *_args: Any) -> None: ...
    def xadd(self, *_args: Any) -> None: ...
    def expire(self, *_args: Any) -> None: ...
    def eval(self, *_args: Any) -> None: ...


async def one_turn() -> list[float]:
    queued: list[Any] = []
    recorder = FlightRecorder(None, Keys("bench:"), keep_s=600,  # type: ignore[arg-type]
                              send=lambda build, done=None: queued.append(build))
    tools = [{"type": "function", "function": {"name": f"tool{i}", "description": "d" * 200,
                                                "parameters": {"type": "object"}}} for i in range(17)]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s" * 2000}]
    seen, took = Parts(), []
    for _ in range(STEPS):
        messages = [*messages, {"role": "user", "content": "x" * 300}]
        started = time.perf_counter()
        await recorder.model_call("s", "m", messages=messages, tools=tools, seen=seen,
                                  params={"models": ["a"], "max_output_tokens": None, "purpose": "turn"},
                                  response={"text": "hi", "usage": {"prompt_tokens": 10}})
        queued[-1](Pipe())
        took.append(time.perf_counter() - started)
    return took


def main() -> None:
    took = [t for _ in range(20) for t in asyncio.run(one_turn())]
    print(f"per model step: p50 {statistics.median(took) * 1000:.3f} ms, "
          f"max {max(took) * 1000:.3f} ms (a turn's first step: every part new)")


if __name__ == "__main__":
    main()
