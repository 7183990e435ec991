"""A worker on another host reaches Redis over TLS: rediss:// end to end, with certificates checked."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from bus.config import RedisSettings
from bus.presence import alive
from bus.protocol import ToolExecute, ToolResult, now_ms
from bus.redis_server import free_port
from bus.replies import ReplyInbox
from bus.streams import Bus
from hands.config import SHIPPED_SKILLS, HandsSettings
from hands.worker import HandsWorker
from tests.conftest import async_wait_until
from tests.redis_topology import Topology

PASSWORD = "tls-test-secret"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture
def tls_redis() -> Iterator[tuple[int, Path]]:
    """redis-server with TLS only (no plain port), a password, and a CA of the test's own."""
    if not shutil.which("redis-server") or not shutil.which("openssl"):
        pytest.fail("redis-server and openssl are needed: .ci/run installs redis-server (openssl comes with it)")
    where = Path(tempfile.mkdtemp(prefix="pincer-tls-"))
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=pincer-test-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=where)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
             "-out", "server.csr", cwd=where)
    (where / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "1", "-extfile", "san.cnf", "-out", "server.crt", cwd=where)
    port = free_port()
    server = subprocess.Popen(
        [shutil.which("redis-server") or "", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(where / "server.crt"), "--tls-key-file", str(where / "server.key"),
         "--tls-ca-cert-file", str(where / "ca.crt"), "--tls-auth-clients", "no", "--requirepass", PASSWORD,
         "--save", "", "--dir", str(where)],
        stdout=(where / "redis.log").open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        Topology.wait(lambda: "Ready to accept connections" in (where / "redis.log").read_text(), "TLS Redis ready")
        yield port, where
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(where, ignore_errors=True)


async def test_a_worker_and_a_caller_over_rediss(tls_redis: tuple[int, Path], tmp_path: Path) -> None:
    port, where = tls_redis
    url = f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={where / 'ca.crt'}"
    settings = RedisSettings(prefix="tls:")
    worker_bus, caller_bus = Bus.from_settings(settings, url), Bus.from_settings(settings, url)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "over-tls.txt").write_text("encrypted on the wire")
    worker = HandsWorker(worker_bus, HandsSettings(workspace=tmp_path / "ws", skill_dirs=[SHIPPED_SKILLS]),
                         worker_id="w-tls", heartbeat_s=0.5)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    inbox = ReplyInbox(caller_bus, "caller-tls", block_ms=200)
    try:
        await async_wait_until(lambda: alive(caller_bus, "hands"), timeout=20, what="the worker over TLS")
        await inbox.start()
        call = ToolExecute(tool="read_file", args={"path": "over-tls.txt"}, reply_to=inbox.stream,
                           deadline=now_ms() + 10_000)
        result = await inbox.request(caller_bus.keys.hands_requests, call, call.call_id, timeout=10,
                                     final=(ToolResult,))
        assert result.success and result.data["content"] == "encrypted on the wire"
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)
        await inbox.close()
        await worker_bus.close()
        await caller_bus.close()


async def test_a_server_certificate_not_from_the_given_ca_is_refused(tls_redis: tuple[int, Path]) -> None:
    port, _ = tls_redis
    other_ca = Path(tempfile.mkdtemp(prefix="pincer-tls-other-"))
    try:
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=someone-else",
                 "-keyout", "ca.key", "-out", "ca.crt", cwd=other_ca)
        bus = Bus.from_settings(RedisSettings(), f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={other_ca}/ca.crt")
        with pytest.raises(RedisConnectionError, match="certificate verify failed"):
            await bus.redis.ping()
        await bus.close()
    finally:
        shutil.rmtree(other_ca, ignore_errors=True)
