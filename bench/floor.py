"""The floor: a bare redis-py round trip with the same shape as a Pincer tool call, nothing else.

Client: XADD a request, wait on its reply stream (one reader, XREAD BLOCK).
Worker (its own process): XREADGROUP COUNT 32 BLOCK, then one pipeline of the
reply XADDs and one XACK for the batch. No validation, no models, no tool.
Run as a worker: ``python bench/floor.py worker URL STREAM``; bench/compare.py
drives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bus.redis_client import connect

GROUP = "floor"


async def worker(url: str, stream: str) -> None:
    redis = connect(url)
    with contextlib.suppress(Exception):  # BUSYGROUP: another worker made it
        await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
    name = uuid.uuid4().hex[:8]
    while True:
        got = await redis.xreadgroup(GROUP, name, {stream: ">"}, count=32, block=1000)
        if not got:
            continue
        entries = got[0][1]
        async with redis.pipeline(transaction=False) as pipe:
            for _, fields in entries:
                pipe.xadd(fields[b"reply_to"], {b"id": fields[b"id"], b"ok": b"1"}, maxlen=10_000, approximate=True)
            pipe.xack(stream, GROUP, *[entry_id for entry_id, _ in entries])
            await pipe.execute()


class FloorClient:
    """Sends requests (all XADDs of one loop tick in one pipeline) and routes replies by id."""

    def __init__(self, url: str, stream: str) -> None:
        self.redis, self.stream = connect(url), stream
        self.reply_to = f"floor:reply:{uuid.uuid4().hex[:8]}"
        self.waiting: dict[bytes, asyncio.Future[None]] = {}
        self.pending: list[bytes] = []
        self.flushing = self.closing = False
        self.reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.reader = asyncio.create_task(self._read())

    async def close(self) -> None:
        self.closing = True  # the reader stops after its current short block (never cancelled mid-command)
        if self.reader:
            await self.reader
        await self.redis.aclose()

    async def call(self) -> float:
        started = time.perf_counter()
        request_id = uuid.uuid4().hex.encode()
        done = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = done
        self.pending.append(request_id)
        if not self.flushing:
            self.flushing = True
            asyncio.get_running_loop().create_task(self._flush())
        await done
        return time.perf_counter() - started

    async def _flush(self) -> None:
        batch, self.pending, self.flushing = self.pending, [], False
        async with self.redis.pipeline(transaction=False) as pipe:
            for request_id in batch:
                pipe.xadd(self.stream, {b"id": request_id, b"reply_to": self.reply_to.encode()})
            await pipe.execute()

    async def _read(self) -> None:
        last = "0-0"
        while not self.closing:
            got = await self.redis.xread({self.reply_to: last}, count=512, block=100)
            for _, entries in got or []:
                for entry_id, fields in entries:
                    last = entry_id
                    future = self.waiting.pop(fields[b"id"], None)
                    if future is not None and not future.done():
                        future.set_result(None)


async def measure(url: str, stream: str, *, sequential: int, total: int, in_flight: int) -> dict[str, float]:
    client = FloorClient(url, stream)
    await client.start()
    try:
        for _ in range(200):
            await client.call()
        latencies = sorted([await client.call() for _ in range(sequential)])
        slots = asyncio.Semaphore(in_flight)

        async def bounded() -> None:
            async with slots:
                await client.call()

        started = time.perf_counter()
        await asyncio.gather(*(bounded() for _ in range(total)))
        elapsed = time.perf_counter() - started
    finally:
        await client.close()
    return {"p50_ms": statistics.median(latencies) * 1000,
            "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000, "calls_per_s": total / elapsed}


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        import uvloop  # as every Pincer process runs

        uvloop.run(worker(sys.argv[2], sys.argv[3]))
