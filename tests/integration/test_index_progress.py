"""A Hands worker that builds one identity's search index from a long history says how far it has come: in its
log (a few lines, not one per batch), in its heartbeat, so `pincer status` shows "indexing 2,000/12,000
entries" for it, and in readiness, which counts it without calling the pool unready (it serves everyone else
meanwhile)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bus import pool as ops
from bus.config import Config
from bus.progress import Throttle
from bus.streams import Bus
from gateway.cli.ops import show_status
from gateway.server.observe import readiness
from memory import index, recall
from memory.sessions import SessionStore, TranscriptEntry
from tests.conftest import async_wait_until

ENTRIES = 12_000  # six batches of the index's reads
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def held_build(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The build's second batch waits (in the index's own thread) until the test lets it go: the first batch
    indexed and counted, the rest not yet, a state the test can look at for as long as it needs."""
    go_on, batches = threading.Event(), []
    apply = index.Index.apply

    def held(index: Any, entries: Iterable[tuple[str, dict[str, str]]]) -> list[str]:
        batches.append(1)
        if len(batches) == 2:
            go_on.wait(60)
        return apply(index, entries)

    monkeypatch.setattr(index.Index, "apply", held)
    # Each tenth said however quick the first batch was (the time rule is the unit tests' to check).
    monkeypatch.setattr(recall, "BUILD_THROTTLE", Throttle(min_s=0))
    yield go_on
    go_on.set()  # never leave the index's thread waiting


async def written(bus: Bus, count: int) -> None:
    """A session of Ana's ``count`` messages long."""
    sessions = SessionStore(bus.redis, bus.keys)
    for start in range(0, count, 1_000):
        await sessions.append("ana/long", *(TranscriptEntry(role="user", content=f"fact {n}")
                                            for n in range(start, min(count, start + 1_000))))


def pincer_status(redis_url: str, bus: Bus, data_dir: Path, capsys: pytest.CaptureFixture[str], *,
                  as_json: bool) -> str:
    config = Config(raw={"redis": {"url": redis_url, "prefix": bus.keys.prefix},
                         "runtime": {"data_dir": str(data_dir)}})
    assert asyncio.run(show_status(config, as_json=as_json)) == 0
    return capsys.readouterr().out


async def test_a_worker_building_a_scope_says_how_far_in_its_log_heartbeat_status_and_readiness(
        bus: Bus, engine: Any, held_build: threading.Event, redis_url: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="memory.recall")
    await written(bus, ENTRIES)
    worker = await engine()
    search = asyncio.create_task(worker.recall.search("main", "fact 11999", owner="ana"))

    async def indexing() -> str:
        found = await ops.status(bus)
        return str(found["instances"]["hands"][0].get("indexing", ""))

    await async_wait_until(lambda: _equals(indexing(), "2,000/12,000 entries"), what="the heartbeat saying how far")
    as_json = await asyncio.to_thread(pincer_status, redis_url, bus, tmp_path, capsys, as_json=True)
    assert json.loads(as_json)["instances"]["hands"][0]["indexing"] == "2,000/12,000 entries"
    table = await asyncio.to_thread(pincer_status, redis_url, bus, tmp_path, capsys, as_json=False)
    assert "indexing 2,000/12,000 entries" in table
    _, body = await readiness(bus, max_backlog=100)
    assert body["hands_indexing"] == 1 and not any("indexing" in p for p in body["problems"])
    said = [r.getMessage() for r in caplog.records if r.name == "memory.recall"]
    assert said[0].startswith("indexing the memory of ana: 0/12,000 entries (0%)")
    assert said[1].startswith("indexing the memory of ana: 2,000/12,000 entries (17%)")

    held_build.set()
    hits = await asyncio.wait_for(search, 60)
    assert hits[0]["excerpt"] == "fact 11999" and hits[0]["session"] == "long"
    await async_wait_until(lambda: _equals(indexing(), ""), what="the heartbeat saying the index is built")
    table = await asyncio.to_thread(pincer_status, redis_url, bus, tmp_path, capsys, as_json=False)
    assert "indexing" not in table and "ready" in table
    _, body = await readiness(bus, max_backlog=100)
    assert body["hands_indexing"] == 0 and not any("indexing" in p for p in body["problems"])  # no Brain: not ready
    said = [r.getMessage() for r in caplog.records if r.name == "memory.recall"]
    assert said[-1].startswith("indexing the memory of ana: 12,000/12,000 entries (100%)") and " done in " in said[-1]
    assert len(said) <= 12  # a line a tenth at most, not one a batch or an entry


async def _equals(value: Any, expected: str) -> bool:
    return await value == expected
