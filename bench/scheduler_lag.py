"""How late jobs fire: ``--jobs`` jobs every ``--every`` seconds for ``--seconds``, on ``--brains`` Brains
(in-process, their schedulers competing for the lease, an instant model answering each turn: all in one
process, so the turns compete with the scheduler for its CPU), or with ``--scheduler-only`` the schedulers
alone, against a private redis-server. The lag of a run is its record's ``fired_at - due`` (the turn
sent to the Brains); reported as p50, p99 and max, with how many instants were recorded, how many fired,
and how many were sent twice (must be 0).
Run: .venv/bin/python bench/scheduler_lag.py --jobs 200 --every 2 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from brain.config import BrainSettings, SchedulerSettings  # noqa: E402
from brain.llm import Completion  # noqa: E402
from brain.scheduler import Scheduler  # noqa: E402
from brain.testing import FunctionModel  # noqa: E402
from brain.worker import BrainWorker  # noqa: E402
from bus.codec import decode  # noqa: E402
from bus.metrics import Meter  # noqa: E402
from bus.protocol import ChatMessage  # noqa: E402
from bus.redis_server import EmbeddedRedis  # noqa: E402
from bus.settings import RedisSettings  # noqa: E402
from bus.streams import Bus  # noqa: E402
from hands.config import HandsSettings  # noqa: E402
from hands.worker import HandsWorker  # noqa: E402
from memory.jobs import Job, JobStore  # noqa: E402
from memory.schedule import Schedule  # noqa: E402


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="pincer-bench-sched-")))
    url = server.start()
    bus = Bus.from_settings(RedisSettings(prefix="bench:"), url)
    settings = BrainSettings(model="fake/instant", tools_list_timeout_s=5.0,
                             scheduler=SchedulerSettings(tick_s=args.tick))
    stop = asyncio.Event()
    workers: list[Any]
    if args.scheduler_only:  # the schedulers alone, their turns left unread: what firing costs by itself
        workers = [Scheduler(bus, settings.scheduler, instance_id=f"brain-{n}", meter=Meter())
                   for n in range(args.brains)]
    else:
        workers = [HandsWorker(bus, HandsSettings(workspace=Path(tempfile.mkdtemp())), worker_id="hands-b")]
        workers += [BrainWorker(bus, settings, instance_id=f"brain-{n}", heartbeat_s=1.0,
                                llm=FunctionModel(lambda _m, _t: Completion(text="ok"))) for n in range(args.brains)]
    tasks = [asyncio.create_task(w.run(stop)) for w in workers]
    store = JobStore(bus)
    start = time.time() + 2
    jobs = [Job(name=f"j{n}", owner="owner", message="tick",
                schedule=Schedule(kind="every", every_s=args.every, anchor=start + n * args.every / args.jobs))
            for n in range(args.jobs)]
    for job in jobs:
        await store.add(job)
    await asyncio.sleep(args.seconds + 2)
    for job in jobs:
        await store.set_paused(job, True)
    await asyncio.sleep(3)  # the last turns answered
    stop.set()
    await asyncio.gather(*tasks)
    lags, records, fired = [], 0, 0
    for job in jobs:
        runs = await store.runs(job.id, limit=500)
        records += len(runs)
        for record in runs:
            if record.status == "fired" and record.fired_at:
                fired += 1
                lags.append(record.fired_at - record.due)
    sent = [m for _, f in await bus.redis.xrange(bus.keys.brain_inbox) if isinstance(m := decode(f), ChatMessage)]
    twice = len(sent) - len({m.message_id for m in sent})
    await bus.redis.aclose()
    server.stop()
    return {"scheduler_only": args.scheduler_only,
            "jobs": args.jobs, "every_s": args.every, "seconds": args.seconds, "brains": args.brains,
            "tick_s": args.tick, "records": records, "fired": fired, "sent_twice": twice,
            "lag_p50_ms": round(quantile(lags, 0.5) * 1000, 1), "lag_p99_ms": round(quantile(lags, 0.99) * 1000, 1),
            "lag_max_ms": round(max(lags, default=0) * 1000, 1), "python": platform.python_version(),
            "machine": f"{platform.machine()}, {platform.node()}", "date": time.strftime("%Y-%m-%d")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--brains", type=int, default=2)
    parser.add_argument("--tick", type=float, default=1.0)
    parser.add_argument("--scheduler-only", action="store_true", help="no Brains running the turns")
    print(json.dumps(asyncio.run(run(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
