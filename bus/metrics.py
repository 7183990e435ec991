"""What each process counts for ``/metrics``, carried in the heartbeat it already sends.

A process keeps its counters and histograms in memory (a dict update per
event, no Redis command) and puts a snapshot in its instance hash at every
heartbeat; the Gateway reads the live instances' snapshots when scraped and
serves them, labelled by instance, in Prometheus' text format. Every metric
is declared once here, with its labels: no session or call ids among them.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Literal

# Seconds: from a cached file read to a long sandboxed command or model call.
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True)
class Metric:
    name: str
    kind: Literal["counter", "histogram"]
    help: str
    labels: tuple[str, ...]


METRICS = {m.name: m for m in (
    Metric("pincer_tool_calls", "counter", "Tool calls answered, by tool and outcome (ok or the error code)",
           ("tool", "outcome")),
    Metric("pincer_tool_call_seconds", "histogram", "Time from taking a tool call to its answer", ("tool",)),
    Metric("pincer_tool_retries", "counter", "Tool call attempts beyond the first", ("tool",)),
    Metric("pincer_sandbox_spawn_seconds", "histogram", "Time to start a sandboxed command", ("tier",)),
    Metric("pincer_chat_turns", "counter", "Chat turns ended, by agent and outcome (ok or the error code)",
           ("agent", "outcome")),
    Metric("pincer_chat_turn_seconds", "histogram", "Chat turn duration", ("agent",)),
    Metric("pincer_model_calls", "counter", "Model calls, by model", ("model",)),
    Metric("pincer_model_calls_estimated", "counter", "Model requests settled without the provider's usage "
           "(cancelled, timed out, broken off: at their prompt and what streamed), by model", ("model",)),
    Metric("pincer_model_tokens", "counter", "Tokens used, by model and kind (prompt, completion; cached: of the "
           "prompt, read from the provider's cache)", ("model", "kind")),
    Metric("pincer_model_cost_usd", "counter", "Model cost in USD (brain.prices, else litellm's table), by model, "
           "agent and identity", ("model", "agent", "identity")),
    Metric("pincer_budget_refusals", "counter", "Model calls refused before they were made, by the budget reached",
           ("budget",)),
    Metric("pincer_budget_alerts", "counter", "Budget alerts told to the owner, by budget and share",
           ("budget", "share")),
    Metric("pincer_job_runs", "counter", "Jobs' due instants recorded, by status (fired, skipped, missed)",
           ("status",)),
    Metric("pincer_job_fire_lag_seconds", "histogram", "From a job's due instant to its turn sent", ()),
    Metric("pincer_gateway_refusals", "counter", "Requests the Gateway refused, by code", ("code",)),
)}


class Meter:
    """One process's counters and histograms, by metric name and label values."""

    def __init__(self) -> None:
        self.counters: dict[str, dict[tuple[str, ...], float]] = {}
        self.histograms: dict[str, dict[tuple[str, ...], list[float]]] = {}  # bucket counts..., sum, count

    def count(self, name: str, *labels: str, value: float = 1.0) -> None:
        series = self.counters.setdefault(name, {})
        series[labels] = series.get(labels, 0.0) + value

    def observe(self, name: str, seconds: float, *labels: str) -> None:
        series = self.histograms.setdefault(name, {})
        values = series.get(labels)
        if values is None:
            values = series[labels] = [0.0] * (len(BUCKETS_S) + 2)
        index = bisect_left(BUCKETS_S, seconds)
        if index < len(BUCKETS_S):
            values[index] += 1  # cumulated when served
        values[-2] += seconds
        values[-1] += 1

    def snapshot(self) -> str:
        """The whole meter as JSON, for the heartbeat."""
        return json.dumps(
            {
                "c": {
                    name: [[*labels, value] for labels, value in series.items()]
                    for name, series in self.counters.items()
                },
                "h": {
                    name: [[*labels, values] for labels, values in series.items()]
                    for name, series in self.histograms.items()
                },
            },
            separators=(",", ":"),
        )


def read_snapshot(raw: str | None) -> dict[str, Any]:
    """A heartbeat's snapshot back (empty for an instance that sent none, or sent garbage)."""
    if not raw:
        return {"c": {}, "h": {}}
    try:
        data = json.loads(raw)
    except ValueError:
        return {"c": {}, "h": {}}
    return data if isinstance(data, dict) else {"c": {}, "h": {}}
