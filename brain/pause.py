"""A test seam: a Brain told to pause at a named point of a turn stops there for good, so a test kills it there.

``PINCER_TEST_PAUSE_AT=<point>`` in a Brain's environment (read once, by ``brain.main``) names the point:

- ``answered``: a model response is in the record and the transcript; nothing has acted on it yet;
- ``results``: a response's tool results are in the transcript; the next model request is not sent yet.

A turn that reaches the point logs ``paused at <point>`` and waits there until the process is killed. It is
not a setting (nothing a person runs should pause), and unset it costs one comparison at each point.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Literal, get_args

from bus.config import ConfigError

log = logging.getLogger("brain.pause")

ENV = "PINCER_TEST_PAUSE_AT"
Point = Literal["answered", "results"]


def from_environment(env: Mapping[str, str]) -> str:
    """The point named in ``env`` ("" for none); a name that is no point is refused, not ignored."""
    point = env.get(ENV, "")
    if point and point not in get_args(Point):
        raise ConfigError(f"{ENV}={point!r} names no point of a turn; the points: {', '.join(get_args(Point))}")
    return point


async def pause(point: Point, at: str) -> None:
    """Stop here for good when ``at`` (the Brain's configured point) is ``point``."""
    if point != at:
        return
    log.warning("paused at %s (%s is set: a test kills this Brain now)", point, ENV)
    await asyncio.Event().wait()
