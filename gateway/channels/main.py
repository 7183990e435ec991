"""``pincer channel NAME``: run one chat channel's process until stopped."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from bus.config import Config, ConfigError
from bus.service import new_instance_id, run_service
from bus.streams import Bus
from gateway.channels.config import ChannelSettings
from gateway.channels.errors import PlatformRefused
from gateway.channels.worker import ChannelWorker
from gateway.config import GatewaySettings

log = logging.getLogger("gateway.channels")

KNOWN = ("telegram",)


def main(config: Config, name: str, *, workspace: Path) -> int:
    """Run channel ``name``; files people send are saved in ``workspace`` (Hands' own, read by whoever
    starts this: the channel imports nothing of Hands)."""
    if name not in KNOWN:
        raise ConfigError(f"no channel named {name!r}; channels: {', '.join(KNOWN)}")
    settings = config.section("channels", ChannelSettings)
    telegram = settings.telegram
    if not telegram.bot_token.get_secret_value():
        raise ConfigError("channels.telegram.bot_token is empty: set it (or `${NAME}` to read it from the "
                          "environment variable NAME); @BotFather gives one")
    gateway = config.section("gateway", GatewaySettings)
    instance_id = new_instance_id(name)

    async def body(bus: Bus, stop: asyncio.Event) -> None:
        from gateway.channels.telegram import Telegram

        worker = ChannelWorker(bus, Telegram(telegram), telegram, gateway, workspace=workspace,
                               instance_id=instance_id, heartbeat_s=config.runtime.heartbeat_s)
        try:
            await worker.run(stop)
        except PlatformRefused as exc:  # a wrong or revoked token: only a person can fix it
            raise ConfigError(f"channels.{name}: {exc}") from None

    return run_service(name, config, body, instance_id=instance_id)
