"""The Discord channel's guards, without a server: what the model's text becomes, and where files come from."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bus.protocol import ChannelFile
from gateway.channels.config import DiscordSettings
from gateway.channels.discord_bot import Discord, markdown
from gateway.channels.errors import PlatformRefused
from gateway.channels.markup import fitted
from tests.fakes import fake_bus


def test_the_models_words_ping_no_one_and_hide_no_link() -> None:
    person, role = "<@123456789012345678>", "<@&456789012345678901>"
    said = markdown(f"hi @everyone and @here, {person} {role} [docs](https://evil.test/x) **bold** `code`")
    assert not any(ping in said for ping in ("@everyone", "@here", person, role))
    assert "docs (https://evil.test/x)" in said and "**bold**" in said and "`code`" in said
    assert all(len(piece) <= 2000 for piece in fitted("@everyone " * 600, 2000, markdown))


async def test_files_come_only_from_discords_file_hosts() -> None:
    bus = fake_bus()
    discord = Discord(DiscordSettings.model_validate({"bot_token": "t"}), bus)
    for url in ("https://attacker.test/x.txt", "file:///etc/passwd", "http://169.254.169.254/latest/meta-data"):
        with pytest.raises(PlatformRefused, match="not on a Discord file host"):
            await discord.fetch_file(ChannelFile(ref=url, name="x", size=1), 1 << 20)
    with pytest.raises(PlatformRefused, match="over the 10"):
        await discord.fetch_file(ChannelFile(ref="https://cdn.discordapp.com/a", name="x", size=11), 10)
    await bus.close()


async def test_a_conversation_quiet_past_its_keep_leaves_the_set_caught_up_on() -> None:
    bus = fake_bus()
    discord = Discord(DiscordSettings.model_validate({"bot_token": "t"}), bus)
    read: list[int] = []

    class Channel:
        def __init__(self, chat: int) -> None:
            self.chat = chat

        async def history(self, **_: object) -> AsyncIterator[object]:
            read.append(self.chat)
            return
            yield

    class Client:
        def get_partial_messageable(self, chat: int) -> Channel:
            return Channel(chat)

    discord._client = Client()  # type: ignore[assignment]
    await bus.redis.sadd(discord._seen_key("*"), "111", "222")
    await bus.redis.set(discord._seen_key("111"), "5")  # spoken in lately; 222's marker has lapsed
    await discord._catch_up()
    assert read == [111]
    assert await bus.redis.smembers(discord._seen_key("*")) == {b"111"}
    await bus.close()
