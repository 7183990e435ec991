"""The limiter: gates taken together, FIFO admission, and slots back on every path."""

from __future__ import annotations

import asyncio

import pytest

from bus.protocol import ErrorCode
from hands.config import ConcurrencySettings, QueueSettings
from hands.errors import ToolFailure
from hands.limits import Limiter, memory_used_share


def limiter(**queue) -> Limiter:
    return Limiter(ConcurrencySettings.model_validate({"global": 2, "file": 1}), QueueSettings(**queue))


async def test_waiters_are_admitted_in_arrival_order() -> None:
    lim, order = limiter(), []
    release = asyncio.Event()

    async def use(name: str) -> None:
        async with lim.slot("file_operation", "read_file", None):
            order.append(name)
            await release.wait()

    tasks = [asyncio.create_task(use(str(n))) for n in range(4)]
    await asyncio.sleep(0.01)
    assert order == ["0"] and lim.waiting == 3  # file category allows one
    release.set()
    await asyncio.gather(*tasks)
    assert order == ["0", "1", "2", "3"]
    assert not +lim._in_use  # every slot came back


async def test_cancelled_waiter_and_cancelled_holder_give_everything_back() -> None:
    lim = limiter()
    holding, forever = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with lim.slot("file_operation", "t", None):
            holding.set()
            await forever.wait()

    holder = asyncio.create_task(hold())
    await holding.wait()
    waiter = asyncio.create_task(hold())
    await asyncio.sleep(0.01)
    assert lim.waiting == 1
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert lim.waiting == 0
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)
    assert not +lim._in_use
    async with lim.slot("file_operation", "t", None):  # and the gate opens again
        pass


async def test_queue_full_and_timeout() -> None:
    lim = limiter(depth=1, wait_s=0.05)
    forever = asyncio.Event()

    async def hold() -> None:
        async with lim.slot("file_operation", "t", None):
            await forever.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiting = asyncio.create_task(hold())
    await asyncio.sleep(0.01)
    with pytest.raises(ToolFailure) as full:
        async with lim.slot("file_operation", "t", None):
            pass
    assert full.value.code is ErrorCode.QUEUE_FULL
    with pytest.raises(ToolFailure) as timed_out:
        await waiting
    assert timed_out.value.code is ErrorCode.QUEUE_TIMEOUT
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)
    assert not +lim._in_use and lim.waiting == 0


def test_memory_share_reads_proc_meminfo(tmp_path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000 kB\nMemFree: 10 kB\nMemAvailable:    250 kB\n")
    assert memory_used_share(meminfo) == 0.75
    assert memory_used_share(tmp_path / "missing") == 0.0
    assert 0 < memory_used_share() < 1  # this machine's
