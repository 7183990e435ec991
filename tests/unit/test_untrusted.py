"""What platforms send, read without trusting it: one bad event or file is passed over, never the read."""

from __future__ import annotations

import pytest

from bus.protocol import ChannelUpdate
from bus.redis_client import RedisAway
from gateway.channels.errors import PlatformAway
from gateway.channels.untrusted import file_of, files_of, read_each


def _update(n: int) -> ChannelUpdate:
    if n == 2:
        raise ValueError("an event no parser expected")
    return ChannelUpdate(channel="t", event_id=str(n), user="u", chat="c", text=str(n))


async def test_an_event_that_cannot_be_read_is_passed_over_and_the_rest_are_read() -> None:
    async def read(n: int) -> ChannelUpdate | None:
        return None if n == 4 else _update(n)

    assert [u.text for u in await read_each(range(1, 6), read, what="test")] == ["1", "3", "5"]
    assert [u.text for u in await read_each([1, 2, 3], _update, what="test")] == ["1", "3"]  # a plain function too


@pytest.mark.parametrize("away", [RedisAway("gone"), PlatformAway("rate limited")])
async def test_redis_or_the_platform_away_fails_the_read_to_be_made_again(away: Exception) -> None:
    def read(n: int) -> ChannelUpdate:
        if n == 2:
            raise away
        return _update(n)

    with pytest.raises(type(away)):
        await read_each([1, 2, 3], read, what="test")


@pytest.mark.parametrize(("described", "kept"), [
    (("ref", "a.txt", 3, "text/plain"), ("a.txt", 3, "text/plain")),
    (("ref", "n" * 300, -1, "m" * 300), ("n" * 255, 0, "")),
    (("ref", "two\nlines\x00", "12", None), ("two lines\x00", 0, "")),
    (("ref", None, True, "text/\x07plain"), ("file", 0, "")),
])
def test_a_files_name_type_and_size_are_cut_to_fit_or_read_as_unknown(described: tuple, kept: tuple) -> None:
    found = file_of(*described)
    assert found is not None and (found.name, found.size, found.mime) == kept


@pytest.mark.parametrize("ref", ["", "r" * 513, None, 12, ["ref"]])
def test_a_file_with_no_reference_to_fetch_it_by_is_passed_over(ref: object) -> None:
    assert file_of(ref, "a.txt", 1, "text/plain") is None
    assert len(files_of([file_of(ref, "a", 1, ""), *[file_of("r", f"{n}", 1, "") for n in range(12)]])) == 10
