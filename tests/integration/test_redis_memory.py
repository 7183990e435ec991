"""Redis's memory watched against a bound, and an evicting Redis called out, before anything is lost."""

from __future__ import annotations

from bus.settings import RedisSettings
from bus.streams import Bus


async def test_redis_memory_is_watched_against_its_bound_and_eviction_is_called_out(redis_url: str,
                                                                                    prefix: str) -> None:
    from bus import pool
    from gateway.server.observe import metrics_text, readiness

    tight = Bus.from_settings(RedisSettings(prefix=prefix, memory_bound_mb=0.1), redis_url)
    try:
        found = await pool.redis_memory(tight)
        assert found["used_bytes"] > found["bound_bytes"] == int(0.1 * 2**20)
        assert "shorten retention or raise the bound" in found["warnings"][0]
        _, body = await readiness(tight, max_backlog=100)
        # the same warning (its figures are read again, and Redis's memory moves between two reads)
        assert [w.split(": ", 1)[1] for w in body["warnings"]] == [w.split(": ", 1)[1] for w in found["warnings"]]
        text = (await metrics_text(tight))[0].decode()
        assert f"pincer_redis_memory_bound_bytes {float(int(0.1 * 2**20))}" in text
        assert "pincer_redis_memory_used_bytes " in text
        roomy = Bus.from_settings(RedisSettings(prefix=prefix), redis_url)
        try:
            assert (await pool.redis_memory(roomy))["warnings"] == []  # no bound known: nothing to warn of
            before = await roomy.redis.config_get("maxmemory*")
            await roomy.redis.config_set("maxmemory", str(10 * 2**30))
            await roomy.redis.config_set("maxmemory-policy", "allkeys-lru")
            try:
                warned = (await pool.redis_memory(roomy))["warnings"]
            finally:
                for name in ("maxmemory", "maxmemory-policy"):
                    await roomy.redis.config_set(name, before[name.encode()] if name.encode() in before
                                                 else before[name])
            assert len(warned) == 1 and "maxmemory-policy noeviction" in warned[0]
        finally:
            await roomy.close()
    finally:
        await tight.close()
