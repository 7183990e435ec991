"""``pincer channel NAME``: run one chat channel's process until stopped."""

from __future__ import annotations

import asyncio
import logging
from importlib import import_module
from pathlib import Path

from bus.config import Config, ConfigError
from bus.service import new_instance_id, run_service
from bus.streams import Bus
from bus.workspaces import Workspaces
from gateway.channels.config import KNOWN, ChannelCommon, ChannelSettings
from gateway.channels.errors import PlatformRefused
from gateway.channels.platform import Platform
from gateway.channels.worker import ChannelWorker
from gateway.config import GatewaySettings

log = logging.getLogger("gateway.channels")

def main(config: Config, name: str, *, workspaces: Workspaces) -> int:
    """Run channel ``name``; files people send are saved in each person's own workspace (Hands' layout,
    through the same race-free boundary: bus/workspaces.py)."""
    if name not in KNOWN:
        raise ConfigError(f"no channel named {name!r}; channels: {', '.join(KNOWN)}")
    settings = config.section("channels", ChannelSettings).of(name)
    if missing := settings.missing():
        raise ConfigError(f"channels.{name} needs {', '.join(missing)} set (a secret may be `${{NAME}}`, read "
                          f"from the environment variable NAME); {settings.HINT}")
    gateway = config.section("gateway", GatewaySettings)
    instance_id = new_instance_id(name)

    async def body(bus: Bus, stop: asyncio.Event) -> None:
        platform = platform_for(settings, bus, data_dir=Path(config.runtime.data_dir), instance_id=instance_id)
        worker = ChannelWorker(bus, platform, settings, gateway, workspaces=workspaces,
                               instance_id=instance_id, heartbeat_s=config.runtime.heartbeat_s)
        try:
            await worker.run(stop)
        except PlatformRefused as exc:  # a wrong or revoked credential: only a person can fix it
            raise ConfigError(f"channels.{name}: {exc}") from None

    return run_service(name, config, body, instance_id=instance_id)


def platform_for(settings: ChannelCommon, bus: Bus, *, data_dir: Path, instance_id: str = "") -> Platform:
    """The platform module's calls for these settings (imported only by the channel that uses it)."""
    opened: Platform = import_module(settings.MODULE).platform(settings, bus, data_dir=data_dir,
                                                               instance_id=instance_id)
    return opened
