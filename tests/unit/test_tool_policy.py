"""The tool policy: profiles, groups, globs, deny wins, agent layers only narrow, owner-only tools."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hands.config import HandsSettings, ToolPolicySettings
from hands.toolpolicy import ToolPolicy
from hands.worker import build_registry

REGISTRY = build_registry()
ALL = REGISTRY.names()


def allowed(settings: dict, *, agent: str = "main", sender: str = "") -> list[str]:
    policy = ToolPolicy(ToolPolicySettings.model_validate(settings))
    return [n for n in ALL if policy.decide(REGISTRY.get(n), agent=agent, sender=sender).allowed]


def test_profiles() -> None:
    assert allowed({}, sender="owner") == ALL  # full by default
    assert allowed({}) == [n for n in ALL if n != "schedule"]  # owner-only by default: jobs run unattended
    # asking the person is in every profile: it reaches no file, command or network
    assert allowed({"profile": "minimal"}) == ["ask_user", "memory_delete", "memory_read", "memory_search",
                                               "memory_write"]
    coding = allowed({"profile": "coding"})
    assert "exec" in coding and "read_file" in coding and "ask_user" in coding and "web_fetch" not in coding
    assert "ask_user" not in allowed({"deny": ["group:people"]})


def test_allow_deny_globs_and_groups() -> None:
    assert allowed({"allow": ["group:fs", "memory_*"], "deny": ["write_file"]}) == [
        "list_directory", "memory_delete", "memory_read", "memory_search", "memory_write", "read_file", "read_files"]
    assert allowed({"allow": ["exec"], "deny": ["group:runtime"]}) == []  # deny wins


def test_agent_layers_only_narrow() -> None:
    settings = {"profile": "coding", "agents": {"helper": {"profile": "full", "deny": ["exec", "execute_sh*"]}}}
    helper = allowed(settings, agent="helper")
    assert "web_fetch" not in helper  # the agent's "full" cannot widen the global "coding"
    assert "exec" not in helper and "execute_python" in helper
    assert "exec" in allowed(settings, agent="main")


def test_an_entry_naming_an_alias_applies_to_its_tool() -> None:
    # execute_shell is exec under its old name: denying either denies the command runner.
    assert "exec" not in allowed({"deny": ["execute_shell"]})
    assert "exec" not in allowed({"deny": ["execute_*"]}) and "read_file" in allowed({"deny": ["execute_*"]})
    assert allowed({"allow": ["execute_shell"]}) == ["exec"]


def test_owner_only_tools_need_an_owner() -> None:
    settings = {"owner_only": ["group:runtime"], "owners": ["alice"]}
    assert "exec" in allowed(settings, sender="alice")
    assert "exec" not in allowed(settings, sender="mallory") and "read_file" in allowed(settings, sender="mallory")


def test_explanations_name_the_deciding_rule() -> None:
    policy = ToolPolicy(ToolPolicySettings.model_validate({"profile": "coding", "agents": {"a": {"deny": ["exec"]}}}))
    denied = policy.decide(REGISTRY.get("exec"), agent="a")
    assert not denied.allowed and denied.rule == "hands.tools.agents.a.deny has 'exec'"
    assert denied.trace == ("hands.tools.profile 'coding' includes it", "denied: hands.tools.agents.a.deny has 'exec'")
    web = policy.decide(REGISTRY.get("web_fetch"))
    assert web.rule == "hands.tools.profile is 'coding', which does not include web_fetch"


@pytest.mark.parametrize(("tools", "message"), [
    ({"profile": "everything"}, "unknown profile 'everything'"),
    ({"deny": ["group:nope"]}, "unknown group 'group:nope'"),
    ({"agents": {"x": {"profile": "huge"}}}, "unknown profile 'huge'"),
])
def test_bad_policy_config_is_refused(tools: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        HandsSettings.model_validate({"tools": tools})
