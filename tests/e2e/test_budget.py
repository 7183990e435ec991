"""The spend governor through the front door, with real Gateway, Brain and Hands processes and the scripted
model priced by brain.prices: an identity's budget refuses its next call (no request reaches the model), the
OpenAI SDK sees a 429 naming the budget, others go on, and `pincer budget` and /metrics show the spend."""

from __future__ import annotations

import json

import openai
import pytest

from tests.conftest import OWNER_TOKEN, Processes, gateway_client, wait_until
from tests.e2e.conftest import create_token, start_stack
from tests.e2e.test_observe import sample
from tests.e2e.test_openai_api import client
from tests.e2e.test_telegram import start_channel
from tests.fake_telegram import TOKEN, FakeTelegram
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.e2e

CALL_USD = (11 * 1000 + 7 * 1000) / 1e6  # the scripted model's usage (11 in, 7 out) at the prices below


def test_an_identity_past_its_budget_is_refused_before_the_model_and_the_spend_is_shown(
        processes: Processes, pincer_env: dict[str, str], scripted_llm: ScriptedLLM) -> None:
    processes.env = {**pincer_env,
                     "PINCER_BRAIN__PRICES": json.dumps({"openai/scripted": {"input_per_mtok": 1000,
                                                                             "output_per_mtok": 1000}}),
                     "PINCER_BRAIN__BUDGET__PER_IDENTITY__DAILY_USD": "0.05",
                     "PINCER_BRAIN__BUDGET__MAX_OUTPUT_TOKENS": "64"}
    start_stack(processes, hands=1)
    alice = client(processes.env, create_token(processes, "alice"))
    answers = 0
    with pytest.raises(openai.RateLimitError) as refused:
        for n in range(10):
            alice.chat.completions.create(model="pincer", messages=[{"role": "user", "content": f"hello {n}"}])
            answers += 1
    assert answers == 3  # $0.018 a call: the third passes $0.05, by less than one call
    assert refused.value.code == "BUDGET_EXCEEDED" and "brain.budget.per_identity.daily_usd" in str(refused.value)
    asked = len(scripted_llm.requests)
    with pytest.raises(openai.RateLimitError):
        alice.chat.completions.create(model="pincer", messages=[{"role": "user", "content": "please"}])
    assert len(scripted_llm.requests) == asked  # refused before the model was called

    owner = gateway_client(processes.env, token=OWNER_TOKEN)
    assert owner.post("/v1/sessions/mine/messages", json={"text": "still here?"}).json()["text"] == \
        "echo: still here?"

    shown = processes.run("budget", "--json")
    assert shown.returncode == 0, shown.stderr
    rows = {(row["scope"], row["period"].split(":")[0]): row for row in json.loads(shown.stdout)["budgets"]}
    day = rows[("identity:alice", "day")]
    assert day["calls"] == 3 and day["limit_usd"] == 0.05 and day["left_usd"] == 0.0
    assert day["spent_usd"] == pytest.approx(3 * CALL_USD) and day["held_usd"] == 0
    assert rows[("pool", "day")]["calls"] == len(scripted_llm.requests) == 4
    assert rows[("pool", "month")]["spent_usd"] == pytest.approx(4 * CALL_USD)
    def alerted() -> str | None:  # told once the third call's settle lands, just after its answer
        table = processes.run("budget", extra_env={"COLUMNS": "200"}).stdout
        return table if "alert: alice's day budget is 100% spent" in table else None

    assert "identity:alice" in wait_until(alerted, timeout=20, what="the 100% alert in `pincer budget`")

    def scraped() -> str | None:  # counters travel with the next heartbeat
        text = owner.get("/metrics").text
        return text if "pincer_budget_refusals" in text else None

    text = wait_until(scraped, timeout=20, what="the governor's counters in /metrics")
    assert sample(text, "pincer_model_cost_usd_total", identity="alice") == pytest.approx(3 * CALL_USD)
    assert sample(text, "pincer_budget_refusals_total", budget="brain.budget.per_identity.daily_usd") == 2


def test_a_chat_user_past_their_budget_is_told_so_in_their_chat_and_the_model_is_not_called(
        processes: Processes, pincer_env: dict[str, str], scripted_llm: ScriptedLLM, telegram: FakeTelegram) -> None:
    user = 777
    processes.env = {**pincer_env, "TG_TOKEN": TOKEN,
                     "PINCER_BRAIN__PRICES": json.dumps({"openai/scripted": {"input_per_mtok": 1000,
                                                                             "output_per_mtok": 1000}}),
                     "PINCER_BRAIN__BUDGET__IDENTITIES": json.dumps({f"telegram:{user}": {"daily_usd": 0.02}}),
                     "PINCER_CHANNELS__TELEGRAM__ENABLED": "true",
                     "PINCER_CHANNELS__TELEGRAM__BOT_TOKEN": "${TG_TOKEN}",
                     "PINCER_CHANNELS__TELEGRAM__API_URL": telegram.api_url,
                     "PINCER_CHANNELS__TELEGRAM__ALLOW_FROM": f'["{user}"]',
                     "PINCER_CHANNELS__TELEGRAM__POLL_TIMEOUT_S": "1",
                     "PINCER_CHANNELS__TELEGRAM__POLL_GRACE_S": "2"}
    start_stack(processes, hands=1)
    start_channel(processes, telegram)
    telegram.say(user, "first")
    wait_until(lambda: any(s.text == "echo: first" for s in telegram.to(user)), timeout=60, what="an answer")
    asked = len(scripted_llm.requests)  # $0.018 spent of $0.02: one more call is admitted, then none
    telegram.say(user, "second")
    wait_until(lambda: any(s.text == "echo: second" for s in telegram.to(user)), timeout=60, what="a second answer")
    telegram.say(user, "third")
    told = wait_until(lambda: next((s for s in telegram.to(user) if "day budget is spent" in s.text), None),
                      timeout=60, what="the budget told in the chat")
    assert f"telegram:{user}'s day budget is spent" in told.text and "brain.budget.identities" in told.text
    assert len(scripted_llm.requests) == asked + 1  # the third never reached the model


def test_a_sessions_second_turn_reads_the_cache_at_its_price_and_the_hit_rate_is_shown(
        processes: Processes, pincer_env: dict[str, str], scripted_llm: ScriptedLLM) -> None:
    prices = {"openai/scripted": {"input_per_mtok": 1000, "output_per_mtok": 1000, "cached_input_per_mtok": 100}}
    processes.env = {**pincer_env, "PINCER_BRAIN__PRICES": json.dumps(prices)}
    start_stack(processes, hands=1)
    owner = gateway_client(processes.env, token=OWNER_TOKEN)
    for text in ("first", "second"):
        assert owner.post("/v1/sessions/warm/messages", json={"text": text}).json()["text"] == f"echo: {text}"
    # The scripted cache: the second turn continues the conversation, so 8 of its 11 prompt tokens are cached.
    assert [len(request["messages"]) for request in scripted_llm.requests] == [2, 4]
    cold, warm = (11 * 1000 + 7 * 1000) / 1e6, (3 * 1000 + 8 * 100 + 7 * 1000) / 1e6

    shown = processes.run("budget", "--json")
    assert shown.returncode == 0, shown.stderr
    rows = {(row["scope"], row["period"].split(":")[0]): row for row in json.loads(shown.stdout)["budgets"]}
    for period in ("day", "month"):
        pool = rows[("pool", period)]
        assert pool["spent_usd"] == pytest.approx(cold + warm)  # the cached 8 at $100, not $1,000, a million
        assert (pool["input_tokens"], pool["cached_tokens"], pool["cache_hit"]) == (22, 8, round(8 / 22, 4))
    assert rows[("agent:main", "day")]["cache_hit"] == round(8 / 22, 4)
    table = processes.run("budget", extra_env={"COLUMNS": "200"})
    assert "cache hit" in table.stdout and "36%" in table.stdout

    def scraped() -> str | None:  # counters travel with the next heartbeat
        text = owner.get("/metrics").text
        return text if 'kind="cached"' in text and "pincer_model_cache_hit_ratio{" in text else None

    text = wait_until(scraped, timeout=20, what="the cache-hit ratio in /metrics")
    assert sample(text, "pincer_model_cache_hit_ratio") == pytest.approx(8 / 22)
