"""What a delegation costs a turn, and how many sub-agents the pool runs per second with 1, 2 and 4 Brains.

A private redis-server, one `pincer hands` process, N `pincer brain` processes
and the tests' scripted OpenAI-compatible model in a process of its own (it
answers at once; litellm's or the openai SDK's real HTTP path runs). The bench
sends chat messages onto the bus as a Gateway would and waits for the answers.

- Sequential p50 of three turns (alternating rounds): a plain one (1 model
  call), one with a `list_directory` call (2 model calls and the tool), and one
  with a `delegate` call whose sub-agent answers at once (2 model calls, and the
  sub-agent's turn of 1 model call). What a delegation adds in place of a tool
  call is ``delegate - tool``; a plain turn's time of that is the sub-agent's
  own turn, the rest is the delegation's bookkeeping.
- Throughput: P parent turns at once, each delegating 4 tasks in one response;
  sub-agents finished per second, for each Brain count. ``--child-sleep S``
  makes each sub-agent's model take S seconds (a real provider's latency).

Run: .venv/bin/python bench/delegation.py [--brains 1,2,4] [--parents 25] [--child-sleep 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway_turns import ScriptedModel  # noqa: E402
from bus.presence import alive  # noqa: E402
from bus.protocol import ChatError, ChatMessage, ChatReply  # noqa: E402
from bus.redis_server import EmbeddedRedis  # noqa: E402
from bus.replies import ReplyInbox  # noqa: E402
from bus.settings import RedisSettings  # noqa: E402
from bus.streams import Bus  # noqa: E402

KINDS = {"plain": "hello", "tool": "CALL list_directory {}", "delegate": "CALL delegate " + json.dumps({"task": "hi"})}


class Pool:
    """Hands and N Brains on one Redis, killed at the end."""

    def __init__(self, tmp: Path, redis_url: str, llm: ScriptedModel) -> None:
        self.tmp, self.procs = tmp, []
        (tmp / "workspace").mkdir(exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PINCER_")}
        self.env.update({
            "PINCER_REDIS_URL": redis_url, "PINCER_MODEL": "openai/scripted", "PINCER_LLM_API_BASE": llm.api_base,
            "PINCER_LLM_API_KEY": "sk-scripted", "PINCER_BRAIN__LLM_RETRIES": "0",
            "PINCER_WORKSPACE": str(tmp / "workspace"), "PINCER_DATA_DIR": str(tmp / "data"),
            "PINCER_RUNTIME__LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT),
            "PINCER_BRAIN__MAX_WAITING": "256",  # brain.max_turns as shipped: its bound is what is measured
            "PINCER_BRAIN__DELEGATION__MAX_CHILDREN": "8",
        })

    def start(self, role: str) -> None:
        self.procs.append(subprocess.Popen([sys.executable, "-m", "gateway", role], env=self.env, cwd=self.tmp,
                                           stdout=subprocess.DEVNULL,
                                           stderr=(self.tmp / f"{role}-{len(self.procs)}.log").open("wb")))

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(20)
        self.procs.clear()


async def until_alive(bus: Bus, role: str, n: int) -> None:
    for _ in range(1200):
        if len(await alive(bus, role)) == n:
            return
        await asyncio.sleep(0.05)
    raise SystemExit(f"{n} {role} did not come up")


async def turn(bus: Bus, inbox: ReplyInbox, session: str, text: str) -> float:
    message = ChatMessage(session_id=session, sender="bench", text=text, reply_to=inbox.stream)
    started = time.perf_counter()
    async with inbox.expect(message.message_id) as queue:
        await bus.publish(bus.keys.brain_inbox, message)
        while not isinstance(event := await queue.get(), (ChatReply, ChatError)):
            pass
    if isinstance(event, ChatError):
        raise SystemExit(f"turn failed: {event.code}: {event.message}")
    return (time.perf_counter() - started) * 1000


async def sequential(bus: Bus, inbox: ReplyInbox, rounds: int, per_round: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for kind, text in KINDS.items():  # warm up: imports, connections, tool lists
        await turn(bus, inbox, f"warm-{kind}", text)
    for round_ in range(rounds):
        for kind, text in KINDS.items():
            for i in range(per_round):
                times[kind].append(await turn(bus, inbox, f"seq-{kind}-{round_}-{i}", text))
    return {k: statistics.median(v) for k, v in times.items()}


async def throughput(bus: Bus, inbox: ReplyInbox, parents: int, child_sleep: float, tag: str) -> float:
    task = f"SLEEP {child_sleep}" if child_sleep else "hi"
    text = "\n".join("CALL delegate " + json.dumps({"task": f"{task}\n(part {n})"}) for n in range(4))
    started = time.perf_counter()
    await asyncio.gather(*(turn(bus, inbox, f"tp-{tag}-{p}", text) for p in range(parents)))
    return parents * 4 / (time.perf_counter() - started)


async def main(args: argparse.Namespace) -> None:
    counts = [int(n) for n in args.brains.split(",")]
    with tempfile.TemporaryDirectory(prefix="pincer-bench-deleg-") as tmp:
        redis = EmbeddedRedis(Path(tmp) / "redis")
        url = redis.start()
        llm = ScriptedModel()
        bus = Bus.from_settings(RedisSettings(), url)
        inbox = ReplyInbox(bus, "bench-client", block_ms=1000)
        await inbox.start()
        pool = Pool(Path(tmp), url, llm)
        rows = []
        try:
            pool.start("hands")
            await until_alive(bus, "hands", 1)
            for n in counts:
                for _ in range(n):
                    pool.start("brain")
                await until_alive(bus, "brain", n)
                seq = await sequential(bus, inbox, args.rounds, args.per_round) if n == counts[0] else {}
                await throughput(bus, inbox, 4, args.child_sleep, f"warm{n}")
                rate = statistics.median([await throughput(bus, inbox, args.parents, args.child_sleep, f"{n}-{r}")
                                          for r in range(3)])
                rows.append((n, seq, rate))
                for proc in pool.procs[1:]:
                    proc.terminate()
                    proc.wait(20)
                pool.procs = pool.procs[:1]
                await until_alive(bus, "brain", 0)
        finally:
            pool.stop()
            await inbox.close()
            llm.stop()
            redis.stop()
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.node()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    for n, seq, rate in rows:
        if seq:
            print(f"sequential p50 ({args.rounds}x{args.per_round} each): plain {seq['plain']:.1f} ms, "
                  f"tool {seq['tool']:.1f} ms, delegate {seq['delegate']:.1f} ms; delegate - tool = "
                  f"{seq['delegate'] - seq['tool']:.1f} ms, of which a plain turn {seq['plain']:.1f} ms")
        print(f"{n} Brain(s): {rate:.0f} sub-agents/s ({args.parents} parents x 4, child sleep {args.child_sleep:g}s,"
              " median of 3)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brains", default="1,2,4")
    parser.add_argument("--parents", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--child-sleep", type=float, default=0.0)
    asyncio.run(main(parser.parse_args()))
