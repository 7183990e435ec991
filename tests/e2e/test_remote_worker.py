"""A Hands worker on another host: a network namespace made by the test, reaching the pool's Redis over TLS."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bus.presence import instances
from bus.protocol import ToolExecute, ToolResult, now_ms
from bus.redis_server import EmbeddedRedis
from bus.replies import ReplyInbox
from bus.settings import RedisSettings
from bus.streams import Bus
from hands.config import HandsSettings
from hands.worker import HandsWorker
from tests.conftest import ROOT, async_wait_until
from tests.redis_topology import make_certificates

pytestmark = pytest.mark.e2e

NAP_SKILLS = ROOT / "bench" / "skills"


@dataclass(frozen=True)
class Host:
    namespace: str
    pool_address: str  # this host's end of the link: where the pool's Redis listens
    address: str  # the other host's


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def other_host() -> Iterator[Host]:
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("a second host needs root and iproute2 (`ip netns`): not available on this machine")
    tag = uuid.uuid4().hex[:6]
    subnet = 100 + int(tag[:2], 16) % 100
    host = Host(f"pincer-{tag}", f"10.{subnet}.77.1", f"10.{subnet}.77.2")
    _ip("netns", "add", host.namespace)
    try:
        _ip("link", "add", f"pv{tag}", "type", "veth", "peer", "name", f"pw{tag}")
        _ip("link", "set", f"pw{tag}", "netns", host.namespace)
        _ip("addr", "add", f"{host.pool_address}/24", "dev", f"pv{tag}")
        _ip("link", "set", f"pv{tag}", "up")
        for step in (["addr", "add", f"{host.address}/24", "dev", f"pw{tag}"], ["link", "set", f"pw{tag}", "up"],
                     ["link", "set", "lo", "up"]):
            _ip("netns", "exec", host.namespace, "ip", *step)
        yield host
    finally:
        subprocess.run(["ip", "link", "del", f"pv{tag}"], capture_output=True)
        subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)


def start_in(host: Host, pincer_args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``pincer ARGS`` on the other host (in its network namespace), in a process group of its own."""
    with log.open("wb") as out:
        return subprocess.Popen(["ip", "netns", "exec", host.namespace, sys.executable, "-m", "gateway",
                                 *pincer_args], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


async def test_a_worker_on_another_host_joins_takes_work_and_hands_it_back(other_host: Host) -> None:
    where = Path(tempfile.mkdtemp(prefix="pincer-remote-"))
    certs = where / "certs"
    certs.mkdir()
    make_certificates(certs, other_host.pool_address)
    redis_server = EmbeddedRedis(where / "pool", listen=other_host.pool_address,
                                 tls=(certs / "server.crt", certs / "server.key"))
    local_url = redis_server.start()
    remote_url = (redis_server.remote_url or "").replace("CA_FILE", str(certs / "ca.crt"))
    settings = RedisSettings(claim_idle_s=1, reap_interval_s=0.5)
    bus = Bus.from_settings(settings, local_url)
    inbox = ReplyInbox(bus, "caller-remote", block_ms=200)
    await inbox.start()
    (where / "remote-ws").mkdir()
    env = {**os.environ, "PINCER_DATA_DIR": str(where / "remote"), "PINCER_WORKSPACE": str(where / "remote-ws"),
           "PINCER_HANDS__SKILL_DIRS": f'["{NAP_SKILLS}"]', "PINCER_REDIS__DRAIN_TIMEOUT_S": "1",
           "PINCER_REDIS__CLAIM_IDLE_S": "1", "PINCER_RUNTIME__HEARTBEAT_S": "0.5", "PYTHONPATH": str(ROOT)}
    remote = start_in(other_host, ["hands", "--redis", remote_url], env, where / "remote.log")
    local_stop = asyncio.Event()
    local_task = None
    try:
        joined = await async_wait_until(lambda: instances(bus, "hands"), timeout=60,
                                        what="the worker on the other host in the pool")
        remote_id = joined[0]["id"]

        async def nap(seconds: float) -> ToolResult:
            call = ToolExecute(tool="nap", args={"s": seconds}, reply_to=inbox.stream, deadline=now_ms() + 60_000)
            result = await inbox.request(bus.keys.hands_requests, call, call.call_id, timeout=60, final=(ToolResult,))
            assert isinstance(result, ToolResult)
            return result

        quick = await nap(0.1)
        assert quick.success and quick.metadata.worker_id == remote_id  # it took work over the link

        long = asyncio.create_task(nap(6))

        async def remote_runs_it() -> bool:
            pending = await bus.redis.xpending_range(bus.keys.hands_requests, "hands", min="-", max="+", count=10)
            return any(p["consumer"].decode() == remote_id for p in pending)
        await async_wait_until(remote_runs_it, timeout=20, what="the long call pending on the other host")
        os.killpg(remote.pid, signal.SIGTERM)
        assert await asyncio.to_thread(remote.wait, 30) == 0  # drained: it stopped on its own, in time
        (where / "local-ws").mkdir()
        local = HandsWorker(bus, HandsSettings(workspace=where / "local-ws", skill_dirs=[NAP_SKILLS]),
                            worker_id="local-after", heartbeat_s=0.5)
        local_task = asyncio.create_task(local.run(local_stop))
        handed = await asyncio.wait_for(long, 60)
        assert handed.success and handed.metadata.worker_id == "local-after"  # handed back, taken here
    finally:
        if remote.poll() is None:
            os.killpg(remote.pid, signal.SIGKILL)
            remote.wait()
        local_stop.set()
        if local_task is not None:
            await asyncio.wait_for(local_task, 30)
        await inbox.close()
        await bus.close()
        redis_server.stop()
        shutil.rmtree(where, ignore_errors=True)
