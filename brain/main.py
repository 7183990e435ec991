"""``pincer brain``: run one Brain until stopped."""

from __future__ import annotations

import asyncio
import os

from brain import pause
from brain.config import BrainSettings
from brain.worker import BrainWorker
from bus.admission import RateLimits
from bus.config import Config
from bus.service import new_instance_id, run_service
from bus.streams import Bus


def main(config: Config, *, rate: RateLimits) -> int:
    """``rate``: the Gateway's per-identity limits (gateway.limits), which a job's fires are charged as its
    owner's turns; read by the entry point, as the Brain imports nothing of the Gateway."""
    settings = config.section("brain", BrainSettings)
    instance_id = new_instance_id("brain")
    pause_at = pause.from_environment(os.environ)  # a test seam: empty unless a test sets it

    async def body(bus: Bus, stop: asyncio.Event) -> None:
        worker = BrainWorker(bus, settings, instance_id=instance_id, llm=None,
                             heartbeat_s=config.runtime.heartbeat_s, rate=rate, pause_at=pause_at)
        await worker.run(stop)

    return run_service("brain", config, body, instance_id=instance_id)
