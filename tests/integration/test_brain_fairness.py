"""A busy session does not keep other sessions waiting: messages queued behind their session's
earlier turn give their turn slot away."""

from __future__ import annotations

import asyncio
from pathlib import Path

from brain.config import BrainSettings
from brain.llm import Completion
from brain.worker import BrainWorker
from bus.protocol import ChatError, ChatMessage, ChatReply
from bus.replies import ReplyInbox
from bus.streams import Bus
from hands.config import HandsSettings
from hands.worker import HandsWorker
from tests.conftest import async_wait_until


class GatedLLM:
    """Answers each message with its text; holds the answer to ``hold`` until ``gate`` opens."""

    def __init__(self, hold: str) -> None:
        self.hold, self.gate, self.order = hold, asyncio.Event(), []

    async def complete(self, messages, tools, on_text, **_options) -> Completion:
        text = messages[-1]["content"]
        if text == self.hold:
            await self.gate.wait()
        self.order.append(text)
        return Completion(text=f"re {text}", model="fake")


async def test_a_backlog_in_one_session_does_not_block_another_session(bus: Bus, tmp_path: Path) -> None:
    llm = GatedLLM(hold="a1")
    brain = BrainWorker(bus, BrainSettings(max_turns=2, max_waiting=8), instance_id="brain-f", llm=llm,
                        heartbeat_s=0.5)
    hands = HandsWorker(bus, HandsSettings(workspace=tmp_path), worker_id="hands-f", heartbeat_s=0.5)
    stop = asyncio.Event()
    running = [asyncio.create_task(brain.run(stop)), asyncio.create_task(hands.run(stop))]
    inbox = ReplyInbox(bus, "gateway-f", block_ms=100)
    await inbox.start()
    replies: dict[str, asyncio.Future[ChatReply]] = {}

    async def send(session: str, seq: int) -> None:
        message = ChatMessage(session_id=session, text=f"{session}{seq}", reply_to=inbox.stream, seq=seq)
        replies[message.text] = asyncio.ensure_future(
            inbox.request(bus.keys.brain_inbox, message, message.message_id, timeout=30,
                          final=(ChatReply, ChatError)))
        await asyncio.sleep(0.05)  # in this order on the stream

    try:
        for seq in range(1, 6):  # a1 is slow; a2..a5 queue behind it, more than the Brain has turn slots
            await send("a", seq)
        await send("b", 1)
        reply = await asyncio.wait_for(replies["b1"], 10)  # answered while a1 still runs
        assert reply.text == "re b1" and not replies["a1"].done()
        assert brain.consumer.waiting == 4  # a2..a5 wait for a1 without a turn slot
        llm.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(*(replies[f"a{n}"] for n in range(1, 6))), 20)
        assert [a.text for a in answers] == [f"re a{n}" for n in range(1, 6)]
        assert [t for t in llm.order if t.startswith("a")] == [f"a{n}" for n in range(1, 6)]  # still in order
        # Every slot came back: none lost, none gained.
        await async_wait_until(lambda: brain.consumer.in_flight == 0, what="the turns' tasks to end")
        assert brain.consumer.waiting == 0 and brain.consumer._slots.free == 2
    finally:
        llm.gate.set()  # a failed assertion must not leave a1's turn running for ever
        stop.set()
        await asyncio.gather(*running)
        await inbox.close()
