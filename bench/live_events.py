"""Live events at scale: one Gateway fanning a session's events out to many WebSocket clients.

Starts a private Redis and one Gateway process, connects N clients (default
500) to /v1/ws, each subscribed to the same session, and reads the Gateway's
resident memory before and after (memory per idle connection). Then appends
E events to the session's log as fast as Redis takes them and times how long
until every client has every event: events/s delivered to all N, and
frames/s the Gateway wrote. The clients run in this process on the same
machine, so the figures are a floor for the Gateway, not a ceiling.

Run: .venv/bin/python bench/live_events.py [--clients 500] [--events 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from websockets.asyncio.client import connect  # noqa: E402

from bus.protocol import ChatDelta  # noqa: E402
from bus.redis_server import EmbeddedRedis, free_port  # noqa: E402
from bus.settings import RedisSettings  # noqa: E402
from bus.streams import Bus  # noqa: E402
from gateway.runtime.procinfo import resident_mb  # noqa: E402
from gateway.turns.events import SessionEvents  # noqa: E402

TOKEN = "pcr_bench-live-events"
SESSION = "bench-live"


async def wait_listening(port: int) -> None:
    for _ in range(300):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise SystemExit("the Gateway did not listen")


async def client(url: str, ready: asyncio.Event, counts: list[int], index: int, want: int,
                 done: asyncio.Event, connected: list[int]) -> None:
    async with connect(url, max_queue=None) as socket:
        await socket.send(json.dumps({"type": "auth", "token": TOKEN}))
        await socket.recv()  # ready
        await socket.send(json.dumps({"type": "subscribe", "session": SESSION}))
        await socket.recv()  # subscribed
        connected[0] += 1
        if connected[0] == len(counts):
            ready.set()
        async for raw in socket:
            if '"type": "event"' in raw or '"type":"event"' in raw:
                counts[index] += 1
                if counts[index] == want:
                    if all(c >= want for c in counts):
                        done.set()
                    await done.wait()
                    return


async def run(clients: int, events: int, url: str, redis_url: str, gateway_pid: int) -> dict[str, float]:
    bus = Bus.from_settings(RedisSettings(), redis_url)
    await bus.redis.set(bus.keys.session_owner(SESSION), "owner")
    log = SessionEvents(bus, keep=events * 2, keep_s=3600)
    before = resident_mb(gateway_pid) or 0.0
    ready, done = asyncio.Event(), asyncio.Event()
    counts, connected = [0] * clients, [0]
    tasks = []
    for index in range(clients):
        tasks.append(asyncio.create_task(client(url, ready, counts, index, events, done, connected)))
        if index % 50 == 49:
            await asyncio.sleep(0.05)  # the kernel's accept backlog
    await asyncio.wait_for(ready.wait(), 120)
    await asyncio.sleep(2)  # settle
    idle = resident_mb(gateway_pid) or 0.0
    started = time.perf_counter()
    for n in range(events):
        await log.append(SESSION, ChatDelta(session_id=SESSION, message_id="m", text=f"token {n} "))
    appended = time.perf_counter() - started
    await asyncio.wait_for(done.wait(), 600)
    elapsed = time.perf_counter() - started
    busy = resident_mb(gateway_pid) or 0.0
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await bus.close()
    return {"per_conn_kb": (idle - before) * 1024 / clients, "before_mb": before, "idle_mb": idle, "busy_mb": busy,
            "append_per_s": events / appended, "events_per_s": events / elapsed,
            "frames_per_s": events * clients / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--events", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        redis_url = EmbeddedRedis(Path(tmp)).start()
        port = free_port()
        env = {**os.environ, "PINCER_REDIS_URL": redis_url, "PINCER_DATA_DIR": tmp, "PINCER_GATEWAY_PORT": str(port),
               "PINCER_GATEWAY_TOKEN": TOKEN, "PINCER_RUNTIME__LOG_LEVEL": "WARNING",
               "PINCER_GATEWAY__LIMITS__OPEN_STREAMS_PER_TOKEN": str(args.clients + 10), "PYTHONPATH": str(ROOT)}
        gateway = subprocess.Popen([sys.executable, "-m", "gateway", "gateway"], env=env, cwd=ROOT)
        try:
            asyncio.run(wait_listening(port))
            found = asyncio.run(run(args.clients, args.events, f"ws://127.0.0.1:{port}/v1/ws", redis_url,
                                    gateway.pid))
        finally:
            gateway.terminate()
            gateway.wait(30)
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {os.cpu_count()} cpu, Python {platform.python_version()}")
    print(f"{args.clients} clients, {args.events} events: Gateway RSS {found['before_mb']:.0f} MB alone, "
          f"{found['idle_mb']:.0f} MB with the clients idle ({found['per_conn_kb']:.0f} KB each), "
          f"{found['busy_mb']:.0f} MB after the run")
    print(f"appended {found['append_per_s']:.0f} events/s; delivered {found['events_per_s']:.0f} events/s to every "
          f"client = {found['frames_per_s']:.0f} frames/s")


if __name__ == "__main__":
    main()
