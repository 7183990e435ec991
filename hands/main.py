"""``pincer hands``: run one Hands worker until stopped."""

from __future__ import annotations

import asyncio

from bus.config import Config
from bus.process_guard import make_undumpable
from bus.service import new_instance_id, run_service
from bus.streams import Bus
from hands.config import HandsSettings, check_workspace
from hands.worker import HandsWorker


def main(config: Config, *, concurrency: int | None = None) -> int:
    settings = config.section("hands", HandsSettings)
    check_workspace(settings, data_dir=config.runtime.data_path)  # a bad workspace stops it before it joins
    if concurrency:
        settings.concurrency.global_ = concurrency
    worker_id = new_instance_id("hands")

    async def body(bus: Bus, stop: asyncio.Event) -> None:
        make_undumpable()  # commands may run as our own uid (rlimits tier): our environ stays ours
        await HandsWorker(bus, settings, worker_id=worker_id, heartbeat_s=config.runtime.heartbeat_s).run(stop)

    return run_service("hands", config, body, instance_id=worker_id)
