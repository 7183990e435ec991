"""Listing one identity's sessions in a pool that holds many: what `GET /v1/sessions` reads.

Seeds a private redis-server with N sessions of 1,000 owners (a transcript of
one entry, an owner and the pool's list, as a release before the owners' lists
left them), then times ``SessionStore.list_sessions(owner=...)`` for one owner
before any catch-up (the pool's list read and filtered), the first catch-up
(memory/session_index.py), and the listing from the owner's own list.

Run: .venv/bin/python bench/session_list.py [--sessions 1000 10000 100000] [--rounds 20]
(``PINCER_TREE=/path/to/worktree`` times that checkout's stores instead)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(os.environ.get("PINCER_TREE") or Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(ROOT))  # PINCER_TREE: time another checkout's code (an earlier commit's worktree)

from bus.redis_server import EmbeddedRedis  # noqa: E402
from bus.settings import RedisSettings  # noqa: E402
from bus.streams import Bus  # noqa: E402
from memory.sessions import SessionStore  # noqa: E402

OWNERS = 1_000


async def seed(bus: Bus, sessions: int) -> None:
    now = time.time()
    for first in range(0, sessions, 1_000):
        async with bus.redis.pipeline(transaction=False) as pipe:
            for n in range(first, min(sessions, first + 1_000)):
                owner = f"person{n % OWNERS}"
                session_id = f"{owner}/chat{n}"
                pipe.rpush(bus.keys.transcript(session_id), b"\x80")
                pipe.set(bus.keys.session_owner(session_id), owner)
                pipe.zadd(bus.keys.sessions, {session_id: now - n})
            await pipe.execute()


async def p50_ms(store: SessionStore, rounds: int) -> tuple[float, int]:
    took, found = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        found = await store.list_sessions(owner="person7")
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000, len(found)


async def one(sessions: int, rounds: int) -> str:
    with tempfile.TemporaryDirectory(prefix="pincer-bench-list-") as tmp:
        redis = EmbeddedRedis(Path(tmp) / "redis")
        bus = Bus.from_settings(RedisSettings(prefix="list:"), redis.start())
        try:
            await seed(bus, sessions)
            store = SessionStore(bus.redis, bus.keys)
            before, listed = await p50_ms(store, rounds)
            if not hasattr(store, "index"):  # a tree from before the owners' lists (--root)
                return f"| {sessions:,} | {listed} | {before:.1f} | | |"
            started = time.perf_counter()
            put = await store.index.catch_up()
            catch_up_s = time.perf_counter() - started
            after, listed_after = await p50_ms(store, rounds)
            assert listed == listed_after, (listed, listed_after)
        finally:
            await bus.redis.aclose()
            redis.stop()
    return (f"| {sessions:,} | {listed} | {before:.1f} | {catch_up_s:.2f} ({put:,}) | {after:.2f} |")


async def main(args: argparse.Namespace) -> None:
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}; {OWNERS:,} owners, p50 of {args.rounds} listings")
    print("| sessions in the pool | one owner's | list before a catch-up (ms) | first catch-up (s, sessions) "
          "| list from the owner's list (ms) |")
    print("|---|---|---|---|---|")
    for sessions in args.sessions:
        print(await one(sessions, args.rounds), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=20)
    asyncio.run(main(parser.parse_args()))
