"""Money fails closed through the front doors: with real Gateway, Brain and Hands processes and the scripted
model priced by brain.prices, a turn a person cancels over HTTP, or whose OpenAI stream its client closes,
mid-answer, costs its prompt (which the provider read on arrival) and what streamed; the identity's budget,
spent by such calls alone, refuses the next one before it reaches the model."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import openai
import pytest

from brain.tokens import count, tokens
from tests.conftest import Processes, gateway_client, wait_until
from tests.e2e.conftest import create_token, start_stack
from tests.e2e.test_openai_api import client
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.e2e

PER_TOKEN_USD = 1000 / 1e6  # brain.prices below: $1,000 a million tokens, in and out


@pytest.fixture
def priced(processes: Processes, pincer_env: dict[str, str]) -> Processes:
    processes.env = {**pincer_env,
                     "PINCER_BRAIN__PRICES": json.dumps({"openai/scripted": {"input_per_mtok": 1000,
                                                                             "output_per_mtok": 1000}}),
                     "PINCER_BRAIN__BUDGET__PER_IDENTITY__DAILY_USD": "0.05",  # below one prompt of the Brain's
                     "PINCER_BRAIN__BUDGET__MAX_OUTPUT_TOKENS": "64"}
    return processes


def prompt_usd(body: dict[str, Any]) -> float:
    """What the provider bills for a request's prompt, counted with the project's tokenizer."""
    return PER_TOKEN_USD * (count(body["messages"]) + tokens(json.dumps(body.get("tools", []))))


def day_of(processes: Processes, identity: str) -> dict[str, Any]:
    shown = processes.run("budget", "--json")
    assert shown.returncode == 0, shown.stderr
    return next(row for row in json.loads(shown.stdout)["budgets"]
                if row["scope"] == f"identity:{identity}" and row["period"].startswith("day"))


def settled(processes: Processes, identity: str) -> dict[str, Any] | None:
    row = day_of(processes, identity)
    return row if row["calls"] and row["held_usd"] == 0 else None


def test_a_turn_cancelled_over_http_mid_answer_costs_its_prompt_and_spends_the_budget(
        priced: Processes, scripted_llm: ScriptedLLM) -> None:
    start_stack(priced, hands=1)
    alice = gateway_client(priced.env, token=create_token(priced, "alice"))
    replies: list[httpx.Response] = []
    turn = threading.Thread(target=lambda: replies.append(
        alice.post("/v1/sessions/drip/messages", json={"text": "DRIP 0.05"})))
    turn.start()
    wait_until(lambda: scripted_llm.chunks_sent >= 5, timeout=60, what="the answer to stream")
    assert alice.post("/v1/sessions/drip/cancel").status_code == 202
    turn.join(30)
    assert replies and replies[0].json()["error"]["code"] == "CANCELLED"

    day = wait_until(lambda: settled(priced, "alice"), timeout=30, what="the cancelled call settled")
    [request] = scripted_llm.requests
    assert day["spent_usd"] >= prompt_usd(request) > day["limit_usd"] == 0.05  # not $0: what the provider read
    assert day["calls"] == 1 and day["left_usd"] == 0.0

    refused = alice.post("/v1/sessions/drip/messages", json={"text": "and now?"})
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "BUDGET_EXCEEDED"
    assert "brain.budget.per_identity.daily_usd" in refused.json()["error"]["message"]
    assert len(scripted_llm.requests) == 1  # refused before the model: it cost nothing
    assert day_of(priced, "alice")["spent_usd"] == day["spent_usd"]


def test_an_openai_stream_its_client_closes_mid_answer_costs_its_prompt_and_spends_the_budget(
        priced: Processes, scripted_llm: ScriptedLLM) -> None:
    priced.env["PINCER_BRAIN__OPENAI_DIRECT"] = "true"  # the SDK's road (the test above takes litellm's)
    start_stack(priced, hands=1)
    bob = client(priced.env, create_token(priced, "bob"))
    stream = bob.chat.completions.create(model="pincer", stream=True,
                                         messages=[{"role": "user", "content": "DRIP 0.05"}])
    seen = ""
    for chunk in stream:
        seen += (chunk.choices[0].delta.content or "") if chunk.choices else ""
        if len(seen) > 20:
            break
    stream.close()  # the client hangs up: the Gateway cancels the turn

    day = wait_until(lambda: settled(priced, "bob"), timeout=30, what="the abandoned call settled")
    [request] = scripted_llm.requests
    assert day["spent_usd"] >= prompt_usd(request) + PER_TOKEN_USD * tokens(seen)
    assert day["calls"] == 1

    with pytest.raises(openai.RateLimitError) as refused:
        bob.chat.completions.create(model="pincer", messages=[{"role": "user", "content": "again"}])
    assert refused.value.code == "BUDGET_EXCEEDED"
    assert len(scripted_llm.requests) == 1
