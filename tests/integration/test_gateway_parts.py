"""The Gateway's parts on a real Redis: tokens, the owner token file, per-caller limits, session ownership."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bus.keys import BRAIN_GROUP
from bus.protocol import ChatCancel, ErrorCode
from bus.streams import Bus
from gateway.config import GatewaySettings, LimitSettings
from gateway.server.guard import _host_name
from gateway.tokens import TokenError, TokenStore, digest, ensure_owner_token, owner_token_path, read_owner_token
from gateway.turns.limits import CallerLimits
from gateway.turns.refusal import Refused
from memory.sessions import SessionStore, TranscriptEntry


async def test_tokens_are_identities_kept_only_as_digests(bus: Bus) -> None:
    store = TokenStore(bus.redis, bus.keys, static="pcr_configured")
    alice = await store.create("alice")
    coder = await store.create("ci-bot", scope="operator", agents=["coder"])
    assert alice.startswith("pcr_") and alice != coder and len(alice) > 40

    found = await store.identify(alice)
    assert found is not None and found.name == "alice" and found.scope == "chat" and not found.operator
    assert found.may_use("anything") and found.may_see("alice") and not found.may_see("bob")
    bot = await store.identify(coder)
    assert bot is not None and bot.operator and bot.may_use("coder") and not bot.may_use("main")
    owner = await store.identify("pcr_configured")
    assert owner is not None and owner.name == "owner" and owner.operator
    for wrong in ("", "pcr_configured ", alice[:-1], "x" * 10_000):
        assert await store.identify(wrong) is None

    stored = b"".join(k + v for k, v in (await bus.redis.hgetall(bus.keys.tokens)).items())
    assert alice.encode() not in stored and digest(alice).encode() in stored  # the secret never rests in Redis
    assert [i.name for i in await store.list()] == ["alice", "ci-bot"]

    with pytest.raises(TokenError, match="exists"):
        await store.create("alice")
    with pytest.raises(TokenError, match="configured token"):
        await store.create("owner")
    with pytest.raises(TokenError, match="token names are"):
        await store.create("../etc")
    with pytest.raises(TokenError, match="chat platforms' users"):  # no token may squat telegram:123's sessions
        await store.create("telegram:123")

    assert await store.revoke("alice") and not await store.revoke("alice")
    fresh = TokenStore(bus.redis, bus.keys)  # another Gateway: nothing cached
    assert await fresh.identify(alice) is None and await fresh.identify(coder) is not None
    assert [i.name for i in await fresh.list()] == ["ci-bot"]


async def test_a_pool_with_no_token_is_not_configured(bus: Bus) -> None:
    assert not await TokenStore(bus.redis, bus.keys).configured()
    assert await TokenStore(bus.redis, bus.keys, static="pcr_x").configured()
    await TokenStore(bus.redis, bus.keys).create("someone")
    assert await TokenStore(bus.redis, bus.keys).configured()


def test_the_owner_token_file_is_private_and_never_followed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    token = ensure_owner_token(data)
    path = owner_token_path(data)
    assert path.stat().st_mode & 0o777 == 0o600 and read_owner_token(data) == token
    assert ensure_owner_token(data) == token  # made once

    other = tmp_path / "other"
    (other).mkdir()
    target = tmp_path / "victim.txt"
    target.write_text("")
    os.symlink(target, owner_token_path(other))  # someone planted a link where the token goes
    assert read_owner_token(other) is None
    with pytest.raises(TokenError, match="not a token file"):
        ensure_owner_token(other)
    assert target.read_text() == ""  # nothing written through the link


async def test_the_message_rate_is_one_bucket_for_every_gateway(bus: Bus) -> None:
    settings = LimitSettings(messages_per_minute=60, burst=3)
    one, two = CallerLimits(bus, settings), CallerLimits(bus, settings)
    await one.take_message("alice")
    await two.take_message("alice")
    await one.take_message("alice")
    with pytest.raises(Refused) as refused:
        await two.take_message("alice")
    assert refused.value.code == ErrorCode.RATE_LIMITED and refused.value.retry_after == 1
    await one.take_message("bob")  # every token has its own


async def test_a_days_text_is_a_bucket_of_its_own_and_a_refusal_takes_from_neither(bus: Bus) -> None:
    settings = LimitSettings(messages_per_minute=60, burst=2, text_mb_per_day=1 / 1024)  # 1 KiB a day
    one, two = CallerLimits(bus, settings), CallerLimits(bus, settings)
    await one.take_message("alice", size=600)
    with pytest.raises(Refused) as refused:
        await two.take_message("alice", size=600)  # every Gateway reads the same day's text
    assert refused.value.code == ErrorCode.RATE_LIMITED and "gateway.limits.text_mb_per_day" in refused.value.message
    assert refused.value.retry_after > 3600  # 176 bytes short: a day's 1,024 come back over 24 hours
    await one.take_message("alice", size=400)  # the refusal took no message either: the burst's second is here
    with pytest.raises(Refused, match="messages_per_minute"):
        await one.take_message("alice")
    await one.take_message("bob", size=1024)  # every token has its own; a message larger than a day's waits
    with pytest.raises(Refused, match="text_mb_per_day"):  # for a whole day's (it is not refused for ever)
        await one.take_message("bob", size=10 << 20)


async def test_a_message_refused_for_its_rate_takes_no_number_in_its_session(bus: Bus) -> None:
    limits = CallerLimits(bus, LimitSettings(messages_per_minute=60, burst=2))
    sessions = SessionStore(bus.redis, bus.keys, batcher=bus.batcher)

    def claim(sender: str = "alice"):
        return sessions.claim_call("s1", sender)

    assert await limits.take_message("alice", then=claim()) == 1
    assert await limits.take_message("alice", then=claim()) == 2
    with pytest.raises(Refused) as refused:
        await limits.take_message("alice", then=claim())
    assert refused.value.code == ErrorCode.RATE_LIMITED
    assert await bus.redis.get(bus.keys.session_seq("s1")) == b"2"  # the refused one took no number
    assert await limits.take_message("bob", then=claim("bob")) is None  # taken from bob's rate; not his session
    assert await sessions.claim_and_number("s1", "alice") == 3


def test_open_turns_are_held_and_given_back(bus: Bus) -> None:
    limits = CallerLimits(bus, LimitSettings(open_turns_per_token=2, open_streams_per_token=1))
    first = limits.hold_turn("alice", stream=True)
    with pytest.raises(Refused, match="streams open"):
        limits.hold_turn("alice", stream=True)
    second = limits.hold_turn("alice", stream=False)
    with pytest.raises(Refused, match="turns running"):
        limits.hold_turn("alice", stream=False)
    limits.hold_turn("bob", stream=True).release()
    first.release()
    first.release()  # a second release gives back nothing more
    limits.hold_turn("alice", stream=True)
    with pytest.raises(Refused):
        limits.hold_turn("alice", stream=False)
    second.release()


async def test_a_brain_backlog_past_the_bound_refuses_new_messages(bus: Bus) -> None:
    limits = CallerLimits(bus, LimitSettings(max_inbox_backlog=3))
    await limits.check_backlog()  # no inbox yet: nothing waits
    await bus.redis.xgroup_create(bus.keys.brain_inbox, BRAIN_GROUP, id="0", mkstream=True)
    for _ in range(3):
        await bus.publish(bus.keys.brain_inbox, ChatCancel(session_id="s"))
    limits._backlog = (0.0, 0)  # the cached reading is half a second old at most; read it now
    with pytest.raises(Refused) as refused:
        await limits.check_backlog()
    assert refused.value.code == ErrorCode.SERVICE_UNAVAILABLE and "3 messages are waiting" in refused.value.message


@pytest.mark.parametrize("batched", [False, True], ids=["own-round-trip", "with-the-batcher"])
async def test_a_session_belongs_to_the_token_that_started_it(bus: Bus, batched: bool) -> None:
    sessions = SessionStore(bus.redis, bus.keys, batcher=bus.batcher if batched else None)  # the Gateway's: batched
    assert await sessions.claim_and_number("alice/s1", "alice") == 1
    assert await sessions.claim_and_number("alice/s1", "bob") is None
    assert await sessions.claim_and_number("alice/s1", "ops", operator=True) == 2  # operators may, and take nothing
    assert await sessions.claim_and_number("alice/s1", "alice") == 3
    assert await sessions.owner("alice/s1") == "alice" and await sessions.owner("never") is None

    await sessions.append("legacy", TranscriptEntry(role="user", content="from before owners"))
    assert await sessions.owner("legacy") == ""
    assert await sessions.claim_and_number("legacy", "alice") is None  # operators only
    assert await sessions.claim_and_number("legacy", "ops", operator=True) == 1

    assert await sessions.claim_and_number("brief", "alice", ttl_s=120) == 1
    assert 0 < await bus.redis.ttl(bus.keys.session_owner("brief")) <= 120

    await sessions.append("alice/s1", TranscriptEntry(role="user", content="hi"))
    assert await sessions.list_sessions(owner="alice") == ["alice/s1"]  # ids start with their owner's name
    assert await sessions.list_sessions(owner="bob") == []
    assert set(await sessions.list_sessions()) == {"alice/s1", "legacy"}  # an operator's ?owner=*


@pytest.mark.parametrize(("header", "name"), [
    ("localhost:8780", "localhost"), ("127.0.0.1", "127.0.0.1"), ("[::1]:8780", "::1"), ("::1", "::1"),
    ("Example.COM:443", "example.com"), ("[::1", ""), ("", ""),
])
def test_host_headers_are_read_without_their_port(header: str, name: str) -> None:
    assert _host_name(header) == name


@pytest.mark.parametrize(("host", "private"), [
    ("127.0.0.1", True), ("::1", True), ("localhost", True), ("127.0.0.2", True),
    ("0.0.0.0", False), ("::", False), ("192.168.1.20", False), ("pincer.example", False),
])
def test_only_loopback_binds_count_as_private(host: str, private: bool) -> None:
    assert GatewaySettings(host=host).loopback_only is private


async def test_healthz_without_redis_says_down_and_not_where_redis_is(prefix: str) -> None:
    import json

    from bus.redis_server import free_port
    from bus.settings import RedisSettings
    from gateway.server.app import Gateway
    from memory.spend import SpendView

    gone = Bus.from_settings(RedisSettings(prefix=prefix), f"redis://127.0.0.1:{free_port()}/0")
    try:
        gateway = Gateway(gone, GatewaySettings(), instance_id="gw-down", heartbeat_s=0.5, spend=SpendView(),
                          channels=[])
        answer = await gateway.healthz(None)  # type: ignore[arg-type]  # it reads nothing of the request
    finally:
        await gone.close()
    body = json.loads(bytes(answer.body))
    assert answer.status_code == 503 and body["status"] == "down" and body["redis"].startswith("error: ")
    assert "127.0.0.1" not in body["redis"]  # answered without a token: the address stays in the log
