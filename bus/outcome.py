"""A write's outcome, as a batcher tells it to a write sent without waiting: what failed it, and the default
of logging that (no Redis client here: a process that only names these, the supervisor's, imports none)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("bus.batching")

Done = Callable[[list[Any] | Exception], None]
"""Told a write's outcome: its commands' results (a refused command's error among them), or the
error that failed the whole pipeline (Redis away)."""


def failure(outcome: list[Any] | Exception) -> Exception | None:
    """What failed a write, if anything: the pipeline's error, else its first refused command's."""
    if isinstance(outcome, Exception):
        return outcome
    return next((r for r in outcome if isinstance(r, Exception)), None)


def log_failure(outcome: list[Any] | Exception, what: str = "a write sent without waiting") -> None:
    """The default ``Done``: a failed write is logged, as ``what`` failed."""
    error = failure(outcome)
    if error is not None:
        log.warning("%s failed: %s", what, error)
