"""chat:cancel and tool:cancel cancel tasks that may be inside a Redis command: the client must stay usable.

redis-py had releases where a command cancelled between send and reply left its
connection one reply behind (the next command read the previous answer) or hung.
Pincer relies on the installed redis-py not doing that; this guards it.
"""

from __future__ import annotations

import asyncio
import random

from bus.streams import Bus


async def test_commands_cancelled_at_any_moment_leave_the_client_answering_correctly(bus: Bus) -> None:
    redis, key, stream, claimable = bus.redis, f"{bus.keys.prefix}k", f"{bus.keys.prefix}s", f"{bus.keys.prefix}c"
    await redis.set(key, "v")
    await redis.xgroup_create(claimable, "g", id="0", mkstream=True)
    for n in range(10):
        await redis.xadd(claimable, {"n": n})
    await redis.xreadgroup("g", "c", {claimable: ">"})

    def pipeline():
        pipe = redis.pipeline(transaction=False)
        pipe.get(key)
        pipe.incr(f"{key}:n")
        return pipe.execute()

    commands = [lambda: redis.get(key), pipeline, lambda: redis.eval("return redis.call('GET', KEYS[1])", 1, key),
                lambda: redis.xread({stream: "$"}, block=200),
                lambda: redis.xautoclaim(claimable, "g", "c", 0, "0-0", count=10)]
    rng = random.Random(7)
    for _ in range(200):
        task = asyncio.ensure_future(rng.choice(commands)())
        await asyncio.sleep(rng.choice([0, 0, 0.0001, 0.001, 0.01]))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        async with asyncio.timeout(3):  # not hung
            assert await redis.get(key) == b"v"  # and not one reply behind
