"""The stored data's layout version: stamped, migrated once by one process, refused when newer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bus import schema
from bus.schema import Migration, SchemaTooNew, ensure_current
from bus.settings import RedisSettings
from bus.streams import Bus
from tests.conftest import Processes


async def test_a_key_space_without_a_version_is_the_first_layout_and_is_stamped(bus: Bus) -> None:
    assert await bus.redis.get(bus.keys.schema) is None
    assert await ensure_current(bus) == schema.VERSION
    assert int(await bus.redis.get(bus.keys.schema)) == schema.VERSION


async def test_migrations_run_once_in_order_while_the_other_processes_wait(redis_url: str, prefix: str) -> None:
    ran: list[int] = []

    def step(to: int) -> Migration:
        async def run(bus: Bus) -> None:
            ran.append(to)
            await asyncio.sleep(0.2)  # long enough that the other starters find the lock taken
        return Migration(to=to, what=f"to {to}", run=run)

    buses = [Bus.from_settings(RedisSettings(prefix=prefix), redis_url) for _ in range(4)]
    try:
        await buses[0].redis.set(buses[0].keys.schema, 1)
        found = await asyncio.gather(*(ensure_current(b, version=3, migrations=[step(2), step(3)]) for b in buses))
        assert ran == [2, 3]
        assert int(await buses[0].redis.get(buses[0].keys.schema)) == 3
        assert await buses[0].redis.get(f"{buses[0].keys.schema}:migrating") is None
        assert found == [3, 3, 3, 3]
    finally:
        for b in buses:
            await b.close()


async def test_a_migration_cut_short_runs_again_on_the_next_start(bus: Bus) -> None:
    tries: list[int] = []

    async def flaky(_: Bus) -> None:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionError("killed mid-way")

    steps = [Migration(to=2, what="flaky", run=flaky)]
    with pytest.raises(ConnectionError):
        await ensure_current(bus, version=2, migrations=steps)
    assert int(await bus.redis.get(bus.keys.schema)) == 1  # not moved past a step that did not finish
    assert await ensure_current(bus, version=2, migrations=steps) == 2
    assert len(tries) == 2


async def test_data_newer_than_the_release_is_refused_with_what_to_do(bus: Bus) -> None:
    await bus.redis.set(bus.keys.schema, schema.VERSION + 1)
    with pytest.raises(SchemaTooNew, match=f"layout version {schema.VERSION + 1}.*Run the newer release"):
        await ensure_current(bus)
    assert int(await bus.redis.get(bus.keys.schema)) == schema.VERSION + 1  # untouched


def test_a_process_meeting_newer_data_exits_78_and_says_why(processes: Processes, pincer_env: dict[str, str],
                                                           redis_url: str, prefix: str, tmp_path: Path) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    client.set(f"{prefix}schema", schema.VERSION + 5)
    refused = processes.run("hands")
    assert refused.returncode == 78  # EX_CONFIG: the units do not restart it
    assert f"layout version {schema.VERSION + 5}" in refused.stderr
    assert client.get(f"{prefix}schema") == str(schema.VERSION + 5).encode()


async def test_status_names_each_release_the_pool_runs_and_its_layout(bus: Bus,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from bus import pool, presence

    await ensure_current(bus)
    old = presence.Presence(bus, "brain", "brain-old")
    monkeypatch.setattr(presence, "version", lambda: "0.1.0")
    await old.beat()
    monkeypatch.setattr(presence, "version", lambda: "0.2.0")
    new = [presence.Presence(bus, role, f"{role}-new") for role in ("brain", "hands")]
    for p in new:
        await p.beat()
    found = await pool.status(bus)
    assert found["versions"] == {"0.1.0": ["brain-old"], "0.2.0": ["brain-new", "hands-new"]}
    assert found["schema"] == schema.VERSION

