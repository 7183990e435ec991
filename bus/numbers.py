"""Whole numbers in text that people, browsers and platforms send."""

from __future__ import annotations


def whole_number(text: str, *, digits: int = 18) -> int | None:
    """``text`` as a whole number, or None unless it is 1 to ``digits`` ASCII digits: ``str.isdigit`` passes
    "²", which ``int`` refuses, and ``int`` refuses more than 4,300 digits, each a crash where it was trusted."""
    if 0 < len(text) <= digits and text.isascii() and text.isdigit():
        return int(text)
    return None
