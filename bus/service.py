"""Running one Pincer process: identity, config, Redis, signals and a clean exit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from bus import heap, otel, schema
from bus.config import EX_CONFIG, Config, ConfigError, RedisUnreachable, load_config
from bus.log import setup_logging
from bus.streams import Bus

log = logging.getLogger("bus.service")

Body = Callable[[Bus, asyncio.Event], Awaitable[None]]
T = TypeVar("T")


def new_instance_id(role: str) -> str:
    host = socket.gethostname().split(".")[0][:20]
    return f"{role}-{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def redis_url(config: Config) -> str:
    """The configured Redis, else the embedded one a local ``pincer up`` announced (with sentinels
    configured, a name for them: ``Bus.from_settings`` asks them for the master)."""
    if config.redis.sentinels:
        return f"sentinel://{config.redis.sentinel_master}@{','.join(config.redis.sentinels)}"
    if config.redis.url:
        return config.redis.url
    url_file = Path(config.runtime.data_dir).expanduser() / "redis.url"
    if url_file.is_file():
        return url_file.read_text().strip()
    raise ConfigError(
        "no Redis to connect to: set redis.url (or PINCER_REDIS_URL), or start `pincer up` on this machine "
        f"so its embedded Redis is announced in {url_file}"
    )


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop where it is installed (a faster event loop: fewer µs per message)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def run_service(role: str, config: Config, body: Body, *, instance_id: str | None = None) -> int:
    """Run ``body`` until SIGTERM/SIGINT (or until it returns); 0 on a clean exit."""
    instance_id = instance_id or new_instance_id(role)
    heap.settle()  # a long-lived process: its transient peaks' pages go back when freed, not kept at the top
    setup_logging(role, instance_id, config.runtime.log_level, fmt=config.runtime.log_format)
    otel.setup(role, config.runtime)
    try:
        return run_loop(_serve(config, body))
    except ConfigError as exc:
        log.error("%s", exc)
        return EX_CONFIG
    except RedisUnreachable as exc:
        log.error("%s", exc)
        return 1
    except schema.SchemaTooNew as exc:  # restarting cannot help: say so once and stay down
        log.error("%s", exc)
        return EX_CONFIG


async def _serve(config: Config, body: Body) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bus = Bus.from_settings(config.redis, redis_url(config))
    try:
        await _wait_for_redis(bus, stop)
        await schema.ensure_current(bus)
        await body(bus, stop)
    finally:
        with contextlib.suppress(Exception):
            await bus.close()
    return 0


async def _wait_for_redis(bus: Bus, stop: asyncio.Event, *, attempts: int = 50) -> None:
    for attempt in range(attempts):
        try:
            await bus.redis.ping()
            return
        except Exception as exc:  # connection refused, auth, DNS: all mean "not yet"
            if stop.is_set() or attempt == attempts - 1:
                raise RedisUnreachable(f"cannot reach Redis: {exc}") from None
            await asyncio.sleep(0.2)


def start_role(role: str, main: Callable[[Config], int]) -> int:
    """``python -m <role>``: one role as a process of its own (so ``ps`` says what runs), configured from
    ``PINCER_CONFIG`` and the environment as ``pincer up`` hands them down; a bad configuration exits 78."""
    try:
        return main(load_config())
    except ConfigError as exc:
        print(f"{role}: error: {exc}", file=sys.stderr)
        return EX_CONFIG
    except KeyboardInterrupt:
        return 130
