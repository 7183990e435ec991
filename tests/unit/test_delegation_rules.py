"""The delegation rules that need no Redis: children's names and ids, the tree's limits, the settings."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from brain.config import BrainSettings
from brain.delegation import Limits, Totals, child_message_id, child_session, role


def test_a_childs_session_is_named_after_its_parents_and_its_id_after_the_call() -> None:
    assert child_session("alice/main", "1a2b3c4d5e6f") == "alice/main:sub-1a2b3c4d"
    assert child_session("alice/main:sub-1a2b3c4d", "99aa88bb77") == "alice/main:sub-1a2b3c4d:sub-99aa88bb"
    long = child_session("alice/" + "n" * 125, "1a2b3c4d5e6f7a8b9c")
    assert long == "alice/sub-1a2b3c4d5e6f7a8b"  # within the 128 characters a session name may have
    assert child_message_id("call-1") == child_message_id("call-1") != child_message_id("call-2")
    assert len(child_message_id("call-1")) == 32


def test_the_role_says_what_a_sub_agent_is_and_carries_the_context() -> None:
    said = role(1, 2, "the repo is at /srv/app")
    assert said.startswith("You are a sub-agent (level 1 of at most 2)")
    assert said.endswith("What the agent that asked wants you to know:\nthe repo is at /srv/app")
    assert "wants you to know" not in role(2, 2, None)


def test_the_trees_limits_name_the_setting_that_ran_out() -> None:
    limits = Limits(max_tokens=1000, max_tool_calls=4, max_cost_usd=0.5, deadline=0)
    assert limits.exceeded(Totals(tokens=999, cost_usd=0.49, tool_calls=4)) is None
    assert "brain.max_tokens = 1,000" in (limits.exceeded(Totals(tokens=1000)) or "")
    assert "brain.max_cost_usd = 0.5" in (limits.exceeded(Totals(cost_usd=0.5)) or "")
    assert "brain.max_tool_calls = 4" in (limits.exceeded(Totals(tool_calls=5)) or "")
    assert Limits(max_tokens=10, max_tool_calls=1, max_cost_usd=None, deadline=0).exceeded(
        Totals(cost_usd=99.0)) is None  # no money limit: never out of money


@pytest.mark.parametrize(("delegation", "error"), [
    ({"agents": {"nobody": ["main"]}}, "delegation.agents names agent 'nobody', which is not configured"),
    ({"agents": {"main": ["ghost"]}}, "delegation.agents.main names agent 'ghost', which is not configured"),
    ({"max_depth": 6}, "less than or equal to 5"),
    ({"max_children": 0}, "greater than or equal to 1"),
])
def test_bad_delegation_settings_say_what_is_wrong(delegation: dict, error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        BrainSettings(delegation=delegation)


def test_delegation_to_configured_agents_is_accepted() -> None:
    settings = BrainSettings(agents={"researcher": {}}, delegation={"agents": {"main": ["researcher"]}})
    assert settings.delegation.agents == {"main": ["researcher"]} and settings.delegation.max_depth == 2
