"""Notes deleted through the Gateway's HTTP API and `pincer memory`, a real Gateway process on a real Redis:
each identity reaches only its own notes, an operator the others' and the shared ones, and a deleted note
leaves no copy in the memory log."""

from __future__ import annotations

import asyncio
import json

import pytest

from bus.settings import RedisSettings
from bus.streams import Bus
from memory.longterm import SHARED, LongTermMemory
from tests.conftest import Processes, gateway_client, gateway_health, wait_until
from tests.e2e.conftest import create_token

pytestmark = pytest.mark.e2e


async def _write(env: dict[str, str], *notes: tuple[str, str, str]) -> None:
    bus = Bus.from_settings(RedisSettings(prefix=env["PINCER_REDIS__PREFIX"]), env["PINCER_REDIS_URL"])
    try:
        memory = LongTermMemory(bus.redis, bus.keys)
        for owner, key, content in notes:
            await memory.write("main", key, content, owner=owner)
    finally:
        await bus.close()


async def _log(env: dict[str, str]) -> str:
    bus = Bus.from_settings(RedisSettings(prefix=env["PINCER_REDIS__PREFIX"]), env["PINCER_REDIS_URL"])
    try:
        entries = await bus.redis.xrange(bus.keys.memory_log)
        return " ".join(v.decode() for _, fields in entries for v in fields.values())
    finally:
        await bus.close()


def test_notes_are_deleted_through_the_api_and_the_cli_by_whoever_may(processes: Processes,
                                                                        pincer_env: dict[str, str]) -> None:
    processes.env = pincer_env
    processes.start("gateway", name="gateway")
    wait_until(lambda: gateway_health(pincer_env) is not None, timeout=60, what="the Gateway listening")
    alice, bob = create_token(processes, "alice"), create_token(processes, "bob")
    asyncio.run(_write(pincer_env, ("alice", "pin", "my bank pin is 4321"), ("bob", "pin", "bob's pin 1234"),
                       (SHARED, "wifi", "the wifi password is hunter2")))
    with gateway_client(pincer_env, alice) as a, gateway_client(pincer_env, bob) as b, \
            gateway_client(pincer_env) as owner:
        assert [(n["key"], n["scope"]) for n in a.get("/v1/memory").json()["notes"]] == [("pin", "own"),
                                                                                        ("wifi", "shared")]
        for refused in (b.delete("/v1/memory/pin?owner=alice"), b.delete("/v1/memory/wifi?shared=1"),
                        b.get("/v1/memory?owner=alice")):
            assert refused.status_code == 403 and "operator" in refused.json()["error"]["message"]
        assert b.delete("/v1/memory/wifi").status_code == 404  # a shared note is not bob's own
        assert a.delete("/v1/memory/..").status_code in (400, 404)
        gone = a.delete("/v1/memory/pin")
        assert gone.status_code == 200 and gone.json() == {"agent": "main", "key": "pin", "scope": "own",
                                                           "deleted": True}
        assert a.delete("/v1/memory/pin").status_code == 404
        assert [n["key"] for n in b.get("/v1/memory").json()["notes"]] == ["pin", "wifi"]  # bob's stays
        assert "4321" not in asyncio.run(_log(pincer_env)) and "1234" in asyncio.run(_log(pincer_env))
        # The CLI, as the owner's operator token: another identity's note and a shared one.
        listed = processes.run("memory", "list", "--owner", "bob", "--json")
        assert listed.returncode == 0, listed.stderr
        assert [n["key"] for n in json.loads(listed.stdout)["notes"]] == ["pin", "wifi"]
        removed = processes.run("memory", "rm", "pin", "--owner", "bob")
        assert removed.returncode == 0 and "deleted" in removed.stderr, removed.stderr
        assert processes.run("memory", "rm", "wifi", "--shared").returncode == 0
        missing = processes.run("memory", "rm", "wifi", "--shared")
        assert missing.returncode == 1 and "no shared note named 'wifi'" in missing.stderr
        assert owner.get("/v1/memory?owner=bob").json()["notes"] == []
    text = asyncio.run(_log(pincer_env))
    assert "1234" not in text and "hunter2" not in text
