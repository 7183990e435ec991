"""A turn's usage and its own limits, without a turn: counted as the Brain counts them, refused with the
setting that says so."""

from __future__ import annotations

from brain.config import BrainSettings
from brain.usage import TurnLimits, TurnUsage


def test_usage_sums_the_providers_counters_and_says_the_work_done() -> None:
    used = TurnUsage()
    used.add_tokens({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "model": "x"})
    used.add_tokens({"prompt_tokens": 20, "total_tokens": 22, "cost": 0.5})  # not a count: not summed
    used.model_calls, used.cost_usd = 2, 0.25
    used.add_calls(["read_file", "exec", "read_file"])
    assert used.tokens == {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 37}
    assert used.totals().tokens == 37 and used.totals().tool_calls == 3 and used.totals().cost_usd == 0.25
    assert used.said() == "2 model call(s), 3 tool call(s) (exec, read_file), 37 tokens"


def test_each_limit_is_checked_at_its_point_and_names_its_setting() -> None:
    limits = TurnLimits.of(BrainSettings(max_iterations=3, max_tokens=100, max_tool_calls=4, max_cost_usd=1.0))
    used = TurnUsage()
    assert limits.before_request(used, 3) is None
    assert "brain.max_iterations" in (limits.before_request(used, 4) or "")
    used.add_tokens({"total_tokens": 100})
    assert "brain.max_tokens = 100" in (limits.before_request(used, 1) or "")
    used.tokens.clear()
    used.cost_usd = 1.0
    assert "brain.max_cost_usd = 1" in (limits.before_request(used, 1) or "")
    used.add_calls(["a", "b", "c"])
    assert limits.before_tools(used, 1) is None
    assert "brain.max_tool_calls = 4" in (limits.before_tools(used, 2) or "")
    assert TurnLimits.of(BrainSettings(max_cost_usd=None)).before_request(TurnUsage(cost_usd=1e9), 1) is None
