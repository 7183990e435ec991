"""Result shaping: keep what the LLM is given under a byte budget, visibly."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MARKER = "\n…[truncated by Pincer: {cut:,} of {total:,} bytes cut. Ask for a smaller part (e.g. offset/limit).]"


@dataclass
class Batch:
    """What a batch tool returns: one dict per item, each with ``success`` (and ``error`` when false)."""

    items: list[dict[str, Any]]


def size_of(data: Any) -> int:
    """Bytes of the data as JSON, the form it reaches the LLM in."""
    return len(json.dumps(data, ensure_ascii=False, default=str).encode())


def shape(data: Any, limit: int) -> tuple[Any, bool]:
    """``(data, truncated)``: data cut to at most ``limit`` bytes of JSON, with a marker where it was cut.

    The biggest text field of a result is cut first, so its structure survives;
    anything else that is too big becomes its own cut JSON text.
    """
    if isinstance(data, str) and len(data) * 6 + 2 <= limit:
        return data, False  # fits however it is escaped (6 bytes a character at most); no need to measure
    if size_of(data) <= limit:
        return data, False
    if isinstance(data, dict):
        texts = [k for k, v in data.items() if isinstance(v, str)]
        if texts:
            key = max(texts, key=lambda k: len(data[k]))
            shaped = _fit(lambda cut: {**data, key: cut}, data[key], limit)
            if shaped is not None:
                return shaped, True
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)
    shaped = _fit(lambda cut: cut, text, limit)
    return (shaped if shaped is not None else MARKER.format(cut=len(text.encode()), total=len(text.encode()))), True


def _fit(wrap: Any, text: str, limit: int) -> Any | None:
    """Cut ``text`` until ``wrap(cut text)`` fits in ``limit`` bytes; None if even an empty cut does not."""
    raw = text.encode()
    budget = len(raw)
    for _ in range(8):  # JSON escaping may grow the text; shrink by the overshoot until it fits
        head = raw[: max(0, budget)].decode("utf-8", errors="ignore")
        candidate = wrap(head + MARKER.format(cut=len(raw) - len(head.encode()), total=len(raw)))
        over = size_of(candidate) - limit
        if over <= 0:
            return candidate
        if budget <= 0:
            return None
        budget -= over + 16
    return None
