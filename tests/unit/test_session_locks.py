"""One session's turns run one at a time and in order; other sessions do not wait."""

from __future__ import annotations

import asyncio

from brain.worker import SessionLocks


async def test_same_session_serialises_other_sessions_overlap() -> None:
    locks, log = SessionLocks(), []

    async def turn(session: str, name: str) -> None:
        async with locks.hold(session):
            log.append(f"start {name}")
            await asyncio.sleep(0.02)
            log.append(f"end {name}")

    await asyncio.gather(turn("a", "a1"), turn("a", "a2"), turn("b", "b1"))
    assert log.index("end a1") < log.index("start a2")  # in order, never interleaved
    assert log.index("start b1") < log.index("end a1")  # another session ran meanwhile
    assert not locks._locks and not locks._users  # nothing kept for idle sessions
