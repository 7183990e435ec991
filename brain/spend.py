"""The spend governor: what every model call costs, counted across all the Brains of a pool, and limits
that no call can pass.

Before a call, its cost bound (the prompt's tokens, counted generously, at the input price, plus the most
it may write at the output price) is reserved in Redis, in one script, against every budget the call
counts in: the pool's, its agent's and its identity's, each over a day and a month. A budget already
reached (what was spent plus what calls in flight hold) refuses the call, which is then never made; so
a budget is passed by at most the bound of the last call it admitted. After the call the provider's own
token counts settle it: the bound is released and the real cost added. Money fails closed: a call that
ended without those counts (cancelled, past the turn's deadline, broken off, failed after it was sent) is
settled at what it may have cost, its prompt and what it streamed at least, and each retry or fallback
inside it is settled so too; only a request that provably never reached the provider is free. A Brain
killed mid-call leaves its hold behind; holds lapse after a deadline and are swept by the next
reservation, which charges each its prompt.

Amounts are integers of micro-dollars in Redis, so concurrent additions are exact.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from brain.config import BrainSettings
from brain.llm import LOCAL, Attempt, retry_pause
from brain.model_table import table_entries
from brain.tokens import MESSAGE_OVERHEAD, tokens
from bus.errors import PincerError
from bus.loops import Background
from bus.metrics import Meter
from bus.outcome import failure
from bus.protocol import ChannelSend, ToolSpec
from bus.scripts import ScriptCall, lua
from bus.streams import Bus
from memory.jobs import Job, JobStore
from memory.spend import MICRO, Budget, budgets_of
from memory.spend import report as spend_report

log = logging.getLogger("brain.spend")

PROMPT_MARGIN = 1.25  # the counted prompt tokens times this: tokenizers differ from cl100k by less
THREAD_OVER_CHARS = 50_000  # a prompt longer than this is counted in a thread (it takes milliseconds)
HELD_PAUSE_S = 0.05  # first wait for calls in flight to settle, doubling to 1 s

# KEYS: holds, this hold, then the budgets. ARGV: now, deadline, bound, hold id, hold key prefix, floor (what
# the call costs if its Brain dies: its prompt), then each budget's limit (-1: none) and keep s.
# {0}: reserved; {i, spent, held}: budget i (1-based) is reached. A lapsed hold is swept and charged its floor.
RESERVE = lua("brain.spend.reserve", """
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 50)
for _, id in ipairs(expired) do
  local hold = ARGV[5] .. id
  local bound = tonumber(redis.call('HGET', hold, 'bound') or '0')
  local floor = tonumber(redis.call('HGET', hold, 'floor') or '0')
  local held_in = redis.call('HGET', hold, 'keys')
  if held_in then
    for key in string.gmatch(held_in, '[^\\n]+') do
      redis.call('HINCRBY', key, 'held', -bound)
      redis.call('HINCRBY', key, 'spent', floor)
    end
  end
  redis.call('DEL', hold)
  redis.call('ZREM', KEYS[1], id)
end
local n = #KEYS - 2
for i = 1, n do
  local limit = tonumber(ARGV[5 + 2 * i])
  if limit >= 0 then
    local spent = tonumber(redis.call('HGET', KEYS[2 + i], 'spent') or '0')
    local held = tonumber(redis.call('HGET', KEYS[2 + i], 'held') or '0')
    if spent + held >= limit then return {i, spent, held} end
  end
end
for i = 1, n do
  redis.call('HINCRBY', KEYS[2 + i], 'held', ARGV[3])
  redis.call('EXPIRE', KEYS[2 + i], ARGV[6 + 2 * i])
end
redis.call('HSET', KEYS[2], 'bound', ARGV[3], 'floor', ARGV[6], 'keys', table.concat(KEYS, '\\n', 3))
redis.call('EXPIRE', KEYS[2], math.ceil(tonumber(ARGV[2]) - tonumber(ARGV[1])) + 60)
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
return {0}
""")
# KEYS: holds, this hold (may be gone), then the budgets. ARGV: cost, hold id, model ('': a hold given
# back, no call), prompt tokens, output tokens, cached tokens (of the prompt's), then each budget's limit
# (-1: none) and keep s, then the alert shares (per mille).
# Returns {i, per mille, spent} for each alert share newly reached.
SETTLE = lua("brain.spend.settle", """
local bound = tonumber(redis.call('HGET', KEYS[2], 'bound') or '0')
local held = redis.call('DEL', KEYS[2]) == 1
redis.call('ZREM', KEYS[1], ARGV[2])
local n = #KEYS - 2
local reached = {}
for i = 1, n do
  local key = KEYS[2 + i]
  if held then redis.call('HINCRBY', key, 'held', -bound) end
  local spent = redis.call('HINCRBY', key, 'spent', ARGV[1])
  if ARGV[3] ~= '' then
    redis.call('HINCRBY', key, 'calls', 1)
    redis.call('HINCRBY', key, 'input_tokens', ARGV[4])
    redis.call('HINCRBY', key, 'output_tokens', ARGV[5])
    redis.call('HINCRBY', key, 'cached_tokens', ARGV[6])
    redis.call('HINCRBY', key, 'model:' .. ARGV[3], ARGV[1])
  end
  redis.call('EXPIRE', key, ARGV[6 + 2 * i])
  local limit = tonumber(ARGV[5 + 2 * i])
  if limit >= 0 then
    for s = 7 + 2 * n, #ARGV do
      local share = tonumber(ARGV[s])
      if spent * 1000 >= limit * share and redis.call('HSETNX', key, 'alerted:' .. share, 1) == 1 then
        table.insert(reached, {i, share, spent})
      end
    end
  end
end
return reached
""")


class BudgetExceeded(PincerError):
    """A call refused before it was made: the budget it would pass (named as its setting)."""


@dataclass(frozen=True)
class Price:
    input_per_mtok: float
    output_per_mtok: float
    cached_per_mtok: float | None = None  # prompt tokens read from the provider's cache (None: as input)

    def micro(self, prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> int:
        """The cost of that many tokens, in micro-dollars (rounded up: a bound is never short). ``cached_tokens``
        are of the prompt's, priced at the cached rate."""
        cached = min(max(cached_tokens, 0), prompt_tokens)
        rate = self.input_per_mtok if self.cached_per_mtok is None else self.cached_per_mtok
        return math.ceil((prompt_tokens - cached) * self.input_per_mtok + cached * rate
                         + output_tokens * self.output_per_mtok)


@dataclass
class Hold:
    hold_id: str
    budgets: list[Budget] = field(default_factory=list)
    bound: int = 0
    prompt: int = 0  # the prompt's tokens, as counted for the bound (what a call without usage is charged)


class Governor:
    def __init__(self, bus: Bus, settings: BrainSettings, meter: Meter, *, clock: Any = time.time) -> None:
        self.bus, self.settings, self.meter, self.clock = bus, settings, meter, clock
        self.budget = settings.budget
        self.limited = self.budget.limited()
        self.zone = ZoneInfo(self.budget.timezone)
        self.jobs = JobStore(bus)
        self._reserve = bus.redis.register_script(RESERVE)
        self._telling = Background()  # alerts found by settles sent without waiting

    # --- what a call counts in ---

    def budgets(self, agent: str, identity: str, job: Job | None = None) -> list[Budget]:
        """Every budget a call of ``agent`` for ``identity`` (and ``job``) counts in, limited or only counted,
        day and month."""
        return budgets_of(self.bus, self.budget, datetime.fromtimestamp(self.clock(), self.zone), agent, identity,
                          job)

    def price(self, model: str) -> Price | None:
        return price_of(self.settings, model)

    # --- before and after a call ---

    async def reserve(self, agent: str, identity: str, models: list[str], messages: list[dict[str, Any]],
                      tools: list[ToolSpec], *, job: str | None = None) -> Hold | None:
        """The call's bound held in every budget it counts in (None when no limit applies: only counted after);
        BudgetExceeded when one is reached."""
        scheduled = await self.jobs.get(job) if job else None
        if not self.limited and (scheduled is None or scheduled.daily_usd is None):
            return None
        prices = [(model, self.price(model)) for model in models]
        unpriced = [model for model, price in prices if price is None]
        if unpriced:
            raise BudgetExceeded(f"model {unpriced[0]} has no price, so no call of it can be held to brain.budget: "
                                 f"set brain.prices.{unpriced[0]} (input_per_mtok and output_per_mtok, USD)")
        prompt = await prompt_bound(messages, tools)
        bound = max(price.micro(prompt, self.budget.max_output_tokens) for _, price in prices if price)
        floor = max(price.micro(prompt, 0) for _, price in prices if price)
        hold = Hold(hold_id=uuid.uuid4().hex, budgets=self.budgets(agent, identity, scheduled), bound=bound,
                    prompt=prompt)
        keys = [self.bus.keys.spend_holds, self.bus.keys.spend_hold(hold.hold_id), *(b.key for b in hold.budgets)]
        give_up, pause = time.monotonic() + self._longest_call_s(), HELD_PAUSE_S
        while True:
            now = self.clock()
            args: list[Any] = [now, now + self._longest_call_s(), bound, hold.hold_id, self.bus.keys.spend_hold(""),
                               floor]
            for budget in hold.budgets:
                args.extend((budget.limit, budget.keep_s))
            said = await self._reserve(keys=keys, args=args)
            if int(said[0]) == 0:
                return hold
            reached, spent, held = hold.budgets[int(said[0]) - 1], int(said[1]), int(said[2])
            if spent >= reached.limit or time.monotonic() > give_up:
                break
            # Not spent yet, but calls in flight hold the rest: wait for them to settle (at the edge of a
            # budget calls go one at a time, so it is passed by one call's cost at most).
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
        self.meter.count("pincer_budget_refusals", reached.name)
        raise BudgetExceeded(f"{reached.what} budget is spent: ${spent / MICRO:.4f} of ${reached.limit / MICRO:.2f}"
                             + (f" (${held / MICRO:.4f} more held by calls in flight)" if held else "")
                             + f"; no model call is made until it renews, or {reached.name} is raised")

    async def settle(self, hold: Hold | None, agent: str, identity: str, model: str, usage: dict[str, Any], *,
                     job: str | None = None) -> float:
        """The call's real cost (the provider's token counts at the model's price) recorded, its hold released,
        and each alert share newly reached told once; the cost in USD."""
        budgets = hold.budgets if hold else await self._budgets_of(agent, identity, job)
        return await self._record(budgets, hold.hold_id if hold else "", agent, identity, model, usage, wait=True)

    async def settle_call(self, hold: Hold | None, agent: str, identity: str, attempts: list[Attempt],
                          messages: list[dict[str, Any]], tools: list[ToolSpec], *, job: str | None = None,
                          max_output_tokens: int | None = None, wait: bool = True) -> float:
        """Every request of one call recorded at what it may have cost, its hold released; the cost in USD.

        A request the provider counted costs its counts. One it did not (cancelled, past a deadline, broken off
        mid-stream, failed after it was sent) costs at least its prompt, counted as for the bound, and what it
        streamed, widened as the prompt is (at most ``max_output_tokens``): Pincer cannot tell what the provider
        read, and a budget fails closed. Only a request that provably never reached it (``Attempt.unsent``) is
        free; a call none of whose requests did gives its hold back.

        ``wait=False``: the cost is known here, and its writes go out with the Brain's next ones (before its
        record and its reply, in order), not awaited: a turn does not wait a round trip for them. Until they
        land the call's hold still counts, so a budget is never read as less spent than it is.
        """
        budgets = hold.budgets if hold else await self._budgets_of(agent, identity, job)
        prompt = hold.prompt if hold and hold.prompt else None
        hold_id, cost = hold.hold_id if hold else "", 0.0
        for attempt in attempts:
            if attempt.unsent and not attempt.usage:
                continue
            usage = dict(attempt.usage)
            if not usage.get("prompt_tokens") or usage.get("completion_tokens") is None:
                prompt = await prompt_bound(messages, tools) if prompt is None else prompt
                streamed = await streamed_bound(attempt.streamed, max_output_tokens or self.budget.max_output_tokens)
                usage = {"prompt_tokens": usage.get("prompt_tokens") or prompt,
                         "completion_tokens": usage.get("completion_tokens", streamed)}
                self.meter.count("pincer_model_calls_estimated", attempt.model)
                log.info("model call settled without the provider's usage: %s tokens in, %s out (%s, %s)",
                         usage["prompt_tokens"], usage["completion_tokens"], attempt.model, identity or "-")
            cost += await self._record(budgets, hold_id, agent, identity, attempt.model, usage, wait=wait)
            hold_id = ""  # the hold is released with the first; the others only add
        if hold_id:
            await self._record(budgets, hold_id, agent, identity, "", {}, wait=wait)
        return cost

    async def release(self, hold: Hold | None) -> None:
        """A call that was never made (or provably never reached the provider): its hold given back."""
        if hold is not None:
            await self.settle(hold, "", "", "", {})

    async def _budgets_of(self, agent: str, identity: str, job: str | None) -> list[Budget]:
        return self.budgets(agent, identity, await self.jobs.get(job) if job else None)

    async def _record(self, budgets: list[Budget], hold_id: str, agent: str, identity: str, model: str,
                      usage: dict[str, Any], *, wait: bool) -> float:
        """One request's cost added to ``budgets`` (and hold ``hold_id`` released, '': none), in one script sent
        with the Brain's other writes (awaited, or not: ``wait``)."""
        prompt, output = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        cached = min(max(int(usage.get("cached_tokens") or 0), 0), prompt)  # of the prompt's, from the cache
        price = self.price(model)
        cost = price.micro(prompt, output, cached) if price else 0
        hold_id = hold_id or uuid.uuid4().hex  # no hold: the script finds none to release
        keys = [self.bus.keys.spend_holds, self.bus.keys.spend_hold(hold_id), *(b.key for b in budgets)]
        args: list[Any] = [cost, hold_id, model, prompt, output, cached]
        for budget in budgets:
            args.extend((budget.limit, budget.keep_s))
        args.extend(round(share * 1000) for share in self.budget.alerts)

        build = ScriptCall(SETTLE, tuple(keys), tuple(args)).add
        if model:
            self.meter.count("pincer_model_cost_usd", model, agent, identity, value=cost / MICRO)
        if wait:
            await self._told(budgets, (await self.bus.batcher.run(build))[0])
        else:
            self.bus.batcher.send(build, done=lambda outcome: self._settled(budgets, outcome))
        return cost / MICRO

    def _settled(self, budgets: list[Budget], outcome: list[Any] | Exception) -> None:
        """A settle sent without waiting has landed (or failed: its hold then lapses, charged its prompt)."""
        error = failure(outcome)
        if error is not None:
            log.error("a model call's cost was not recorded (Redis away?): %s; a hold it had lapses later and is "
                      "charged its prompt", error)
            return
        assert not isinstance(outcome, Exception)
        if outcome[0]:
            self._telling.start(self._told(budgets, outcome[0]))

    async def _told(self, budgets: list[Budget], reached: list[Any]) -> None:
        """Each alert share the settle found newly reached, told once."""
        for index, share, spent in reached:
            await self._alert(budgets[int(index) - 1], int(share) / 1000, int(spent))

    async def _alert(self, budget: Budget, share: float, spent: int) -> None:
        text = (f"{budget.what} budget is {share:.0%} spent: ${spent / MICRO:.2f} of ${budget.limit / MICRO:.2f} "
                f"({budget.name})")
        log.warning("budget alert: %s", text)
        self.meter.count("pincer_budget_alerts", budget.name, f"{share:g}")
        await self.bus.redis.xadd(self.bus.keys.alerts, {"kind": "budget", "budget": budget.name,
                                                         "scope": budget.scope, "share": share,
                                                         "spent_usd": spent / MICRO, "limit_usd": budget.limit / MICRO,
                                                         "text": text, "at": self.clock()},
                                  maxlen=self.bus.settings.alerts_maxlen, approximate=True)
        for target in self.budget.notify:  # the channel sends it once (the key), whoever tells it again
            channel, _, chat = target.partition(":")
            await self.bus.publish(self.bus.keys.channel_outbox(channel), ChannelSend(
                channel=channel, chat=chat, text=f"Pincer: {text}", key=f"alert:{budget.key}:{share:g}"))

    def _longest_call_s(self) -> float:
        """How long a call may take with its retries and fallbacks: past this its hold has lapsed."""
        retries = self.settings.llm_retries
        per_model = self.settings.llm_timeout_s * (retries + 1) + sum(retry_pause(n) for n in range(retries))
        return per_model * (len(self.settings.fallbacks) + 1) + 60.0


async def prompt_bound(messages: list[dict[str, Any]], tools: list[ToolSpec]) -> int:
    """The prompt's tokens, counted with cl100k over its JSON (quotes and keys included) and widened by
    PROMPT_MARGIN: above what any provider's tokenizer counts for it."""
    text = json.dumps(messages, ensure_ascii=False) + json.dumps([spec.model_dump() for spec in tools])
    count = await asyncio.to_thread(tokens, text) if len(text) > THREAD_OVER_CHARS else tokens(text)
    return math.ceil(count * PROMPT_MARGIN) + MESSAGE_OVERHEAD * (len(messages) + len(tools)) + 16


async def streamed_bound(pieces: list[str], most: int) -> int:
    """The output tokens a request may have cost by what it streamed (text, tool names and arguments), counted
    and widened as a prompt is, but no more than the ``most`` it was allowed to write."""
    text = "".join(pieces)
    if not text:
        return 0
    count = await asyncio.to_thread(tokens, text) if len(text) > THREAD_OVER_CHARS else tokens(text)
    return min(most, math.ceil(count * PROMPT_MARGIN) + MESSAGE_OVERHEAD)


def price_of(settings: BrainSettings, model: str) -> Price | None:
    """The configured price, else litellm's table's; the local model is free; None: unknown."""
    configured = settings.prices.get(model)
    if configured is not None:
        return Price(configured.input_per_mtok, configured.output_per_mtok, configured.cached_input_per_mtok)
    if model == LOCAL or model.startswith("local/"):
        return Price(0.0, 0.0)
    return table_price(model)


def table_price(model: str) -> Price | None:
    """litellm's price for a model, by its full name or without the provider's prefix."""
    for info in table_entries(model):
        if info.get("input_cost_per_token") is not None:
            cached = info.get("cache_read_input_token_cost")
            return Price(float(info["input_cost_per_token"]) * MICRO,
                         float(info.get("output_cost_per_token") or 0) * MICRO,
                         float(cached) * MICRO if cached is not None else None)
    return None


async def report(bus: Bus, settings: BrainSettings, *, clock: Any = time.time) -> dict[str, Any]:
    """What `pincer budget` shows (``memory.spend.report``, which the Gateway's ``/v1/spend`` reads too)."""
    return await spend_report(bus, settings.budget, settings.agent_ids(), clock=clock)
