"""A turn's streamed text: the first piece at once, then what came meanwhile as one delta, nothing lost."""

from __future__ import annotations

import asyncio

from brain.stream import Deltas


async def test_the_first_piece_goes_at_once_and_the_next_ones_wait_for_one_delta() -> None:
    sent: list[str] = []
    deltas = Deltas(sent.append, every_s=60)
    await deltas("Hel")
    assert sent == ["Hel"]  # time to first token is not held back
    await deltas("lo, ")
    await deltas("world")
    assert sent == ["Hel"]
    deltas.flush()  # the model call ended: what is held goes before anything else the turn sends
    assert sent == ["Hel", "lo, world"]
    deltas.flush()
    assert sent == ["Hel", "lo, world"]  # nothing held, nothing sent


async def test_a_held_piece_goes_when_its_time_comes_without_another_chunk() -> None:
    arrived = asyncio.Event()
    sent: list[str] = []

    def send(text: str) -> None:
        sent.append(text)
        arrived.set()

    deltas = Deltas(send, every_s=0.01)
    await deltas("a")
    arrived.clear()
    await deltas("b")  # the provider then goes quiet: the piece must not wait for the end of the call
    await asyncio.wait_for(arrived.wait(), 5)
    assert sent == ["a", "b"]


async def test_zero_sends_every_chunk_as_it_comes() -> None:
    sent: list[str] = []
    deltas = Deltas(sent.append, every_s=0)
    for piece in ("a", "b", "c"):
        await deltas(piece)
    assert sent == ["a", "b", "c"]
