"""Redis fails over under a running pool: a primary killed -9, a replica promoted by three sentinels."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from bus.config import RedisSettings
from bus.protocol import ErrorCode, ToolExecute, ToolResult, now_ms
from bus.replies import ReplyInbox
from bus.streams import CONNECTION_ERRORS, Bus
from tests.conftest import async_wait_until
from tests.redis_topology import Topology, worker_and_caller

CALL_S = 8.0  # each call's deadline: past it a worker answers TIMEOUT without running it
# How long a caller waits for any answer. A failover (~1 s to notice, then an election) plus re-sends
# with backoff, each held by WAIT's own timeout under min_replicas, can take longer than the deadline:
# an answer that comes late is not a lost call; one that never comes is.
PATIENCE_S = 45.0


@pytest.fixture
def topology() -> Iterator[Topology]:
    if not shutil.which("redis-server"):
        pytest.fail("redis-server is not installed: .ci/run installs it (apt-get install redis-server)")
    where = Path(tempfile.mkdtemp(prefix="pincer-failover-"))
    found = Topology(where)
    found.start()
    yield found
    found.stop()
    shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize("min_replicas", [0, 1])
async def test_the_pool_carries_on_after_a_failover(topology: Topology, tmp_path: Path, min_replicas: int) -> None:
    """Without WAIT, what the primary had not yet replicated may be lost (counted, and each such call
    still ends at its deadline); with redis.min_replicas: 1 no acknowledged write is."""
    settings = RedisSettings(sentinels=topology.sentinels, sentinel_master=Topology.MASTER, prefix="failover:",
                             claim_idle_s=2, reap_interval_s=0.5, min_replicas=min_replicas)
    (tmp_path / "ws").mkdir()
    async with worker_and_caller(settings, "", tmp_path / "ws", "failover") as (bus, inbox):
        outcomes = await _fail_over_under_load(topology, bus, inbox)
    if min_replicas:
        assert outcomes["lost"] == 0, outcomes  # every write counted as sent was on the replica


async def _fail_over_under_load(topology: Topology, caller_bus: Bus, inbox: ReplyInbox) -> Counter[str]:
    outcomes: Counter[str] = Counter()

    async def one_call(n: int) -> str:
        call = ToolExecute(tool="list_directory", args={"path": "."}, reply_to=inbox.stream,
                           deadline=now_ms() + int(CALL_S * 1000), session_id=f"s{n % 4}")
        try:
            result = await inbox.request(caller_bus.keys.hands_requests, call, call.call_id, timeout=PATIENCE_S,
                                         final=(ToolResult,))
        except (TimeoutError, *CONNECTION_ERRORS):
            return "lost"  # the request or its answer was in the primary's last unreplicated moment
        assert isinstance(result, ToolResult)
        return "ok" if result.success else result.error.code.value

    before = [await one_call(n) for n in range(20)]
    assert before == ["ok"] * 20
    calls = [asyncio.create_task(one_call(n)) for n in range(60)]
    await asyncio.sleep(0)  # they are on their way
    topology.kill_primary()
    outcomes.update(await asyncio.gather(*calls))  # every one ends: result, WORKER_LOST, TIMEOUT or lost
    assert sum(outcomes.values()) == 60
    assert set(outcomes) <= {"ok", ErrorCode.WORKER_LOST.value, ErrorCode.TIMEOUT.value, "lost"}, outcomes
    await async_wait_until(lambda: topology.master_port() == topology.replica_port, timeout=30,
                           what="the sentinels to promote the replica")
    after: list[str] = []

    async def settled() -> bool:
        after.append(await one_call(len(after)))
        return after[-5:] == ["ok"] * 5
    await async_wait_until(settled, timeout=60, what="calls succeeding against the new primary")
    print(f"failover: {dict(outcomes)} of 60 calls in flight; {len(after) - 5} calls before the pool settled")
    return outcomes
