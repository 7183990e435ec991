"""/metrics and /readyz against real processes: counters read back after real calls and turns."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.conftest import OWNER_TOKEN, Processes, gateway_client, wait_until

pytestmark = pytest.mark.e2e


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one series in a Prometheus exposition (summed over instances)."""
    total, found = 0.0, False
    for line in text.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            total, found = total + float(match.group(2)), True
    assert found, f"no {name} {labels} in /metrics"
    return total


def ready(client: httpx.Client) -> int:
    try:
        return client.get("/readyz").status_code
    except httpx.HTTPError:
        return 0


def test_metrics_count_what_happened_and_readyz_follows_the_pool(processes: Processes,
                                                                 pincer_env: dict[str, str]) -> None:
    (processes.tmp_path / "workspace" / "notes.txt").write_text("hello\n")
    processes.start("gateway", name="gateway")
    processes.start("brain", name="brain")
    anonymous = gateway_client(pincer_env, token=None)
    wait_until(lambda: ready(anonymous) == 503, timeout=60, what="a Gateway that is up but not ready")
    assert "no Hands worker alive" in anonymous.get("/readyz").json()["problems"]
    hands = processes.start("hands", name="hands")
    wait_until(lambda: ready(anonymous) == 200, timeout=60, what="/readyz once a Hands worker is alive")

    owner = gateway_client(pincer_env)
    for text in ('CALL read_file {"path": "notes.txt"}', 'CALL read_file {"path": "missing.txt"}', "hi", "STATUS 401"):
        owner.post("/v1/sessions/metered/messages", json={"text": text})
    assert owner.post("/v1/sessions/metered/messages", json={"text": "x"}, headers={"Host": "evil.example"}) \
        .status_code == 403

    def scraped() -> str | None:  # counters travel with the next heartbeat
        text = owner.get("/metrics").text
        wanted = ('outcome="FILE_NOT_FOUND"', 'outcome="MODEL_ERROR"', 'code="FORBIDDEN"')  # Hands, Brain, Gateway
        return text if all(w in text for w in wanted) else None

    text = wait_until(scraped, timeout=20, what="the counters in /metrics")
    assert sample(text, "pincer_tool_calls_total", tool="read_file", outcome="ok") == 1
    assert sample(text, "pincer_tool_calls_total", tool="read_file", outcome="FILE_NOT_FOUND") == 1
    assert sample(text, "pincer_tool_call_seconds_count", tool="read_file") == 2
    assert sample(text, "pincer_tool_call_seconds_bucket", tool="read_file", le="+Inf") == 2
    assert sample(text, "pincer_chat_turns_total", agent="main", outcome="ok") == 3
    assert sample(text, "pincer_chat_turns_total", agent="main", outcome="MODEL_ERROR") == 1
    assert sample(text, "pincer_model_tokens_total", kind="prompt") == 11 * 5  # five model calls answered
    cached = sample(text, "pincer_model_tokens_total", kind="cached")  # the scripted cache: 8 of a later call's 11
    assert cached > 0 and cached % 8 == 0
    assert sample(text, "pincer_gateway_refusals_total", code="FORBIDDEN") >= 1
    assert sample(text, "pincer_instances", role="hands") == 1
    assert sample(text, "pincer_stream_pending", stream="hands:requests") == 0
    assert "session_id=" not in text and "metered" not in text  # no session or call ids in labels

    chat = processes.run("token", "create", "viewer")
    viewer = gateway_client(pincer_env, chat.stdout.strip())
    assert viewer.get("/metrics").status_code == 403  # an operator's business
    assert gateway_client(pincer_env, token=None).get("/metrics").status_code == 401

    processes.stop(hands)
    wait_until(lambda: ready(anonymous) == 503, timeout=30, what="/readyz once the last Hands worker stopped")
    assert OWNER_TOKEN not in processes.logs()


def test_json_log_lines_for_log_shippers(processes: Processes, pincer_env: dict[str, str]) -> None:
    import json

    processes.env = {**pincer_env, "PINCER_RUNTIME__LOG_FORMAT": "json"}
    processes.start("gateway", name="gateway")
    log = processes.tmp_path / "gateway.log"
    wait_until(lambda: "answers hosts" in log.read_text(), timeout=60, what="the Gateway's start line")
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    start = next(line for line in lines if "answers hosts" in line["msg"])
    assert start["role"] == "gateway" and start["level"] == "INFO" and start["logger"] == "gateway"
    assert start["instance"].startswith("gateway-") and isinstance(start["ts"], float)
