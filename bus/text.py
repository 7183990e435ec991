"""What Redis answered, as text (redis-py gives bytes, or str on a connection that decodes responses),
and text matched as it is by a Redis MATCH pattern."""

from __future__ import annotations

import re


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def literal(value: str) -> str:
    """``value`` as a MATCH pattern that matches only itself."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", value)
