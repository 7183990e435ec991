"""Money fails closed: a model call that ends without the provider's usage costs what it may have cost.

Real Brains call the scripted OpenAI-compatible server on loopback over HTTP (litellm's road and the openai
SDK's), priced by brain.prices, on a real Redis. The server keeps every request the moment it arrives, as a
provider that bills the prompt it read. A call past the turn's deadline, a stream the provider breaks off,
each retry inside a call: each is settled at its prompt and what it streamed at least, so the governor's
spend is never below what the provider could bill; a budget spent by such calls refuses the next one; and
only a request that never reached the provider (no connection made) is free.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from typing import Any

import pytest

from brain.config import BrainSettings
from brain.llm import Attempt, warm_up
from brain.spend import MICRO, Governor, report
from brain.tokens import count, tokens
from brain.worker import default_llm
from bus.metrics import Meter
from bus.protocol import ChatCancel, ChatDelta, ChatError, ChatReply, ErrorCode
from bus.streams import Bus
from tests.conftest import async_wait_until
from tests.scripted_llm import ScriptedLLM

MODEL = "openai/scripted"
PER_TOKEN = 1000  # micro-dollars a token, in and out: $1,000 a million
PRICES = {MODEL: {"input_per_mtok": PER_TOKEN, "output_per_mtok": PER_TOKEN}}
ROADS = [pytest.param(False, id="litellm"), pytest.param(True, id="openai-sdk")]


@pytest.fixture
def priced(pool, scripted_llm: ScriptedLLM):
    """A Brain (and Hands) whose model is the scripted server, priced, through litellm or the openai SDK."""
    async def start(*, direct: bool, api_base: str | None = None, **settings: Any) -> None:
        if not direct:
            await asyncio.to_thread(warm_up)  # litellm's import takes seconds: not inside a turn's deadline
        values = {"model": MODEL, "api_base": api_base or scripted_llm.api_base, "api_key": "sk-scripted",
                  "prices": PRICES, "openai_direct": direct, "llm_retries": 0, "llm_timeout_s": 20, **settings}
        await pool(default_llm(BrainSettings(**values)), **values)

    return start


async def meter(bus: Bus, scope: str = "pool") -> dict[str, int]:
    """This day's budget hash of ``scope``: spent and held (micro-dollars), calls, tokens."""
    budgets = Governor(bus, BrainSettings(), Meter()).budgets("main", "owner")
    key = next(b.key for b in budgets if b.scope == scope and b.period.startswith("day"))
    raw: dict[bytes, bytes] = await bus.redis.hgetall(key)
    return {k.decode(): int(v) for k, v in raw.items() if not k.startswith((b"alerted", b"model:"))}


def prompt_price(body: dict[str, Any]) -> int:
    """What a provider bills for a request's prompt, counted with the project's tokenizer (micro-dollars)."""
    return PER_TOKEN * (count(body["messages"]) + tokens(json.dumps(body.get("tools", []))))


def streamed_price(events: list[Any]) -> int:
    """What the text a person saw stream costs as output (micro-dollars)."""
    return PER_TOKEN * tokens("".join(e.text for e in events if isinstance(e, ChatDelta)))


@pytest.mark.parametrize("direct", ROADS)
async def test_a_call_past_the_turns_deadline_costs_its_prompt_and_what_streamed(
        bus: Bus, priced, chat, scripted_llm: ScriptedLLM, direct: bool) -> None:
    await priced(direct=direct, max_turn_s=1.5, budget={"daily_usd": 1000})
    events = await chat("DRIP 0.02", session_id="late")
    final = events[-1]
    assert isinstance(final, ChatError) and final.code is ErrorCode.BUDGET_EXHAUSTED, final
    assert "brain.max_turn_s" in final.message
    assert streamed_price(events) > 0  # it was cut off mid-answer, without the provider's usage
    [request] = scripted_llm.requests
    spent = await meter(bus)
    assert spent["spent"] >= prompt_price(request) + streamed_price(events) > 0
    assert spent["calls"] == 1 and spent["held"] == 0


@pytest.mark.parametrize("direct", ROADS)
async def test_a_provider_failing_mid_stream_costs_its_prompt_and_what_streamed(
        bus: Bus, priced, chat, scripted_llm: ScriptedLLM, direct: bool) -> None:
    await priced(direct=direct, llm_retries=2, budget={"daily_usd": 1000})
    events = await chat("BREAK 4 after a few words of an answer", session_id="broken")
    # Reset mid-stream: litellm says so; the direct road reads a plain end, but with no finish reason and no
    # [DONE] it is an error too, never half an answer. It is never tried again, and it costs what the
    # provider read and sent.
    final = events[-1]
    assert isinstance(final, ChatError), final
    assert len(scripted_llm.requests) == 1
    assert streamed_price(events) > 0
    spent = await meter(bus)
    assert spent["spent"] >= prompt_price(scripted_llm.requests[0]) + streamed_price(events)
    assert spent["calls"] == 1 and spent["held"] == 0


@pytest.mark.parametrize("direct", ROADS)
async def test_each_try_inside_a_call_is_counted_and_none_is_hidden_in_litellm(
        bus: Bus, priced, chat, scripted_llm: ScriptedLLM, direct: bool) -> None:
    await priced(direct=direct, llm_retries=2, budget={"daily_usd": 1000})
    answered = (await chat("FLAKY 2 then answer", session_id="flaky"))[-1]
    assert isinstance(answered, ChatReply) and answered.text == "echo: FLAKY 2 then answer"
    assert len(scripted_llm.requests) == 3  # two refused with a 503, then answered: the Brain's own retries
    first = await meter(bus)
    billed_usage = PER_TOKEN * (11 + 7)  # the scripted provider's usage for the answer
    assert first["spent"] >= 2 * prompt_price(scripted_llm.requests[0]) + billed_usage
    assert first["calls"] == 3 and first["held"] == 0

    failed = (await chat("FLAKY 9 never answers", session_id="down"))[-1]
    assert isinstance(failed, ChatError) and failed.code is ErrorCode.SERVICE_UNAVAILABLE
    assert len(scripted_llm.requests) == 6  # three tries (llm_retries 2), each once: litellm retried none
    second = await meter(bus)
    assert second["spent"] - first["spent"] >= sum(prompt_price(r) for r in scripted_llm.requests[3:])
    assert second["calls"] == 6 and second["held"] == 0


@pytest.mark.parametrize("direct", ROADS)
async def test_a_call_that_never_reached_the_provider_costs_nothing(
        bus: Bus, priced, chat, direct: bool) -> None:
    with socket.socket() as probe:  # a port nobody listens on: every connection is refused
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    await priced(direct=direct, api_base=closed, llm_retries=1, llm_connect_patience_s=1.5, budget={"daily_usd": 0.5})
    final = (await chat("hello?", session_id="nobody"))[-1]
    assert isinstance(final, ChatError) and final.code is ErrorCode.SERVICE_UNAVAILABLE
    assert "cannot reach the model provider" in final.message
    spent = await meter(bus)
    assert (spent.get("spent", 0), spent.get("calls", 0), spent["held"]) == (0, 0, 0)


@pytest.mark.parametrize("direct", ROADS)
async def test_a_provider_that_refuses_connections_a_while_is_waited_for_at_no_cost(
        bus: Bus, priced, chat, direct: bool, caplog: pytest.LogCaptureFixture) -> None:
    probe = socket.socket()  # bound, not listening: every connection is refused, as while a server restarts
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    caplog.set_level(logging.INFO, logger="brain.llm")
    await priced(direct=direct, api_base=f"http://127.0.0.1:{port}/v1", llm_connect_patience_s=60)  # no retries
    answer = asyncio.create_task(chat("hello", session_id="late"))
    await async_wait_until(lambda: sum("model not reachable" in r.message for r in caplog.records) >= 2,
                           timeout=30, what="two refused tries")
    probe.close()
    late = ScriptedLLM(port=port).start()  # the provider is back
    try:
        final = (await answer)[-1]
        assert isinstance(final, ChatReply) and final.text == "echo: hello", final
        assert len(late.requests) == 1
        spent = await meter(bus)
        assert spent["calls"] == 1 and spent.get("held", 0) == 0  # the refused tries were free, not retries
    finally:
        late.stop()


async def test_calls_cut_short_spend_a_budget_and_the_next_call_is_refused_before_the_provider(
        bus: Bus, priced, chat, scripted_llm: ScriptedLLM) -> None:
    limit_usd = 0.5  # below one prompt of the Brain's (its system prompt alone is over 500 tokens)
    await priced(direct=False, max_turn_s=1.0, budget={"daily_usd": limit_usd, "max_output_tokens": 64})
    cut = (await chat("DRIP 0.02", session_id="cut"))[-1]
    assert isinstance(cut, ChatError) and cut.code is ErrorCode.BUDGET_EXHAUSTED
    assert (await meter(bus))["spent"] >= max(limit_usd * MICRO, prompt_price(scripted_llm.requests[0]))
    refused = (await chat("one more", session_id="next"))[-1]
    assert isinstance(refused, ChatError) and refused.code is ErrorCode.BUDGET_EXCEEDED
    assert "the pool's day budget is spent" in refused.message and "brain.budget.daily_usd" in refused.message
    assert len(scripted_llm.requests) == 1  # refused before the provider: that call cost nothing
    assert (await meter(bus))["calls"] == 1


async def test_a_cancel_sent_to_the_brain_mid_stream_costs_the_prompt_and_what_streamed(
        bus: Bus, priced, scripted_llm: ScriptedLLM) -> None:
    """The door every cancel ends at (the HTTP endpoint, a chat's /stop, a closed OpenAI stream)."""
    from bus.protocol import ChatMessage
    from bus.replies import ReplyInbox

    await priced(direct=True, budget={"daily_usd": 1000})
    inbox = ReplyInbox(bus, "gateway-cancel", block_ms=100)
    await inbox.start()
    try:
        message = ChatMessage(session_id="stopped", text="DRIP 0.02", reply_to=inbox.stream)
        events: list[Any] = []
        async with inbox.expect(message.message_id) as queue:
            await bus.publish(bus.keys.brain_inbox, message)
            async with asyncio.timeout(20):
                while not isinstance(event := await queue.get(), ChatDelta) or len(events) < 5:
                    events.append(event)
                await bus.publish(bus.keys.brain_control, ChatCancel(session_id="stopped", by="alice"))
                while not isinstance(event := await queue.get(), (ChatReply, ChatError)):
                    events.append(event)
    finally:
        await inbox.close()
    assert isinstance(event, ChatError) and event.code is ErrorCode.CANCELLED
    spent = await meter(bus)
    assert spent["spent"] >= prompt_price(scripted_llm.requests[0]) + streamed_price(events) > 0
    assert spent["calls"] == 1 and spent["held"] == 0


async def test_each_request_of_a_call_is_settled_by_what_is_known_of_it(bus: Bus) -> None:
    settings = BrainSettings(model=MODEL, prices=PRICES, budget={"daily_usd": 10, "max_output_tokens": 100})
    governor = Governor(bus, settings, Meter())
    messages = [{"role": "user", "content": "count me"}]
    hold = await governor.reserve("main", "owner", [MODEL], messages, [])
    assert hold is not None and hold.prompt > count(messages)
    attempts = [Attempt(model=MODEL, unsent=True),  # refused at connect: free
                Attempt(model=MODEL),  # sent, then nothing: its prompt
                Attempt(model=MODEL, streamed=["x" * 4000]),  # broken off past what it may write: capped
                Attempt(model=MODEL, usage={"prompt_tokens": 9, "completion_tokens": 3})]  # the provider's count
    cost = await governor.settle_call(hold, "main", "owner", attempts, messages, [], max_output_tokens=100)
    expected = PER_TOKEN * (hold.prompt + hold.prompt + 100 + 9 + 3)
    assert cost == pytest.approx(expected / MICRO)
    spent = await meter(bus)
    assert (spent["spent"], spent["calls"], spent["held"]) == (expected, 3, 0)
    assert spent["input_tokens"] == 2 * hold.prompt + 9 and spent["output_tokens"] == 100 + 3

    free = await governor.reserve("main", "owner", [MODEL], messages, [])
    assert await governor.settle_call(free, "main", "owner", [Attempt(model=MODEL, unsent=True)], messages,
                                      []) == 0.0
    assert (await meter(bus))["spent"] == expected and (await meter(bus))["held"] == 0  # given back whole


async def test_cached_prompt_tokens_are_priced_at_the_cached_rate(bus: Bus) -> None:
    priced = {MODEL: {"input_per_mtok": 2.0, "output_per_mtok": 8.0, "cached_input_per_mtok": 0.5}}
    governor = Governor(bus, BrainSettings(model=MODEL, prices=priced), Meter())
    first = [Attempt(model=MODEL, usage={"prompt_tokens": 1000, "completion_tokens": 10})]
    again = [Attempt(model=MODEL, usage={"prompt_tokens": 1000, "completion_tokens": 10, "cached_tokens": 800})]
    cold = await governor.settle_call(None, "main", "owner", first, [], [])
    warm = await governor.settle_call(None, "main", "owner", again, [], [])
    assert cold == pytest.approx((1000 * 2.0 + 10 * 8.0) / MICRO)
    assert warm == pytest.approx((200 * 2.0 + 800 * 0.5 + 10 * 8.0) / MICRO)  # the cache's share at its rate
    counted = await meter(bus)  # kept per period, for the hit rate `pincer budget` shows
    assert (counted["input_tokens"], counted["cached_tokens"]) == (2000, 800)
    row = next(r for r in (await report(bus, BrainSettings()))["budgets"] if r["scope"] == "pool")
    assert row["cache_hit"] == 0.4
    unpriced_cache = Governor(bus, BrainSettings(model=MODEL, prices={MODEL: {"input_per_mtok": 2.0,
                                                                            "output_per_mtok": 8.0}}), Meter())
    assert await unpriced_cache.settle_call(None, "main", "owner", again, [], []) == pytest.approx(cold)


def test_litellms_table_gives_a_cached_rate_where_it_has_one() -> None:
    from brain.spend import table_price

    price = table_price("openai/gpt-4o-mini")
    assert price is not None and price.cached_per_mtok is not None
    assert 0 < price.cached_per_mtok < price.input_per_mtok
