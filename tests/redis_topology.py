"""A primary, two replicas and three sentinels on loopback, each a real redis-server process, for failover tests.

Two replicas: after the primary dies one is promoted and the other follows it, so a pool that asks for one
replica's confirmation (``redis.min_replicas: 1``) still gets it. That is the deployment the option needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from redis import Redis

from bus.redis_server import free_port
from bus.settings import RedisSettings
from bus.streams import Bus

if TYPE_CHECKING:
    from bus.replies import ReplyInbox


class Topology:
    MASTER = "pincer-test"

    def __init__(self, where: Path) -> None:
        self.where = where
        self.binary = shutil.which("redis-server") or ""
        self.primary_port = free_port()
        self.replica_ports = [free_port(), free_port()]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def sentinels(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.sentinel_ports]

    def start(self) -> None:
        self._server("primary", self.primary_port)
        for index, port in enumerate(self.replica_ports):
            self._server(f"replica-{index}", port, "--replicaof", "127.0.0.1", str(self.primary_port))
        for index, port in enumerate(self.sentinel_ports):
            conf = self.where / f"sentinel-{index}.conf"
            conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {self.where}\n"
                            f"sentinel monitor {self.MASTER} 127.0.0.1 {self.primary_port} 2\n"
                            f"sentinel down-after-milliseconds {self.MASTER} 1000\n"
                            f"sentinel failover-timeout {self.MASTER} 4000\n")
            self._spawn(f"sentinel-{index}", [self.binary, str(conf), "--sentinel"])
        self.wait(lambda: all(self._replica_in_sync(port) for port in self.replica_ports), "the replicas in sync")
        self.wait(lambda: all(self._sentinel_knows_replica(p) for p in self.sentinel_ports), "the sentinels ready")

    def master_port(self) -> int | None:
        for port in self.sentinel_ports:
            try:
                with Redis(port=port, socket_timeout=1) as sentinel:
                    found = sentinel.sentinel_get_master_addr_by_name(self.MASTER)
                    if found:
                        return int(found[1])
            except Exception:
                continue
        return None

    def promoted(self) -> bool:
        """Whether the sentinels name a replica as the master and the other replica follows it."""
        master = self.master_port()
        if master not in self.replica_ports:
            return False
        (other,) = (port for port in self.replica_ports if port != master)
        with Redis(port=other, socket_timeout=1) as replica:
            info = replica.info("replication")
            return int(info.get("master_port", 0)) == master and info.get("master_link_status") == "up"

    def kill_primary(self) -> None:
        process = self.processes.pop("primary")
        process.kill()  # -9: no shutdown, no last save
        process.wait()

    def stop(self) -> None:
        for process in self.processes.values():
            process.kill()
            process.wait()
        self.processes.clear()

    @staticmethod
    def wait(condition, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except Exception:
                pass
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    def _server(self, name: str, port: int, *extra: str) -> None:
        folder = self.where / name
        folder.mkdir()
        self._spawn(name, [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                           "--appendonly", "no", "--dir", str(folder), *extra])

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.where / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL)

    def _replica_in_sync(self, port: int) -> bool:
        with Redis(port=port, socket_timeout=1) as replica:
            return replica.info("replication").get("master_link_status") == "up"

    def _sentinel_knows_replica(self, port: int) -> bool:
        with Redis(port=port, socket_timeout=1) as sentinel:
            return len(sentinel.sentinel_slaves(self.MASTER)) == len(self.replica_ports)


def make_certificates(where: Path, ip: str) -> None:
    """ca.crt/ca.key and server.crt/server.key (for ``ip``) in ``where``, made with the openssl CLI."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=pincer-test-ca",
            "-keyout", "ca.key", "-out", "ca.crt")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={ip}", "-keyout", "server.key", "-out", "server.csr")
    (where / "san.cnf").write_text(f"subjectAltName=IP:{ip},IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1",
            "-extfile", "san.cnf", "-out", "server.crt")


@contextlib.asynccontextmanager
async def worker_and_caller(settings: RedisSettings, url: str, workspace: Path,
                            name: str) -> AsyncIterator[tuple[Bus, ReplyInbox]]:
    """A Hands worker and a caller, each on its own connection to the given Redis, once the worker is alive."""
    from bus.presence import alive
    from bus.replies import ReplyInbox
    from hands.config import SHIPPED_SKILLS, HandsSettings
    from hands.worker import HandsWorker
    from tests.conftest import async_wait_until

    worker_bus, caller_bus = Bus.from_settings(settings, url), Bus.from_settings(settings, url)
    worker = HandsWorker(worker_bus, HandsSettings(workspace=workspace, skill_dirs=[SHIPPED_SKILLS]),
                         worker_id=f"w-{name}", heartbeat_s=0.5)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    inbox = ReplyInbox(caller_bus, f"caller-{name}", block_ms=200)
    try:
        await async_wait_until(lambda: alive(caller_bus, "hands"), timeout=20, what=f"the worker ({name})")
        await inbox.start()
        yield caller_bus, inbox
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)
        await inbox.close()
        await worker_bus.close()
        await caller_bus.close()
