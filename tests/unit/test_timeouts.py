"""time_limit: a tool call's limit, with asyncio.timeout's contract."""

import asyncio

import pytest

from hands.timeouts import time_limit


async def test_a_call_past_its_limit_raises_timeout_error() -> None:
    with pytest.raises(TimeoutError), time_limit(0.01):
        await asyncio.sleep(5)


async def test_a_call_within_its_limit_is_untouched() -> None:
    with time_limit(5) as limit:
        await asyncio.sleep(0)
    assert not limit.expired
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_cancel_from_outside_stays_a_cancel() -> None:
    started = asyncio.Event()

    async def call() -> None:
        with time_limit(5):
            started.set()
            await asyncio.sleep(5)

    task = asyncio.create_task(call())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancel_arriving_with_the_limit_stays_a_cancel() -> None:
    limits: list[time_limit] = []

    async def call() -> None:
        with time_limit(5) as limit:
            limits.append(limit)
            await asyncio.sleep(5)

    task = asyncio.create_task(call())
    await asyncio.sleep(0)
    limits[0]._expire()  # the limit fires (as its timer would) and someone else cancels before the task runs
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert limits[0].expired


async def test_outside_a_task_it_says_so() -> None:
    failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    def callback() -> None:  # a loop callback runs outside any task
        try:
            with time_limit(1):
                pass
        except RuntimeError as exc:
            failed.set_result(exc)

    asyncio.get_running_loop().call_soon(callback)
    assert "inside a task" in str(await failed)
