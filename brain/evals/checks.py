"""What a case's run came to, and which of its expectations that breaks."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from brain.evals.cases import Expect, Match


@dataclass
class Outcome:
    answer: str | None = None  # the last turn's
    trajectory: list[str] = field(default_factory=list)  # every tool called, in order, across the turns
    model_calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: float = 0.0  # the slowest turn
    error: str | None = None  # the run could not finish: a turn's error, or where a replay left the recording

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cache_hit(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "tokens": self.tokens, "cache_hit": round(self.cache_hit, 4),
                "cost_usd": round(self.cost_usd, 8), "latency_ms": round(self.latency_ms, 1)}


def failures(expect: Expect, outcome: Outcome) -> list[str]:
    """Each expectation the outcome misses, said as a person reads it (empty: the case passed)."""
    found = [] if outcome.error is None else [outcome.error]
    answer = outcome.answer or ""
    if expect.trajectory is not None and not trajectory_matches(expect.trajectory, outcome.trajectory,
                                                                expect.trajectory_match):
        found.append(f"trajectory ({expect.trajectory_match}): expected {expect.trajectory}, "
                     f"got {outcome.trajectory}")
    found += [f"answer does not contain {text!r}" for text in expect.answer_contains if text not in answer]
    if expect.answer_regex is not None and re.search(expect.answer_regex, answer) is None:
        found.append(f"answer does not match /{expect.answer_regex}/")
    if expect.max_tokens is not None and outcome.tokens > expect.max_tokens:
        found.append(f"tokens {outcome.tokens:,} > {expect.max_tokens:,}")
    if expect.max_cost_usd is not None and outcome.cost_usd > expect.max_cost_usd:
        found.append(f"cost ${outcome.cost_usd:.6f} > ${expect.max_cost_usd:.6f}")
    if expect.min_cache_hit is not None and outcome.cache_hit < expect.min_cache_hit:
        found.append(f"cache hit {outcome.cache_hit:.0%} < {expect.min_cache_hit:.0%}")
    if expect.max_latency_ms is not None and outcome.latency_ms > expect.max_latency_ms:
        found.append(f"latency {outcome.latency_ms:,.0f} ms > {expect.max_latency_ms:,.0f} ms")
    if found and outcome.answer is not None and outcome.error is None:
        found.append(f"the answer was: {_short(answer)}")
    return found


def trajectory_matches(expected: list[str], actual: list[str], mode: Match) -> bool:
    """``strict``: the same calls in the same order; ``unordered``: the same calls in any order; ``subset``: no
    call outside the expected ones (as many times at most); ``superset``: at least the expected ones."""
    if mode == "strict":
        return actual == expected
    want, got = Counter(expected), Counter(actual)
    if mode == "unordered":
        return want == got
    if mode == "subset":
        return not got - want
    return not want - got


def _short(text: str, most: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= most else text[:most - 1] + "…"
