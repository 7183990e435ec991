"""The Discord channel's guards, without a server: what the model's text becomes, and where files come from."""

from __future__ import annotations

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
