"""A prefix's keys snapshotted at one instant through a replica's copy, and put back elsewhere."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from bus import snapshot
from bus.settings import RedisSettings
from bus.snapshot import SnapshotError
from bus.streams import Bus


async def test_every_key_of_the_prefix_comes_back_with_its_expiry_and_nothing_else(
        bus: Bus, redis_url: str, tmp_path: Path) -> None:
    r, p = bus.redis, bus.keys.prefix
    await r.hset(f"{p}tokens", mapping={"alice": "hash-a"})
    await r.set(f"{p}short", "gone soon", px=60_000)
    await r.xadd(f"{p}brain:inbox", {"type": "chat:message"})
    await r.xgroup_create(f"{p}brain:inbox", "brain", id="0")
    await r.xreadgroup("brain", "b1", {f"{p}brain:inbox": ">"})  # one entry pending for b1
    await r.zadd(f"{p}jobs:due", {"daily": 1.5e12})
    await r.set(f"other{uuid.uuid4().hex[:6]}:secret", "not ours")

    async def scrub(copy: Bus) -> None:
        await copy.redis.hset(copy.keys.prefix + "tokens", "alice", "scrubbed")

    taken = await snapshot.take(redis_url, p, tmp_path / "keys", scrub=scrub)
    assert taken.keys == 4 and taken.server and len(taken.sha256) == 64
    assert snapshot.records(tmp_path / "keys") == 4
    assert await r.hget(f"{p}tokens", "alice") == b"hash-a"  # the scrub touched the private copy only

    fresh = Bus.from_settings(RedisSettings(prefix=f"r{uuid.uuid4().hex[:8]}:"), redis_url)
    try:
        q = fresh.keys.prefix
        assert await snapshot.restore(fresh, tmp_path / "keys") == 4
        assert await fresh.redis.hget(f"{q}tokens", "alice") == b"scrubbed"
        assert 0 < await fresh.redis.pttl(f"{q}short") <= 60_000
        assert await fresh.redis.ttl(f"{q}tokens") == -1
        pending = await fresh.redis.xpending(f"{q}brain:inbox", "brain")
        assert pending["pending"] == 1 and pending["consumers"][0]["name"] == b"b1"
        assert await fresh.redis.zscore(f"{q}jobs:due", "daily") == 1.5e12
        with pytest.raises(SnapshotError, match="already holds keys"):
            await snapshot.restore(fresh, tmp_path / "keys")
    finally:
        await fresh.close()


async def test_a_key_that_expired_since_is_not_brought_back(bus: Bus, redis_url: str, tmp_path: Path) -> None:
    await bus.redis.set(f"{bus.keys.prefix}brief", "x", px=60_000)
    await bus.redis.set(f"{bus.keys.prefix}kept", "y")
    await snapshot.take(redis_url, bus.keys.prefix, tmp_path / "keys")
    fresh = Bus.from_settings(RedisSettings(prefix=f"r{uuid.uuid4().hex[:8]}:"), redis_url)
    try:
        later = int(await bus.redis.pexpiretime(f"{bus.keys.prefix}brief")) + 1
        assert await snapshot.restore(fresh, tmp_path / "keys", now_ms=later) == 1
        assert await fresh.redis.get(f"{fresh.keys.prefix}brief") is None
    finally:
        await fresh.close()


async def test_a_redis_that_cannot_be_reached_is_said_plainly(prefix: str, tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="taking Redis's snapshot"):
        await snapshot.take("redis://127.0.0.1:1/0", prefix, tmp_path / "keys")
