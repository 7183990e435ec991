"""``pincer gateway``: serve the HTTP API until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import uvicorn

from bus.config import Config, ConfigError
from bus.service import new_instance_id, run_service
from bus.streams import Bus
from gateway.channels.config import enabled_names
from gateway.config import GatewaySettings
from gateway.server.app import Gateway
from gateway.server.live import MAX_SOCKET_MESSAGE
from memory.archive import SessionArchive
from memory.spend import SpendView

log = logging.getLogger("gateway")


def main(config: Config, *, port: int | None = None) -> int:
    settings = config.section("gateway", GatewaySettings)
    if port:
        settings.port = port
    instance_id = new_instance_id("gateway")

    async def body(bus: Bus, stop: asyncio.Event) -> None:
        gateway = Gateway(bus, settings, instance_id=instance_id, heartbeat_s=config.runtime.heartbeat_s,
                          spend=config.section("brain", SpendView),
                          channels=enabled_names(config.raw.get("channels")),
                          archive=SessionArchive(config.runtime.archive_path), retention=config.runtime.retention)
        if not settings.loopback_only and not await gateway.tokens.configured():
            raise ConfigError(f"refusing to listen on {settings.host} with no token: anyone who reaches it could "
                              "run commands as this agent. Create one with `pincer token create NAME` or set "
                              "PINCER_GATEWAY_TOKEN, or keep gateway.host on 127.0.0.1")
        try:  # bound here, so the line below is written once a client can connect
            listening = socket.create_server((settings.host, settings.port),
                                             family=socket.AF_INET6 if ":" in settings.host else socket.AF_INET)
        except OSError as exc:
            raise SystemExit(f"gateway could not listen on {settings.host}:{settings.port}: {exc.strerror or exc}"
                             " (gateway.port: another process may hold it)") from None
        log.info("gateway on %s answers hosts %s", settings.url, ", ".join(settings.hosts()))
        server = uvicorn.Server(uvicorn.Config(
            gateway.app(), host=settings.host, port=settings.port, log_config=None, access_log=False,
            lifespan="on", timeout_graceful_shutdown=5,
            ws_max_size=MAX_SOCKET_MESSAGE,  # uvicorn's 16 MiB would be held for any stranger before sign-in
            http="httptools",  # named, not uvicorn's "auto": a missing parser fails the start, never falls back to h11
        ))
        # Our loop owns SIGTERM/SIGINT (run_service); uvicorn must not take them over.
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]  # the hook uvicorn offers
        serving = asyncio.create_task(server.serve(sockets=[listening]))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        stopping.cancel()
        await serving
        if not server.started:
            raise SystemExit(f"gateway could not listen on {settings.host}:{settings.port}")
        log.info("gateway stopped")

    return run_service("gateway", config, body, instance_id=instance_id)
