"""Who ``allow_from`` lets in, on every platform's form of it: ids match ids, ``@name`` entries match handles
only, and a handle only for the first user id seen with it (a handle can be changed and taken, an id not)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bus.streams import Bus
from gateway.channels.access import Access, unpair
from gateway.channels.matrix import user_key
from tests.fakes import fake_bus as in_memory_bus

DISCORD_ID = "123456789012345678"


@pytest.fixture
async def fake_bus() -> AsyncIterator[Bus]:
    bus = in_memory_bus()
    yield bus
    await bus.close()


def access(bus: Bus, channel: str, *allow_from: str) -> Access:
    return Access(bus, channel, allow_from=list(allow_from), agent="main", pairing_ttl_s=600)


@pytest.mark.parametrize(("channel", "allowed", "impostor"), [
    ("discord", DISCORD_ID, "999999999999999999"),
    ("telegram", "111222333", "444555666"),
    ("slack", "U0123ABCD", "U0999ZZZZ"),
])
async def test_a_handle_that_spells_an_allowed_id_lets_no_one_in(fake_bus: Bus, channel: str, allowed: str,
                                                                  impostor: str) -> None:
    door = access(fake_bus, channel, allowed)
    for handle in (allowed, allowed.lower(), f"@{allowed}", ""):
        assert await door.identity(impostor, handle) is None, handle
    assert await door.identity(allowed, "anything at all") is not None  # the id itself, whatever its name


async def test_an_at_entry_follows_the_first_id_seen_with_the_handle_not_the_name(fake_bus: Bus) -> None:
    door = access(fake_bus, "discord", DISCORD_ID, "@Carol")
    assert await door.identity("200", "carol") is not None  # bound to 200 now
    assert await door.identity("200", "carol.renamed") is not None  # renamed: still her
    assert await door.identity("300", "carol") is None  # whoever takes the name later is not
    assert await door.identity("300", "Carol") is None
    assert await door.identity("400", DISCORD_ID) is None  # an id is never matched by a handle ...
    assert await access(fake_bus, "telegram", "@200").identity("200", "bob") is None  # ... nor a handle by an id
    # The operator frees the handle: its next holder is bound instead; unpairing the id frees it too.
    assert await unpair(fake_bus, "discord", "@carol")
    assert await door.identity("300", "carol") is not None and await door.identity("200", "x") is None
    assert await unpair(fake_bus, "discord", "300") and await door.identity("300", "carol") is not None


async def test_ids_that_start_with_at_and_email_domains_keep_their_meaning(fake_bus: Bus) -> None:
    matrix = access(fake_bus, "matrix", "@alice:example.org")  # the handle a Matrix id gives is the id itself
    assert await matrix.identity(user_key("@alice:example.org"), "alice:example.org") is not None
    assert await matrix.identity(user_key("@alice:evil.example"), "alice:evil.example") is None
    assert await matrix.identity(user_key("@mallory:evil.example"), "alice:example.org") is None
    email = access(fake_bus, "email", "ana@example.com", "@family.example")
    assert await email.identity("ana@example.com", "ana@example.com") is not None
    assert await email.identity("bo@family.example", "bo@family.example") is not None  # a whole domain
    assert await email.identity("eve@evil.example", "eve@evil.example") is None
