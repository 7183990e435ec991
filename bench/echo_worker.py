"""Pincer's transport without the Hands lifecycle: a worker that answers every call at once.

Two forms, both with the request and reply models a Hands worker uses:
- default: a GroupConsumer (a task per call, the batcher, reply and ack in one transaction), as
  Hands runs it, but with no registry, validation, policy, limits, timeout or
  shaping;
- ``--inline``: the read loop answers a batch itself in one pipeline (no task,
  future or consumer bookkeeping per call), to show what that machinery costs.
bench/cost_per_call.py runs both between the floor and the full worker.
Run: python bench/echo_worker.py URL [--inline]
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bus.answers import Reply
from bus.codec import decode
from bus.consumer import GroupConsumer
from bus.keys import HANDS_GROUP
from bus.protocol import Message, ResultMetadata, ToolExecute, ToolResult
from bus.service import run_loop
from bus.settings import RedisSettings
from bus.streams import Bus


def result_for(message: Message) -> ToolResult:
    assert isinstance(message, ToolExecute)
    return ToolResult(call_id=message.call_id, success=True, data="ok",
                      metadata=ResultMetadata(tool_name=message.tool, worker_id="echo"))


async def answer(message: Message, _stream: str) -> Sequence[Reply]:
    return [(message.reply_to, result_for(message))]  # type: ignore[attr-defined]


async def inline(bus: Bus, stop: asyncio.Event) -> None:
    stream = bus.keys.hands_requests
    while not stop.is_set():
        got = await bus.redis.xreadgroup(HANDS_GROUP, "echo-inline", {stream: ">"}, count=16, block=1000)
        entries = got[0][1] if got else []
        if not entries:
            continue
        pipe = bus.redis.pipeline(transaction=False)
        for _entry_id, fields in entries:
            message = decode(fields)
            bus.add(pipe, message.reply_to, result_for(message))  # type: ignore[attr-defined]
        pipe.xack(stream, HANDS_GROUP, *[entry_id for entry_id, _ in entries])
        await pipe.execute()


async def main(url: str, inline_mode: bool) -> None:
    bus = Bus.from_settings(RedisSettings(), url)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        if inline_mode:
            await bus.ensure_group(bus.keys.hands_requests, HANDS_GROUP)
            await inline(bus, stop)
        else:
            await GroupConsumer(bus, streams=[bus.keys.hands_requests], group=HANDS_GROUP, consumer="echo",
                                handler=answer, concurrency=256).run(stop)
    finally:
        await bus.close()


if __name__ == "__main__":
    run_loop(main(sys.argv[1], "--inline" in sys.argv[2:]))
