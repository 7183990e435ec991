"""Order per chat (gateway/channels/lanes.py): a chat's messages are admitted one at a time in the order they
were handed in, whichever is quicker to get there; other chats and a running turn never wait."""

from __future__ import annotations

import asyncio

from gateway.channels.lanes import Lanes


async def _steps(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)  # work of n event-loop steps (a Redis round trip, say)


async def test_a_chats_messages_are_admitted_in_the_order_handed_in_and_turns_run_on() -> None:
    lanes, admitted_in, running = Lanes(), [], asyncio.Event()

    async def message(n: int) -> None:
        async with lanes.turn("chat") as admitted:
            await _steps(20 - 4 * n)  # the later a message, the quicker its way to admission
            admitted_in.append(n)
            admitted()
            if n == 0:
                await running.wait()  # the first turn runs on while the rest are admitted behind it

    first = asyncio.create_task(message(0))
    await asyncio.gather(*(message(n) for n in range(1, 5)))
    assert admitted_in == [0, 1, 2, 3, 4] and not first.done()
    running.set()
    await first
    assert not lanes._locks and not lanes._users  # an idle lane is forgotten


async def test_another_chat_never_waits_and_a_failed_message_lets_the_next_in() -> None:
    lanes, done = Lanes(), []
    held = asyncio.Event()

    async def stuck() -> None:
        async with lanes.turn("a"):
            held.set()
            await asyncio.Event().wait()  # never admitted, never ends (until cancelled)

    async def failing() -> None:
        async with lanes.turn("b"):
            raise RuntimeError("the platform refused it")

    async def next_in(chat: str) -> None:
        async with lanes.turn(chat) as admitted:
            admitted()
            done.append(chat)

    blocker = asyncio.create_task(stuck())
    await held.wait()
    try:
        await asyncio.gather(failing(), return_exceptions=True)
        await asyncio.wait_for(asyncio.gather(next_in("b"), next_in("c")), 5)
        assert done == ["b", "c"]
    finally:
        blocker.cancel()
