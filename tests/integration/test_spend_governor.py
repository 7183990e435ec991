"""The spend governor on a real Redis, with several Brains and a priced fake provider that bills what it
serves: a budget is passed by one call's cost at most, the meter matches the provider's own count, each
alert is told once, and past a budget no call reaches the provider."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from brain.config import BrainSettings
from brain.llm import Attempt, Completion
from brain.spend import MICRO, BudgetExceeded, Governor, report
from brain.testing import FunctionModel
from bus.codec import decode
from bus.metrics import Meter
from bus.protocol import ChatError, ChatMessage, ChatReply, ErrorCode, ToolSpec
from bus.replies import ReplyInbox
from bus.streams import Bus
from memory.jobs import Job, JobStore
from memory.schedule import Schedule
from tests.conftest import async_wait_until

MODEL = "fake/priced"
PRICES = {MODEL: {"input_per_mtok": 1000.0, "output_per_mtok": 3000.0}}


class PricedProvider:
    """Answers every call after a moment (so calls from many sessions overlap) and keeps its own bill."""

    def __init__(self) -> None:
        self.calls = self.prompt = self.output = self.billed = 0
        self.largest = 0  # micro-dollars of the dearest single call

    async def __call__(self, messages: list[dict[str, Any]], _tools: list[ToolSpec]) -> Completion:
        await asyncio.sleep(0.02)
        prompt, output = 40 + 3 * len(messages), 5 + len(str(messages[-1].get("content"))) % 7
        cost = math.ceil(prompt * 1000.0 + output * 3000.0)
        self.calls, self.prompt, self.output = self.calls + 1, self.prompt + prompt, self.output + output
        self.billed, self.largest = self.billed + cost, max(self.largest, cost)
        return Completion(text="ok", usage={"prompt_tokens": prompt, "completion_tokens": output,
                                            "total_tokens": prompt + output})


@pytest.fixture
def brains(brain_pool):
    """Start ``count`` Brains on the priced provider with these settings (and a Hands worker)."""
    async def start(provider: PricedProvider, count: int, **settings: Any) -> None:
        await brain_pool(BrainSettings(model=MODEL, prices=PRICES, tools_list_timeout_s=2.0, **settings),
                         FunctionModel(provider), count)

    return start


@pytest.fixture
async def say(bus: Bus):
    inbox = ReplyInbox(bus, "gateway-spend", block_ms=100)
    await inbox.start()

    async def send(text: str, session_id: str, sender: str = "owner", job: str | None = None) -> ChatReply | ChatError:
        message = ChatMessage(session_id=session_id, text=text, reply_to=inbox.stream, sender=sender, job=job)
        async with inbox.expect(message.message_id) as queue:
            await bus.publish(bus.keys.brain_inbox, message)
            async with asyncio.timeout(60):
                while not isinstance(event := await queue.get(), (ChatReply, ChatError)):
                    pass
        return event

    yield send
    await inbox.close()


async def spent(bus: Bus, scope: str) -> dict[str, int]:
    governor = Governor(bus, BrainSettings(), Meter())
    key = next(b.key for b in governor.budgets("main", "owner") if b.key.endswith(scope) and ":day:" in b.key)
    raw: dict[bytes, bytes] = await bus.redis.hgetall(key)
    return {k.decode(): int(v) for k, v in raw.items() if not k.startswith(b"alerted")}


async def test_many_sessions_on_three_brains_stop_at_the_pools_budget_and_the_meter_matches(
        bus: Bus, brains, say) -> None:
    provider = PricedProvider()
    await brains(provider, 3, budget={"daily_usd": 1.0, "monthly_usd": 50.0, "max_output_tokens": 64,
                                      "notify": ["telegram:42"]})

    async def session(n: int) -> list[ChatReply | ChatError]:
        return [await say(f"message {m} of session {n}", session_id=f"s{n}") for m in range(3)]

    finals = [final for ended in await asyncio.gather(*(session(n) for n in range(20))) for final in ended]
    answered = [f for f in finals if isinstance(f, ChatReply)]
    refused = [f for f in finals if isinstance(f, ChatError)]
    assert answered and refused and len(answered) + len(refused) == 60
    assert {f.code for f in refused} == {ErrorCode.BUDGET_EXCEEDED}
    assert all("brain.budget.daily_usd" in f.message and "the pool's day budget is spent" in f.message
               for f in refused)

    pool = await spent(bus, ":pool")
    assert provider.calls == len(answered) == pool["calls"]  # a refused turn never reached the provider
    assert (pool["spent"], pool["input_tokens"], pool["output_tokens"]) == \
        (provider.billed, provider.prompt, provider.output)  # the meter is the provider's own count
    assert MICRO <= pool["spent"] <= MICRO + provider.largest  # passed by one call's cost at most
    assert pool["held"] == 0  # every hold settled

    async def three_told() -> list[Any]:  # each told once its call's settle lands, after that call's reply
        found = await bus.redis.xrange(bus.keys.alerts)
        sent = await bus.redis.xrange(bus.keys.channel_outbox("telegram"))
        return found if len(found) >= 3 and len(sent) >= 3 else []

    alerts = await async_wait_until(three_told, timeout=10, what="the three alerts")
    told = sorted((f[b"budget"].decode(), float(f[b"share"])) for _, f in alerts)
    assert told == [("brain.budget.daily_usd", 0.5), ("brain.budget.daily_usd", 0.8),
                    ("brain.budget.daily_usd", 1.0)]  # each once, none for the month (at 2%)
    sent = [decode(f) for _, f in await bus.redis.xrange(bus.keys.channel_outbox("telegram"))]
    assert sorted(m.text.split(" spent")[0] for m in sent) == [
        f"Pincer: the pool's day budget is {share}" for share in ("100%", "50%", "80%")]  # to the owner's chat
    assert {m.chat for m in sent} == {"42"} and len({m.key for m in sent}) == 3

    calls = provider.calls
    after = await asyncio.gather(*(say("one more", session_id=f"late{n}") for n in range(5)))
    assert all(isinstance(f, ChatError) and f.code is ErrorCode.BUDGET_EXCEEDED for f in after)
    assert provider.calls == calls


async def test_an_identitys_budget_stops_only_that_identity(bus: Bus, brains, say) -> None:
    provider = PricedProvider()
    await brains(provider, 1, budget={"per_identity": {"daily_usd": 0.2},
                                      "identities": {"boss": {"daily_usd": 5.0}}})
    alice = [await say(f"hi {n}", session_id="a", sender="alice") for n in range(6)]
    assert [type(f) for f in alice[:2]] == [ChatReply, ChatReply]
    stopped = alice[-1]
    assert isinstance(stopped, ChatError) and stopped.code is ErrorCode.BUDGET_EXCEEDED
    assert "alice's day budget is spent" in stopped.message and "brain.budget.per_identity.daily_usd" in stopped.message
    assert isinstance(await say("and me?", session_id="b", sender="bob"), ChatReply)
    boss = [await say(f"go {n}", session_id="c", sender="boss") for n in range(6)]
    assert all(isinstance(final, ChatReply) for final in boss)


async def test_a_jobs_own_budget_stops_only_its_turns(bus: Bus, brains, say) -> None:
    provider = PricedProvider()
    await brains(provider, 1)  # no limit of the pool's: only the job's own
    job = Job(name="digest", owner="owner", message="m", daily_usd=0.1,
              schedule=Schedule(kind="every", every_s=3600, anchor=time.time() + 3600))
    await JobStore(bus).add(job)
    runs = [await say(f"run {n}", session_id="owner/cron-digest", job=job.id) for n in range(4)]
    assert [type(f) for f in runs[:2]] == [ChatReply, ChatReply]
    stopped = runs[-1]
    assert isinstance(stopped, ChatError) and stopped.code is ErrorCode.BUDGET_EXCEEDED
    assert "the job owner/digest's day budget is spent" in stopped.message and "--daily-usd" in stopped.message
    assert isinstance(await say("not the job", session_id="mine"), ChatReply)  # the owner's own turns go on
    shown = await report(bus, BrainSettings(model=MODEL, prices=PRICES))
    row = next(r for r in shown["budgets"] if r["scope"] == "job:owner/digest" and r["period"].startswith("day"))
    assert row["limit_usd"] == 0.1 and row["calls"] == 2


async def test_an_unpriced_model_under_a_budget_is_refused_saying_what_to_set(bus: Bus, brains, say) -> None:
    provider = PricedProvider()
    await brains(provider, 1, budget={"daily_usd": 1.0}, fallbacks=["nobody/knows-this-model"])
    final = await say("hello", session_id="u")
    assert isinstance(final, ChatError) and final.code is ErrorCode.BUDGET_EXCEEDED
    assert "brain.prices.nobody/knows-this-model" in final.message and provider.calls == 0


async def test_a_hold_left_by_a_killed_brain_lapses_and_a_budget_renews_each_day(bus: Bus) -> None:
    now = [1_800_000_000.0]  # 2027-01-15, UTC
    settings = BrainSettings(model=MODEL, prices=PRICES, budget={"daily_usd": 0.5, "max_output_tokens": 64},
                             llm_timeout_s=10, llm_retries=0)
    governor = Governor(bus, settings, Meter(), clock=lambda: now[0])
    messages = [{"role": "user", "content": "hello"}]
    lost = await governor.reserve("main", "owner", [MODEL], messages, [])
    assert lost is not None and lost.bound > 0  # its Brain is killed: never settled
    pool = lost.budgets[0].key
    assert int(await bus.redis.hget(pool, "held")) == lost.bound
    now[0] += 71  # past the call's deadline (10 s, no retries, + 60)
    second = await governor.reserve("main", "owner", [MODEL], messages, [])
    assert second is not None and int(await bus.redis.hget(pool, "held")) == second.bound  # the lost one swept
    floor = lost.prompt * 1000  # ... and charged its prompt: its provider may have read it (money fails closed)
    assert floor > 0 and int(await bus.redis.hget(pool, "spent")) == floor
    await governor.settle(second, "main", "owner", MODEL, {"prompt_tokens": 400, "completion_tokens": 40})
    await governor.settle(None, "main", "owner", MODEL, {"prompt_tokens": 10, "completion_tokens": 0})
    shown = f"{(530_000 + floor) / MICRO:.4f}".replace(".", r"\.")
    with pytest.raises(BudgetExceeded, match=rf"the pool's day budget is spent: \${shown} of \$0\.50"):
        await governor.reserve("main", "owner", [MODEL], messages, [])
    now[0] += 86_400  # the next day: a fresh budget
    assert await governor.reserve("main", "owner", [MODEL], messages, []) is not None


async def test_a_settle_not_waited_for_keeps_its_hold_until_it_lands_before_the_next_write(bus: Bus) -> None:
    """A turn does not wait for its call's settle: the cost comes back at once, the hold still counts until the
    write lands, and it lands before anything the Brain writes after it (its record, its reply)."""
    settings = BrainSettings(model=MODEL, prices=PRICES, budget={"daily_usd": 0.5, "max_output_tokens": 64})
    governor = Governor(bus, settings, Meter())
    messages = [{"role": "user", "content": "hello"}]
    hold = await governor.reserve("main", "owner", [MODEL], messages, [])
    assert hold is not None
    pool = hold.budgets[0].key
    usage = {"prompt_tokens": 400, "completion_tokens": 40}  # $0.52: past the day's $0.50
    cost = await governor.settle_call(hold, "main", "owner", [Attempt(model=MODEL, usage=usage)], messages, [],
                                      wait=False)
    assert cost == pytest.approx(0.52)
    assert int(await bus.redis.hget(pool, "held")) == hold.bound  # not landed yet: the bound still counts
    await bus.batcher.run(lambda pipe: pipe.set(f"{bus.keys.prefix}after", 1))  # a later write
    assert int(await bus.redis.hget(pool, "held")) == 0 and int(await bus.redis.hget(pool, "spent")) == 520_000
    told = await async_wait_until(lambda: bus.redis.xrange(bus.keys.alerts), timeout=10, what="the alert")
    assert [float(f[b"share"]) for _, f in told] == [0.5, 0.8, 1.0]  # told from the write's outcome


def test_budget_settings_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="alerts are shares of a limit"):
        BrainSettings(budget={"alerts": [50]})
    with pytest.raises(ValueError, match="IANA time zone"):
        BrainSettings(budget={"timezone": "Mars/Olympus"})
    assert not BrainSettings().budget.limited()
    assert BrainSettings(budget={"agents": {"x": {"daily_usd": 0}}}).budget.limited()
