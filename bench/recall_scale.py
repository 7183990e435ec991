"""Memory search at 10,000 identities: a new Hands worker's memory and its first search.

Every identity keeps 3 notes and a session of 6 messages (90,000 findable
entries), written as the stores write them. Then a fresh process plays a new
worker's index, once with this release's memory/recall.py and once with an
earlier release's (``--old REF``, read with ``git show``): its RSS before and
after, its first search's latency (for the old design also the time to build
the whole index, which its first search would otherwise answer from in part),
and after 200 identities have been searched in turn.

Run: .venv/bin/python bench/recall_scale.py [--people 10000] [--old v0.2.0] [--embeddings]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402

from bus.redis_server import EmbeddedRedis  # noqa: E402
from bus.settings import RedisSettings  # noqa: E402
from bus.streams import Bus  # noqa: E402
from memory.log import note_written, said  # noqa: E402


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def populate(bus: Bus, people: int) -> None:
    now = int(time.time() * 1000)
    for first in range(0, people, 500):
        async with bus.redis.pipeline(transaction=False) as pipe:
            for n in range(first, min(people, first + 500)):
                person, session = f"p{n}", f"p{n}/chat"
                for k in range(3):
                    text = f"{person} keeps item {k} in drawer {n * 7 + k} beside the winter coats"
                    pipe.hset(bus.keys.memory("main", person), f"item-{k}",
                              msgpack.packb({"content": text, "updated": now}))
                    pipe.xadd(bus.keys.memory_log, note_written("main", person, f"item-{k}", text))  # type: ignore[arg-type]
                for m in range(6):
                    text = f"{person} says line {m}: the boat is moored at pier {n}, near the old lighthouse"
                    pipe.rpush(bus.keys.transcript(session), msgpack.packb(
                        {"role": "user" if m % 2 == 0 else "assistant", "content": text, "timestamp": now + m}))
                    pipe.xadd(bus.keys.memory_log, said(session, "user", text, now + m, f"{now}-{m}"))  # type: ignore[arg-type]
                pipe.zadd(bus.keys.sessions, {session: now})
            await pipe.execute()


def load_recall(ref: str | None) -> ModuleType:
    if ref is None:
        from memory import recall
        return recall
    source = subprocess.run(["git", "show", f"{ref}:memory/recall.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_recall.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_recall", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def child(url: str, prefix: str, ref: str | None, people: int, embeddings: bool) -> dict[str, float]:
    recall_module = load_recall(ref)
    bus = Bus.from_settings(RedisSettings(prefix=prefix), url)
    figures = {"rss_start_mb": rss_mb()}
    recall = recall_module.Recall(bus.redis, bus.keys, embeddings=embeddings)
    started = time.perf_counter()
    await recall.search("main", "which drawer is item 2 in", owner=f"p{people // 2}")
    figures["first_search_ms"] = (time.perf_counter() - started) * 1000
    if ref is not None:  # the old design answers its first search from part of the index: the rest, built
        started = time.perf_counter()
        await recall.catch_up()
        figures["whole_index_s"] = time.perf_counter() - started
    figures["rss_after_first_mb"] = rss_mb()
    started = time.perf_counter()
    for n in range(0, people, max(1, people // 200)):
        await recall.search("main", "where is the boat moored", owner=f"p{n}")
    figures["search_200_ms_each"] = (time.perf_counter() - started) * 1000 / 200
    figures["rss_after_200_mb"] = rss_mb()
    figures["chunks_held"] = await recall.size()
    return figures


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="pincer-bench-scale-") as tmp:
        redis = EmbeddedRedis(Path(tmp) / "redis")
        url = redis.start()
        bus = Bus.from_settings(RedisSettings(prefix="scale:"), url)
        try:
            await populate(bus, args.people)
            if importlib.util.find_spec("memory.session_index"):  # the owners' lists, as a Gateway's start builds
                from memory.sessions import SessionStore

                await SessionStore(bus.redis, bus.keys).catch_up()
            results = {}
            for name, ref in (("old " + args.old, args.old), ("this release", None)):
                command = [sys.executable, __file__, "--child", url, "--people", str(args.people)]
                command += ["--ref", ref] if ref else []
                command += ["--embeddings"] if args.embeddings else []
                out = (await asyncio.to_thread(subprocess.run, command, check=True, capture_output=True,
                                               text=True)).stdout
                results[name] = json.loads(out.strip().splitlines()[-1])
        finally:
            redis.stop()
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.node()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}; {args.people:,} identities, {args.people * 9:,} findable entries, "
          f"embeddings {'on' if args.embeddings else 'off'}")
    for name, figures in results.items():
        print(f"{name}: " + ", ".join(f"{k} {v:,.1f}" for k, v in figures.items()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--people", type=int, default=10_000)
    parser.add_argument("--old", default="v0.2.0")
    parser.add_argument("--embeddings", action="store_true")
    parser.add_argument("--child")
    parser.add_argument("--ref")
    parsed = parser.parse_args()
    if parsed.child:
        print(json.dumps(asyncio.run(child(parsed.child, "scale:", parsed.ref, parsed.people, parsed.embeddings))))
    else:
        asyncio.run(main(parsed))
