"""A day of a team's traffic, compressed: every process's memory and Redis's must stay flat after warm-up.

A private redis-server, the tests' scripted model in its own process, and real `pincer gateway`, `brain` and
`hands` processes. ``--people`` identities (a chat token each) take turns through the Gateway's HTTP API for
``--minutes``: plain chat, a memory note written, a memory search, a file read, each conversation
``--session-turns`` long before the person starts a new one; each person also keeps a job that fires every
minute. Retention is set short (``--keep-s``: the memory log's reach, a quiet session's event log, how
long a session stays in Redis before it is archived, and its flight record), so a day's turnover happens
in the run. Every ``--sample-s`` the bench reads each process's RSS from /proc and Redis's used_memory,
the memory log's length and the sessions kept; it prints the samples and compares the end with half time
(past the retention horizon, what is kept stops growing). At the end each person searches for a note
written in the last minutes: retention must keep what it promises.

Run: .venv/bin/python bench/soak.py [--people 50] [--minutes 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway_turns import ScriptedModel, start_stack, stop_stack, wait_healthy  # noqa: E402
from bus.redis_server import EmbeddedRedis  # noqa: E402
from bus.settings import RedisSettings  # noqa: E402
from bus.streams import Bus  # noqa: E402
from gateway.tokens import TokenStore  # noqa: E402


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def tokens(bus: Bus, people: int) -> dict[str, str]:
    store = TokenStore(bus.redis, bus.keys)
    return {f"p{n}": await store.create(f"p{n}") for n in range(people)}


def turn_text(person: str, n: int, rng: random.Random) -> str:
    kind = n % 4
    if kind == 1:
        note = f"{person} parked at level {n} near gate {rng.randint(1, 99)}"
        return f'CALL memory_write {{"key": "fact-{n % 20}", "content": "{note}"}}'
    if kind == 2:
        return 'CALL memory_search {"query": "where did I park"}'
    if kind == 3:
        return 'CALL read_file {"path": "notes.txt"}'
    return f"hello, this is {person}'s turn {n}: " + " ".join(rng.choice(WORDS) for _ in range(40))


WORDS = ["the", "boat", "harbour", "winter", "coat", "lamp", "garden", "tulip", "river", "stone", "bread",
         "market", "train", "ticket", "station"]


async def person(client: httpx.AsyncClient, name: str, token: str, stop_at: float, args: argparse.Namespace,
                 counts: defaultdict[str, int]) -> None:
    rng = random.Random(name)
    headers = {"Authorization": f"Bearer {token}"}
    await client.post("/v1/cron", headers=headers, json={"name": "tick", "every": "60s", "message": "tick"})
    n = 0
    while time.monotonic() < stop_at:
        session = f"{name}-{n // args.session_turns}"
        reply = await client.post(f"/v1/sessions/{session}/messages", headers=headers,
                                  json={"text": turn_text(name, n, rng)})
        counts["ok" if reply.status_code == 200 else f"http {reply.status_code}"] += 1
        n += 1
        await asyncio.sleep(args.pause_s * rng.uniform(0.5, 1.5))


async def sample(bus: Bus, pids: dict[str, int]) -> dict[str, float]:
    info = await bus.redis.info("memory")
    row = {name: rss_mb(pid) for name, pid in pids.items()}
    row["redis used"] = int(info["used_memory"]) / 1024 / 1024
    row["memory log"] = float(await bus.redis.xlen(bus.keys.memory_log))
    row["sessions"] = float(await bus.redis.zcard(bus.keys.sessions))
    return row


async def drive(url: str, redis_url: str, pids: dict[str, int], args: argparse.Namespace) -> list[dict[str, float]]:
    bus = Bus.from_settings(RedisSettings(), redis_url)
    people = await tokens(bus, args.people)
    counts: defaultdict[str, int] = defaultdict(int)
    stop_at = time.monotonic() + args.minutes * 60
    samples: list[dict[str, float]] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        talkers = [asyncio.create_task(person(client, name, token, stop_at, args, counts))
                   for name, token in people.items()]
        started = time.monotonic()
        while time.monotonic() < stop_at:
            row = await sample(bus, pids)
            row["minute"] = (time.monotonic() - started) / 60
            row["turns"] = float(counts["ok"])
            samples.append(row)
            print(" ".join(f"{k} {v:,.1f}" for k, v in row.items()), flush=True)
            await asyncio.sleep(args.sample_s)
        await asyncio.gather(*talkers)
        found = 0
        for name, token in people.items():
            reply = await client.post(f"/v1/sessions/{name}-final/messages",
                                      headers={"Authorization": f"Bearer {token}"},
                                      json={"text": 'CALL memory_search {"query": "where did I park level"}'})
            found += "parked at level" in reply.text
    print(f"turns {dict(counts)}; final searches finding the person's note: {found}/{len(people)}")
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--people", type=int, default=50)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--session-turns", type=int, default=12)
    parser.add_argument("--pause-s", type=float, default=1.0, help="each person's pause between turns")
    parser.add_argument("--keep-s", type=int, default=600)
    parser.add_argument("--sample-s", type=float, default=30)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pincer-bench-soak-"))
    redis = EmbeddedRedis(tmp / "redis-data")
    llm = ScriptedModel()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        redis_url = redis.start()
        days = str(args.keep_s / 86_400)
        short = {"PINCER_HANDS__RECALL__LOG_KEEP_S": str(args.keep_s),
                 "PINCER_GATEWAY__EVENTS__KEEP_S": str(args.keep_s),
                 "PINCER_RUNTIME__RETENTION__TRANSCRIPT_DAYS": days,
                 "PINCER_RUNTIME__RETENTION__INTERVAL_S": "60",
                 "PINCER_BRAIN__RECORD__KEEP_DAYS": days}
        env, procs = start_stack(tmp, redis_url, llm, short)
        url = f"http://127.0.0.1:{env['PINCER_GATEWAY_PORT']}"
        wait_healthy(url)
        pids = {"gateway": procs[0].pid, "brain": procs[1].pid, "hands": procs[2].pid}
        samples = asyncio.run(drive(url, redis_url, pids, args))
    finally:
        stop_stack(procs, llm, redis)
    warm = samples[len(samples) // 2]  # past the retention horizon: what is kept has stopped growing
    end = samples[-1]
    print(f"\n{platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()} · "
          f"{time.strftime('%Y-%m-%d')} · {args.people} people, {args.minutes:g} min, keep {args.keep_s} s\n")
    print("| | at half time | end | change |\n|---|---|---|---|")
    for key in ("gateway", "brain", "hands", "redis used", "memory log", "sessions", "turns"):
        before, after = warm[key], end[key]
        change = f"{(after - before) / before:+.0%}" if before else "n/a"
        print(f"| {key} | {before:,.1f} | {after:,.1f} | {change} |")




if __name__ == "__main__":
    main()
