"""Reads sent in another step's write: a caller adds its commands to someone else's pipeline and reads its
own results back (a Brain adds a turn's first reads to the step that takes the session: one round trip for
all of them, not one each)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Carried(Generic[T]):
    """``build`` adds ``size`` commands to a pipeline; ``read`` makes their results (in order) a value."""

    build: Callable[[Any], object]
    size: int
    read: Callable[[list[Any]], T]


def together(reads: Sequence[Carried[Any] | None]) -> tuple[Callable[[Any], object], Callable[[list[Any]], list[Any]]]:
    """One build adding every read's commands (a None is none), and what splits their results into each
    read's value (None for a None)."""
    present = [read for read in reads if read is not None]

    def build(pipe: Any) -> None:
        for read in present:
            read.build(pipe)

    def split(results: list[Any]) -> list[Any]:
        values: list[Any] = []
        start = 0
        for read in reads:
            if read is None:
                values.append(None)
                continue
            values.append(read.read(results[start:start + read.size]))
            start += read.size
        if start != len(results):
            raise ValueError(f"{len(results)} results for {start} commands carried")
        return values

    return build, split
