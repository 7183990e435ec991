"""A Hands worker killed mid-call: another worker takes the call over (or says WORKER_LOST for side effects)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from bus.presence import alive
from bus.protocol import ErrorCode, ToolExecute, ToolResult, now_ms
from bus.redis_client import RedisRefused
from bus.replies import ReplyInbox
from bus.streams import Bus
from tests.conftest import Processes, async_wait_until, make_skill, nothing_pending

pytestmark = pytest.mark.e2e

SLOW = "import time\ndef handle(args, ctx):\n    time.sleep(args['s'])\n    return 'done'\n"


@pytest.fixture
def takeover_env(processes: Processes, pincer_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    skills = tmp_path / "slow-skills"
    make_skill(skills, "slow-ok", "name: slow_ok\ndescription: sleeps\ntimeout: 30\nparameters: {s: {type: number}}",
               SLOW)
    make_skill(skills, "slow-once", "name: slow_once\ndescription: sleeps, with a side effect\ntimeout: 30\n"
               "idempotent: false\nparameters: {s: {type: number}}", SLOW)
    processes.env = {**pincer_env, "PINCER_HANDS__SKILL_DIRS": f'["{skills}"]',
                     "PINCER_REDIS__CLAIM_IDLE_S": "1", "PINCER_REDIS__REAP_INTERVAL_S": "0.3"}
    return processes.env


async def wait_for_workers(bus: Bus, n: int) -> list[str]:
    for _ in range(400):
        workers = await alive(bus, "hands")
        if len(workers) == n:
            return workers
        await asyncio.sleep(0.05)
    raise AssertionError(f"expected {n} Hands workers")


@pytest.mark.parametrize(("tool", "taken_over"), [("slow_ok", True), ("slow_once", False)])
async def test_a_call_survives_its_worker(bus: Bus, processes: Processes, takeover_env: dict[str, str],
                                          tool: str, taken_over: bool) -> None:
    first = processes.start("hands", name="hands-a")
    (worker_a,) = await wait_for_workers(bus, 1)
    inbox = ReplyInbox(bus, "takeover-client", block_ms=100)
    await inbox.start()
    try:
        call = ToolExecute(tool=tool, args={"s": 1.5}, reply_to=inbox.stream, deadline=now_ms() + 60_000)
        async with inbox.expect(call.call_id) as answers:
            await bus.publish(bus.keys.hands_requests, call)

            async def worker_a_runs_it() -> bool:  # facts, not a pause: A holds the entry, and has started it
                try:
                    pending = await bus.redis.xpending_range(bus.keys.hands_requests, "hands", min="-", max="+",
                                                             count=10)
                except RedisRefused:  # alive before its group is made: the worker makes it as it opens its lanes
                    return False
                holds = any(p["consumer"].decode() == worker_a for p in pending)
                return holds and (taken_over or bool(await bus.redis.exists(bus.keys.call_record(call.call_id))))

            await async_wait_until(worker_a_runs_it, timeout=20, what="worker A to take the call and start it")
            processes.stop(first, signal.SIGKILL)
            await bus.redis.zrem(bus.keys.alive("hands"), worker_a)  # gone now, not after its heartbeat expires
            processes.start("hands", name="hands-b")
            result = await asyncio.wait_for(answers.get(), 30)
        assert isinstance(result, ToolResult) and result.metadata.worker_id not in ("", worker_a)
        if taken_over:
            assert result.success and result.data == "done"
        else:
            assert result.error.code is ErrorCode.WORKER_LOST and "not run again" in result.error.message
        await nothing_pending(bus, bus.keys.hands_requests, "hands")  # answered and acknowledged
    finally:
        await inbox.close()
