"""End-to-end encryption's device lease on a real Redis: one Matrix channel process holds a device's keys;
another waits, then refuses plainly; a killed holder's lease (no heartbeat) is taken at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bus.streams import Bus
from gateway.channels import matrix_keys
from gateway.channels.config import MatrixSettings
from gateway.channels.errors import PlatformRefused
from gateway.channels.intake import ROLE as CHANNEL_ROLE
from gateway.channels.matrix import Matrix

BOT = "@pincer:example.org"


async def test_one_process_holds_an_encrypted_device_and_a_dead_holders_lease_is_taken(
        bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = MatrixSettings.model_validate({"homeserver": "http://127.0.0.1:9", "user_id": BOT,
                                              "access_token": "t", "encryption": True})
    first = Matrix(settings, bus, store_dir=tmp_path / "a", instance_id="matrix-a")
    second = Matrix(settings, bus, store_dir=tmp_path / "b", instance_id="matrix-b")
    monkeypatch.setattr(matrix_keys, "DEVICE_WAIT_S", 0.0)
    try:
        await first.keys.hold("DEV")
        await bus.redis.zadd(bus.keys.alive(CHANNEL_ROLE), {"matrix-a": time.time() + 60})
        with pytest.raises(PlatformRefused, match=r"matrix-a.*holds device DEV's encryption keys"):
            await second.keys.hold("DEV")
        await bus.redis.zrem(bus.keys.alive(CHANNEL_ROLE), "matrix-a")  # its heartbeat stopped: killed
        await second.keys.hold("DEV")
        assert await bus.redis.get(bus.keys.channel_thread("matrix", f"device:{BOT}:DEV")) == b"matrix-b"
    finally:
        for platform in (first, second):
            if platform.keys.holding is not None:
                platform.keys.holding.cancel()
