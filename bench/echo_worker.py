"""Pincer's transport without the Hands lifecycle: a GroupConsumer that answers every call at once.

The same stream, group, decoding, task per call, batcher and reply models as a
Hands worker, but no registry, validation, policy, limits, timeout or shaping.
bench/cost_per_call.py runs it between the floor and the full worker, to show
which share of a call's cost is the transport and which the lifecycle.
Run: python bench/echo_worker.py URL
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bus.config import RedisSettings  # noqa: E402
from bus.keys import HANDS_GROUP  # noqa: E402
from bus.protocol import Message, ResultMetadata, ToolExecute, ToolResult  # noqa: E402
from bus.service import run_loop  # noqa: E402
from bus.streams import Bus, GroupConsumer, Reply  # noqa: E402


async def answer(message: Message, _stream: str) -> Sequence[Reply]:
    assert isinstance(message, ToolExecute)
    result = ToolResult(call_id=message.call_id, success=True, data="ok",
                        metadata=ResultMetadata(tool_name=message.tool, worker_id="echo"))
    return [(message.reply_to, result)]


async def main(url: str) -> None:
    bus = Bus.from_settings(RedisSettings(), url)
    consumer = GroupConsumer(bus, streams=[bus.keys.hands_requests], group=HANDS_GROUP, consumer="echo",
                             handler=answer, concurrency=256)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(15, stop.set)
    try:
        await consumer.run(stop)
    finally:
        await bus.close()


if __name__ == "__main__":
    run_loop(main(sys.argv[1]))
