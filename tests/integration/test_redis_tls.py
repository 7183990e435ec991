"""A worker on another host reaches Redis over TLS: rediss:// end to end, with certificates checked."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from bus.protocol import ToolExecute, ToolResult, now_ms
from bus.redis_server import free_port
from bus.settings import RedisSettings
from bus.streams import Bus
from tests.redis_topology import Topology, make_certificates, worker_and_caller

PASSWORD = "tls-test-secret"


@pytest.fixture
def tls_redis() -> Iterator[tuple[int, Path]]:
    """redis-server with TLS only (no plain port), a password, and a CA of the test's own."""
    if not shutil.which("redis-server") or not shutil.which("openssl"):
        pytest.fail("redis-server and openssl are needed: .ci/run installs redis-server (openssl comes with it)")
    where = Path(tempfile.mkdtemp(prefix="pincer-tls-"))
    make_certificates(where, "127.0.0.1")
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
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "over-tls.txt").write_text("encrypted on the wire")
    async with worker_and_caller(RedisSettings(prefix="tls:"), url, tmp_path / "ws", "tls") as (bus, inbox):
        call = ToolExecute(tool="read_file", args={"path": "over-tls.txt"}, reply_to=inbox.stream,
                           deadline=now_ms() + 10_000)
        result = await inbox.request(bus.keys.hands_requests, call, call.call_id, timeout=10, final=(ToolResult,))
    assert result.success and result.data["content"] == "encrypted on the wire"


async def test_a_server_certificate_not_from_the_given_ca_is_refused(tls_redis: tuple[int, Path]) -> None:
    port, _ = tls_redis
    other_ca = Path(tempfile.mkdtemp(prefix="pincer-tls-other-"))
    try:
        make_certificates(other_ca, "127.0.0.1")  # a CA of its own: not the one that signed the server's
        bus = Bus.from_settings(RedisSettings(), f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={other_ca}/ca.crt")
        with pytest.raises(RedisConnectionError, match="certificate verify failed"):
            await bus.redis.ping()
        await bus.close()
    finally:
        shutil.rmtree(other_ca, ignore_errors=True)


def test_up_listens_beyond_loopback_only_with_tls(tmp_path: Path) -> None:
    import os
    import sys

    env = {**os.environ, "PINCER_DATA_DIR": str(tmp_path), "PINCER_REDIS_URL": ""}
    refused = subprocess.run([sys.executable, "-m", "gateway", "up", "--listen", "127.0.0.2"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 78, refused.stderr
    assert "only over TLS: set redis.tls_cert_file and redis.tls_key_file" in refused.stderr


def test_the_embedded_redis_on_another_address_is_tls_only_with_a_lasting_password(tmp_path: Path) -> None:
    import redis

    from bus.redis_server import EmbeddedRedis

    certs = tmp_path / "certs"
    certs.mkdir()
    make_certificates(certs, "127.0.0.2")
    first = EmbeddedRedis(tmp_path / "data", listen="127.0.0.2", tls=(certs / "server.crt", certs / "server.key"))
    first.start()
    try:
        with redis.Redis.from_url(first.url) as local:  # this machine's processes: TLS on loopback
            assert local.ping()
        remote_url = first.remote_url.replace("CA_FILE", str(certs / "ca.crt"))
        with redis.Redis.from_url(remote_url.replace("127.0.0.1", "127.0.0.2")) as remote:
            assert remote.set("from-elsewhere", "1")
        with pytest.raises(redis.exceptions.ConnectionError), \
                redis.Redis(host="127.0.0.2", port=first.port, password=first.password, socket_timeout=2) as plain:
            plain.ping()  # no plain port on any address
        with pytest.raises(redis.exceptions.AuthenticationError), redis.Redis.from_url(
                remote_url.replace(first.password, "wrong")) as guessing:
            guessing.ping()
    finally:
        first.stop()
    again = EmbeddedRedis(tmp_path / "data", listen="127.0.0.2", tls=(certs / "server.crt", certs / "server.key"))
    assert again.password == first.password  # workers elsewhere keep it in their config
