"""`pincer up`'s own decisions before the supervisor runs: what a detached start waits for."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from bus.config import DEFAULT_CONFIG, load_config
from gateway.cli import runtime
from gateway.runtime import daemon


@pytest.mark.parametrize(("flag", "env", "waits"), [
    (False, {}, None),  # detach's own default
    (True, {}, 1800),
    (False, {"PINCER_MODEL": "local"}, 1800),  # brain.model: local without the flag
])
def test_a_detached_first_local_model_start_is_waited_for_long_enough(
        flag: bool, env: dict[str, str], waits: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(daemon, "detach", lambda argv, **kwargs: seen.update(argv=argv, **kwargs) or 0)
    (tmp_path / "ws").mkdir()
    config = load_config(
        DEFAULT_CONFIG, env={"PINCER_DATA_DIR": str(tmp_path / "data"), "PINCER_WORKSPACE": str(tmp_path / "ws"), **env}
    )
    args = argparse.Namespace(hands=1, detach=True, local_model=flag)
    assert runtime.up(args, config) == 0
    assert seen.get("timeout_s") == waits
    assert ("--local-model" in seen["argv"]) is flag  # a restart starts it as it was started


def _leaf_keys(model: type, path: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every settable key under ``model`` (nested sections walked; maps of named entries left whole)."""
    from pydantic import BaseModel

    keys = []
    for name, info in model.model_fields.items():
        where = (*path, info.alias or name)
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            keys += _leaf_keys(kind, where)
        else:
            keys.append(where)
    return keys


def test_every_setting_reaches_the_roles_it_should_under_pincer_up() -> None:
    """A secret is known by what it is (a SecretStr setting, a URL with a password, a provider's key), never
    by its name's ending: every other documented key reaches every role from the environment."""
    from brain.config import BrainSettings
    from bus.settings import RedisSettings, RuntimeSettings
    from gateway.config import GatewaySettings
    from gateway.runtime.supervisor import PINCER_ROLES, SECRETS, role_env
    from hands.config import HandsSettings

    sections = {"redis": RedisSettings, "runtime": RuntimeSettings, "hands": HandsSettings, "brain": BrainSettings,
                "gateway": GatewaySettings}
    names = ["PINCER_" + "__".join(key).upper() for section, model in sections.items()
             for key in _leaf_keys(model, (section,))]
    assert "PINCER_GATEWAY__LIMITS__OPEN_TURNS_PER_TOKEN" in names and len(names) > 80
    env = {name: "x" for name in names}
    seen = {role: role_env(env, role) for role in (*PINCER_ROLES, "model")}
    for name in names:
        owner = SECRETS.get(name)
        for role in PINCER_ROLES:
            wanted = owner is None or owner == role or owner == "redis"
            assert (name in seen[role]) is wanted, (name, role)
    for reported in ("PINCER_GATEWAY__LIMITS__OPEN_TURNS_PER_TOKEN", "PINCER_GATEWAY__LIMITS__OPEN_STREAMS_PER_TOKEN",
                     "PINCER_BRAIN__MAX_TOKENS", "PINCER_REDIS__PASSWORD"):
        assert reported in names and all(reported in seen[role] for role in PINCER_ROLES), reported
    assert {"PINCER_GATEWAY__TOKEN", "PINCER_BRAIN__API_KEY", "PINCER_REDIS__URL"}.isdisjoint(seen["model"])
    providers = {"OPENAI_API_KEY": "sk", "AWS_SECRET_ACCESS_KEY": "a", "GITHUB_TOKEN": "g", "PINCER_LLM_API_KEY": "k",
                 "PINCER_GATEWAY_TOKEN": "t", "PINCER_TOKEN": "c", "PATH": "/bin", "PINCER_MODEL": "openai/x"}
    assert set(role_env(providers, "brain")) == {"OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN",
                                                 "PINCER_LLM_API_KEY", "PATH", "PINCER_MODEL"}
    assert set(role_env(providers, "gateway")) == {"PINCER_GATEWAY_TOKEN", "PINCER_TOKEN", "PATH", "PINCER_MODEL"}
    assert set(role_env(providers, "hands")) == {"PATH", "PINCER_MODEL"}


def test_a_variable_the_configuration_names_as_a_reference_reaches_no_role() -> None:
    from gateway.runtime.supervisor import PINCER_ROLES, referenced_variables, role_env

    raw = {"channels": {"telegram": {"bot_token": "${TELEGRAM_BOT_TOKEN}", "allow_from": ["${NOT_A_SECRET}"]}},
           "brain": {"model": "openai/x"}}
    withheld = referenced_variables(raw)
    assert withheld == {"TELEGRAM_BOT_TOKEN", "NOT_A_SECRET"}
    env = {"TELEGRAM_BOT_TOKEN": "1:abc", "OPENAI_API_KEY": "sk", "PATH": "/bin"}
    for role in (*PINCER_ROLES, "model"):
        assert "TELEGRAM_BOT_TOKEN" not in role_env(env, role, withheld=withheld), role
    assert "OPENAI_API_KEY" in role_env(env, "brain", withheld=withheld)  # the providers' keys still reach it
