"""An in-memory broker for unit tests of stream handlers (the way FastStream's TestBroker stands in for one).

    broker = TestBroker()
    broker.subscribe(bus.keys.hands_requests, worker.handle)
    await broker.publish(bus.keys.hands_requests, ToolsList(reply_to="test:inbox"))
    assert isinstance(broker.sent["test:inbox"][0], ToolsAvailable)

A published message is encoded and decoded as it would cross Redis, handed straight to the handler
subscribed to its stream, and the handler's replies are published the same way (to their own
handlers, if any): no Redis, no consumer loop, nothing to wait for. What a handler does with the
bus itself (a record it keeps, a stream it reads) still needs one (``tests.fakes.fake_bus``).
"""

from __future__ import annotations

from collections import defaultdict

from bus.codec import decode, encode
from bus.consumer import Handler, Reply, current_entry, delivery
from bus.protocol import BaseMessage, Message, now_ms

MAX_HOPS = 100  # replies publishing replies: a loop between handlers ends here, loudly


class TestBroker:
    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.sent: dict[str, list[Message]] = defaultdict(list)
        self._entries = 0

    def subscribe(self, stream: str, handler: Handler) -> None:
        self.handlers[stream] = handler

    async def publish(self, stream: str, message: BaseMessage, *, _hops: int = 0) -> list[Reply]:
        """Deliver ``message`` (as it would cross Redis) to ``stream``'s handler; its replies, delivered too."""
        if _hops > MAX_HOPS:
            raise RuntimeError(f"more than {MAX_HOPS} replies in a chain: handlers answer each other in a loop")
        fields = encode(message)
        crossed = decode(fields)
        self.sent[stream].append(crossed)
        handler = self.handlers.get(stream)
        if handler is None:
            return []
        self._entries += 1
        # As a consumer sets them: the entry's id is a Redis stream id, its time now.
        entry = current_entry.set((stream, f"{now_ms()}-{self._entries}", fields))
        first = delivery.set(1)
        try:
            replies = list(await handler(crossed, stream))
        finally:
            current_entry.reset(entry)
            delivery.reset(first)
        for reply_stream, reply in replies:
            await self.publish(reply_stream, reply, _hops=_hops + 1)
        return replies
