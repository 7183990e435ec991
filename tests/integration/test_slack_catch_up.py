"""Slack's read-back after a reconnection, through slack_sdk's real Web API client against the local Slack
server (tests/fake_slack.py): what a connection missed is taken in the order it was said, each message
once whether it comes read back or as Slack's late retry, and a DM thread stays its own session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from bus.protocol import ChannelUpdate
from bus.streams import Bus
from gateway.channels.config import SlackSettings
from gateway.channels.slack import Slack
from tests.fake_slack import APP_TOKEN, BOT_TOKEN, BOT_USER, FakeSlack
from tests.fakes import fake_bus

ALICE = "UALICE001"
DM = f"D{ALICE}"


@pytest.fixture
def server() -> Iterator[FakeSlack]:
    fake = FakeSlack().start()
    yield fake
    fake.stop()


class Inbox:
    """The kit's side of ``take``: each event id written once, in the order taken."""

    def __init__(self) -> None:
        self.taken: list[ChannelUpdate] = []
        self.seen: set[str] = set()

    async def take(self, event_id: str, update: ChannelUpdate | None) -> bool:
        if update is not None and event_id not in self.seen:
            self.seen.add(event_id)
            self.taken.append(update)
        return True


@pytest.fixture
async def slack(server: FakeSlack) -> AsyncIterator[tuple[Slack, Inbox]]:
    bus: Bus = fake_bus()
    settings = SlackSettings.model_validate({"bot_token": BOT_TOKEN, "app_token": APP_TOKEN,
                                             "api_url": server.api_url})
    platform = Slack(settings, bus)
    await platform.start()
    inbox = Inbox()
    platform._take = inbox.take
    yield platform, inbox
    await platform.close()
    await bus.close()


def live(server: FakeSlack, ts: str) -> dict[str, Any]:
    """The event Slack sent for the message said at ``ts``."""
    for envelope in server._all.values():
        event = envelope["payload"].get("event") or {}
        if event.get("ts") == ts:
            return dict(envelope["payload"])
    raise AssertionError(f"nothing was said at {ts}")


async def arrive(platform: Slack, inbox: Inbox, payload: dict[str, Any]) -> None:
    event_id, update = await platform.parse("events_api", payload, "env")
    if await inbox.take(event_id, update):
        await platform.catch_up.mark(payload["event"])


async def test_what_a_connection_missed_is_taken_in_order_and_a_late_retry_is_a_repeat(
        server: FakeSlack, slack: tuple[Slack, Inbox]) -> None:
    platform, inbox = slack
    before = server.say(ALICE, "before")
    await arrive(platform, inbox, live(server, before))
    await arrive(platform, inbox, live(server, server.say(ALICE, "thread 0", thread_ts=before)))
    server._chat_postMessage({"channel": DM, "text": "echo: before"})  # the bot's own answer is passed over
    missed = [server.say(ALICE, f"during {n}") for n in range(3)]  # the connection is down
    in_thread = server.say(ALICE, "thread 1", thread_ts=before)
    await platform.catch_up.read_back(platform._take)  # a new connection reads back first
    for late in (missed[2], missed[0], in_thread):  # then Slack's retries, in its own order: repeats
        await arrive(platform, inbox, live(server, late))
    dm = [u.text for u in inbox.taken if u.chat == DM]
    thread = [u.text for u in inbox.taken if u.chat == f"{DM}:{before}"]  # a thread is its own session
    assert dm == ["before", "during 0", "during 1", "during 2"]
    assert thread == ["thread 0", "thread 1"]
    assert len(inbox.taken) == 6 and not any(u.user == BOT_USER for u in inbox.taken)


async def test_read_back_is_in_the_order_said_and_pages_through_a_long_outage(
        server: FakeSlack, slack: tuple[Slack, Inbox]) -> None:
    platform, inbox = slack
    await arrive(platform, inbox, live(server, server.say(ALICE, "before")))
    for n in range(150):  # more than one page of history (Slack returns the newest page first)
        server.say(ALICE, f"during {n}")
    await platform.catch_up.read_back(platform._take)
    assert [u.text for u in inbox.taken] == ["before", *(f"during {n}" for n in range(150))]
    await platform.catch_up.read_back(platform._take)  # nothing new: nothing taken again
    assert len(inbox.taken) == 151
    assert any(method == "conversations.history" and params.get("cursor") for method, params in server.calls)


async def test_a_rate_limited_read_back_leaves_the_rest_to_slacks_retries(
        server: FakeSlack, slack: tuple[Slack, Inbox]) -> None:
    platform, inbox = slack
    await arrive(platform, inbox, live(server, server.say(ALICE, "before")))
    server.say(ALICE, "during")
    server.fail("conversations.history", status=429, error="ratelimited", retry_after=30)
    await platform.catch_up.read_back(platform._take)  # logged, not raised: the connection goes on
    assert [u.text for u in inbox.taken] == ["before"]
    await platform.catch_up.read_back(platform._take)
    assert [u.text for u in inbox.taken] == ["before", "during"]
