"""The Slack channel's reading of Socket Mode payloads and its guards, without a server: what is a message
to the agent, what is a press, what is passed over, and where the bot's token may go."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import ValidationError
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse

from bus.protocol import ChannelFile
from bus.streams import Bus
from gateway.channels.config import ChannelSettings, EmailSettings, SlackSettings
from gateway.channels.errors import PlatformRefused
from gateway.channels.markup import fitted, slack_mrkdwn
from gateway.channels.slack import Slack
from tests.fakes import fake_bus as in_memory_bus

BOT = "UBOT0001"


@pytest.fixture
async def slack() -> AsyncIterator[Slack]:
    bus: Bus = in_memory_bus()
    platform = Slack(SlackSettings.model_validate({"bot_token": "xoxb-1", "app_token": "xapp-1"}), bus)
    platform.bot_id = BOT
    yield platform
    await bus.close()


def event(**fields: Any) -> dict[str, Any]:
    base = {"type": "message", "channel": "C1", "channel_type": "channel", "user": "UALICE", "text": "hi",
            "ts": "1.000001"}
    return {"event_id": "Ev1", "event": {**base, **fields}}


async def test_messages_to_the_bot_and_the_rest(slack: Slack) -> None:
    _, update = await slack.parse("events_api", event(text=f"<@{BOT}>  what   now <@UOTHER>"), "e1")
    assert update is not None and update.mentioned and update.text == "what now <@UOTHER>"
    assert update.chat == "C1:1.000001" and update.group  # a thread under the message is the session
    _, quiet = await slack.parse("events_api", event(text="among ourselves"), "e2")
    assert quiet is not None and not quiet.mentioned
    _, direct = await slack.parse("events_api", event(channel="D1", channel_type="im", text="a &lt;b&gt; &amp;"), "e3")
    assert direct is not None and direct.mentioned and direct.chat == "D1" and direct.text == "a <b> &"
    for passed_over in (event(type="app_mention"), event(subtype="message_changed"), event(bot_id="B1"),
                        event(user=BOT), event(subtype="channel_join")):
        event_id, nothing = await slack.parse("events_api", passed_over, "e4")
        assert nothing is None and event_id == "Ev1"
    assert await slack.parse("slash_commands", {"command": "/x"}, "e5") == ("e5", None)


async def test_an_envelope_that_cannot_be_read_is_passed_over_and_acknowledged(slack: Slack) -> None:
    taken: list[tuple[str, object]] = []
    acknowledged: list[str] = []

    async def take(event_id: str, update: object) -> bool:
        taken.append((event_id, update))
        return True

    class Socket:
        async def send_socket_mode_response(self, response: SocketModeResponse) -> None:
            acknowledged.append(response.envelope_id)

    slack._take = take
    for n, odd in enumerate(({"event_id": "Ev1", "event": "a string"},  # AttributeError deep in the reading
                             {"event": {"type": "message", "user": "U1", "text": "hi", "channel": "C1"}})):
        await slack._envelope(Socket(), SocketModeRequest(type="events_api", envelope_id=f"env{n}", payload=odd))
    assert taken == [("env0", None), ("env1", None)]  # logged, taken as nothing for the agent ...
    assert acknowledged == ["env0", "env1"]  # ... and acknowledged, so Slack does not send it again


async def test_a_message_is_one_event_by_its_channel_and_ts_whatever_slack_numbered_it(slack: Slack) -> None:
    first_id, first = await slack.parse("events_api", event(), "e1")
    retried = {**event(), "event_id": "Ev2"}  # Slack's retry, or the same message read back from the history
    second_id, second = await slack.parse("events_api", retried, "e2")
    assert first_id == second_id == "msg:C1:1.000001" and first is not None and second is not None
    assert first.event_id == second.event_id == first_id
    other_id, _ = await slack.parse("events_api", event(channel="C2"), "e3")
    assert other_id != first_id


async def test_a_thread_the_bot_spoke_in_needs_no_mention(slack: Slack) -> None:
    _, before = await slack.parse("events_api", event(thread_ts="1.000001", ts="1.000002"), "e1")
    assert before is not None and not before.mentioned
    await slack.bus.redis.set(slack.bus.keys.channel_thread("slack", "C1:1.000001"), "1")
    _, after = await slack.parse("events_api", event(thread_ts="1.000001", ts="1.000003"), "e2")
    assert after is not None and after.mentioned and after.chat == "C1:1.000001"


async def test_a_button_press_is_a_press_answered_to_its_presser(slack: Slack) -> None:
    payload = {"type": "block_actions", "trigger_id": "t1", "user": {"id": "UBOB", "username": "bob"},
               "channel": {"id": "D1"}, "container": {"message_ts": "5.5", "channel_id": "D1"},
               "message": {"ts": "5.5"}, "actions": [{"value": "ap:9:o"}]}
    event_id, update = await slack.parse("interactive", payload, "env")
    assert event_id == "press:t1" and update is not None
    assert (update.press, update.data, update.user, update.platform_message) == ("D1:UBOB", "ap:9:o", "UBOB", "5.5")


async def test_the_bot_token_goes_only_to_slack_file_hosts(slack: Slack) -> None:
    for url in ("https://attacker.test/steal", "file:///etc/passwd", "https://files.slack.com.attacker.test/x"):
        with pytest.raises(PlatformRefused, match="not on a Slack file host"):
            await slack.fetch_file(ChannelFile(ref=url, name="x", size=1), 1 << 20)
    with pytest.raises(PlatformRefused, match="over the 10"):
        await slack.fetch_file(ChannelFile(ref="https://files.slack.com/x", name="x", size=11), 10)


def test_mrkdwn_escapes_everything_that_could_mention_or_link() -> None:
    said = slack_mrkdwn("hi **you** <!channel> <@U1> & [click](https://evil.test) `a<b` ```x<y```")
    assert "<" not in said and ">" not in said.replace("&gt;", "")
    assert said.startswith("hi *you* &lt;!channel&gt; &lt;@U1&gt; &amp; click (https://evil.test)")
    pieces = fitted("<" * 5000, 3000, slack_mrkdwn)
    assert all(len(p) <= 3000 for p in pieces) and "".join(pieces) == "&lt;" * 5000


def test_each_platform_checks_its_own_settings() -> None:
    with pytest.raises(ValidationError, match="Slack member ids"):
        SlackSettings.model_validate({"allow_from": ["@alice"]})
    with pytest.raises(ValidationError, match="email addresses"):
        EmailSettings.model_validate({"allow_from": ["12345"]})
    with pytest.raises(ValidationError, match="only for a server on this machine"):
        EmailSettings.model_validate({"tls": "none", "smtp_host": "smtp.example.com"})
    settings = ChannelSettings.model_validate({"slack": {"enabled": True, "bot_token": "xoxb-1"},
                                               "email": {"enabled": True, "trust_from_header": True}})
    assert settings.enabled() == ["slack", "email"]
    assert settings.of("slack").missing() == ["app_token"]
    assert settings.of("email").missing() == ["imap_host", "smtp_host", "username", "address", "password"]
    assert settings.of("slack").secrets() == {"bot_token": "xoxb-1", "app_token": "", "signing_secret": ""}
