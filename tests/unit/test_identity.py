"""bus.identity.ByIdentity: made once per object, by identity, never by an equal object or a reused id."""

from __future__ import annotations

from bus.identity import ByIdentity


def test_made_once_per_object_and_again_for_an_equal_but_other_one() -> None:
    made: list[list[int]] = []
    lengths = ByIdentity(lambda key: made.append(key) or len(key))
    first = [1, 2, 3]
    assert lengths(first) == 3 and lengths(first) == 3 and made == [first]
    assert lengths([1, 2, 3]) == 3 and len(made) == 2  # equal, not the same object: made again


def test_the_key_is_kept_alive_so_its_id_is_never_another_objects() -> None:
    lengths = ByIdentity(len)
    assert lengths([1, 2]) == 2  # the list is held by the cache: its id cannot be handed to the next one
    assert lengths([1, 2, 3, 4]) == 4


def test_past_its_size_all_are_dropped() -> None:
    boxes = [[n] for n in range(3)]
    twice = ByIdentity(lambda key: key * 2, size=2)
    for box in boxes:
        twice(box)
    assert len(twice) == 1  # the third found two kept, dropped them, and is kept alone
