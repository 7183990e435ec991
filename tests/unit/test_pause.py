"""The Brain's test seam (brain/pause.py): a point is named or refused, and a point not named is passed."""

from __future__ import annotations

import pytest

from brain.pause import ENV, from_environment, pause
from bus.config import ConfigError


def test_the_point_is_read_from_the_environment_and_a_wrong_name_refused() -> None:
    assert from_environment({}) == ""
    assert from_environment({ENV: "answered"}) == "answered"
    with pytest.raises(ConfigError, match="'answerd' names no point of a turn; the points: answered, results"):
        from_environment({ENV: "answerd"})


async def test_a_point_not_named_is_passed() -> None:  # the named one holds: tests/e2e/test_turn_kill_points.py
    await pause("answered", "")
    await pause("answered", "results")
