"""Whole numbers read from what people and platforms send."""

from __future__ import annotations

import pytest

from bus.numbers import whole_number


@pytest.mark.parametrize(("text", "number"), [("0", 0), ("7", 7), ("0042", 42), ("1" * 18, int("1" * 18))])
def test_ascii_digits_are_read(text: str, number: int) -> None:
    assert whole_number(text) == number


@pytest.mark.parametrize("text", ["", "-1", "+1", " 1", "1.0", "\u00b2", "\u0663", "\uff11", "1" * 19, "9" * 5000])
def test_anything_else_is_none_and_never_raises(text: str) -> None:
    assert whole_number(text) is None
