"""Configuration: file, environment overrides, shortcuts and clear errors."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from brain.config import BrainSettings
from bus.config import DEFAULT_CONFIG, ConfigError, MissingVariable, from_environment, load_config
from bus.settings import RedisSettings, RuntimeSettings, Section
from gateway.channels.config import ChannelSettings
from gateway.cli import SECTIONS
from gateway.cli.runtime import validate_all
from gateway.config import GatewaySettings
from hands.config import HandsSettings


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_shipped_config_is_valid_and_equals_the_defaults() -> None:
    config = load_config(DEFAULT_CONFIG, env={})
    config.check_sections(SECTIONS)
    validate_all(config)
    assert config.section("hands", HandsSettings) == HandsSettings()
    assert config.section("gateway", GatewaySettings) == GatewaySettings()
    assert config.section("brain", BrainSettings) == BrainSettings()
    assert config.redis.prefix == "pincer:" and config.redis.url is None


def test_the_shipped_config_shows_every_key() -> None:
    """Every setting is a key of the shipped file (or, where its default depends on the machine, a
    commented ``# key:`` line); a map of named entries names every entry key in its comments."""
    text = DEFAULT_CONFIG.read_text()
    lines = text.splitlines()
    missing: list[str] = []

    def comments_around(path: str) -> str:
        at = 0
        for depth, key in enumerate(path.split(".")):  # the key's line under each of its parents in turn
            at = next(i for i in range(at, len(lines)) if lines[i].startswith(f"{'  ' * depth}{key}:"))
        above = [line for line in reversed(lines[:at]) if line.lstrip().startswith("#")]
        below = [line for line in lines[at + 1:] if line.lstrip().startswith("#")]
        return " ".join(above[:12] + below[:12])

    def walk(model: type[BaseModel], node: object, path: str) -> None:
        for name, field in model.model_fields.items():
            key = field.alias or name
            where = f"{path}.{key}"
            shown = isinstance(node, dict) and key in node
            if not shown and not re.search(rf"^\s*# {key}:", text, re.MULTILINE):
                missing.append(where)
                continue
            annotation = field.annotation
            if typing.get_origin(annotation) is dict:  # named entries: each entry's keys in the comments
                entry = typing.get_args(annotation)[1]
                if isinstance(entry, type) and issubclass(entry, Section):
                    said = comments_around(where)
                    missing.extend(
                        f"{where}.<name>.{k}" for k in entry.model_fields if not re.search(rf"\b{k}\b", said)
                    )
            elif isinstance(annotation, type) and issubclass(annotation, Section) and shown:
                walk(annotation, node[key], where)  # type: ignore[index]

    shipped = yaml.safe_load(text)
    models = {"redis": RedisSettings, "runtime": RuntimeSettings, "hands": HandsSettings,
              "brain": BrainSettings, "gateway": GatewaySettings, "channels": ChannelSettings}
    assert set(models) == SECTIONS
    for section, model in models.items():
        walk(model, shipped[section], section)
    assert not missing, f"config.yaml leaves out: {missing}"


def test_env_overrides_nested_keys_and_shortcuts(tmp_path: Path) -> None:
    path = _write(tmp_path, "hands:\n  concurrency:\n    global: 3\n")
    env = {
        "PINCER_HANDS__CONCURRENCY__GLOBAL": "7",
        "PINCER_HANDS__MAX_RESULT_BYTES": "2000",
        "PINCER_REDIS_URL": "redis://example:6379/1",
        "PINCER_MODEL": "openai/gpt-4o-mini",
        "PINCER_LLM_API_BASE": "http://127.0.0.1:9/v1",
        "PINCER_LLM_API_KEY": "sk-1",
        "PINCER_WORKSPACE": "/tmp/ws",
        "PINCER_DATA_DIR": "/tmp/data",
        "PINCER_GATEWAY_PORT": "9999",
        "PINCER_UNRELATED": "ignored: no section separator",
    }
    config = load_config(path, env=env)
    hands = config.section("hands", HandsSettings)
    brain = config.section("brain", BrainSettings)
    assert hands.concurrency.global_ == 7 and hands.max_result_bytes == 2000
    assert hands.workspace == Path("/tmp/ws")
    assert (brain.model, brain.api_base) == ("openai/gpt-4o-mini", "http://127.0.0.1:9/v1")
    assert brain.api_key is not None and brain.api_key.get_secret_value() == "sk-1"
    assert config.redis.url == "redis://example:6379/1"
    assert config.runtime.data_dir == Path("/tmp/data")
    assert config.section("gateway", GatewaySettings).port == 9999


def test_config_env_var_picks_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "gateway:\n  port: 1234\n")
    assert load_config(env={"PINCER_CONFIG": str(path)}).section("gateway", GatewaySettings).port == 1234


def test_the_data_dirs_config_is_found_and_another_projects_in_the_current_directory_never(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "some-ml-project"
    project.mkdir()
    (project / "config.yaml").write_text("epochs: 30\nlearning_rate: 0.001\n")  # not Pincer's
    monkeypatch.chdir(project)
    data = tmp_path / "data"
    env = {"PINCER_DATA_DIR": str(data)}
    default = load_config(env=env)
    default.check_sections(SECTIONS)  # the packaged defaults: no "unknown section 'epochs'"
    assert default.source == DEFAULT_CONFIG
    data.mkdir()
    (data / "config.yaml").write_text("gateway:\n  port: 4321\n")
    assert load_config(env=env).section("gateway", GatewaySettings).port == 4321
    explicit = _write(tmp_path, "gateway:\n  port: 1234\n")
    assert load_config(explicit, env=env).section("gateway", GatewaySettings).port == 1234
    assert load_config(env={**env, "PINCER_CONFIG": str(explicit)}).section("gateway", GatewaySettings).port == 1234


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("gateway:\n  port: eighty\n", {}, "gateway.port: Input should be a valid integer"),
        ("gateway:\n  port: 70000\n", {}, "gateway.port"),
        ("hands:\n  worksapce: /x\n", {}, "hands.worksapce: unknown key"),
        ("", {"PINCER_HANDS__CONCURRENCY__GLOBAL": "-1"}, "hands.concurrency.global"),
        ("runtime:\n  log_level: LOUD\n", {}, "runtime.log_level"),
        ("hands: [1, 2]\n", {}, "'hands' must be a mapping"),
    ],
)
def test_bad_values_name_the_key_and_how_to_fix_it(tmp_path: Path, text: str, env: dict, expected: str) -> None:
    config = load_config(_write(tmp_path, text), env=env)
    with pytest.raises(ConfigError) as info:
        validate_all(config)
    assert expected in str(info.value)
    assert "PINCER_" in str(info.value)  # says how to override it


def test_hands_jobs_is_still_read_as_hands_background(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bus.config._warned", set())
    old_file = _write(tmp_path, "hands:\n  jobs:\n    keep_s: 60\n    max_per_session: 2\n")
    for _ in range(2):  # a process may load its config more than once: one warning
        background = load_config(old_file, env={}).section("hands", HandsSettings).background
        assert (background.keep_s, background.max_per_session) == (60, 2)
    assert [r.getMessage() for r in caplog.records] == [
        f"config {old_file}: hands.jobs is the old name of hands.background, read as hands.background for now: "
        "rename it"]
    # The old variables over the shipped file (which says background:), and either name over the other's file.
    old_env = {"PINCER_HANDS__JOBS__MAX_PER_WORKER": "3"}
    assert load_config(DEFAULT_CONFIG, env=old_env).section("hands", HandsSettings).background.max_per_worker == 3
    assert "PINCER_HANDS__BACKGROUND__<KEY>" in caplog.records[-1].getMessage()
    new_env = {"PINCER_HANDS__BACKGROUND__KEEP_S": "90"}
    background = load_config(old_file, env=new_env).section("hands", HandsSettings).background
    assert (background.keep_s, background.max_per_session) == (90, 2)


def test_hands_jobs_and_hands_background_at_once_are_refused(tmp_path: Path) -> None:
    both = _write(tmp_path, "hands:\n  jobs:\n    keep_s: 60\n  background:\n    keep_s: 90\n")
    with pytest.raises(ConfigError, match=r"both hands\.jobs and hands\.background are given; .* keep only "
                                          r"hands\.background"):
        load_config(both, env={})
    env = {"PINCER_HANDS__JOBS__KEEP_S": "60", "PINCER_HANDS__BACKGROUND__MAX_PER_WORKER": "3"}
    with pytest.raises(ConfigError, match="the environment sets both PINCER_HANDS__JOBS__<KEY> and "
                                          "PINCER_HANDS__BACKGROUND__<KEY>"):
        load_config(DEFAULT_CONFIG, env=env)


def test_a_key_given_twice_is_refused_with_its_line(tmp_path: Path) -> None:
    twice = _write(tmp_path, "runtime:\n  log_level: INFO\n  heartbeat_s: 2\n  log_level: DEBUG\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line 4, column 3: 'log_level' is given twice"):
        load_config(twice, env={})
    sections = _write(tmp_path, "runtime: {}\nhands: {}\nruntime: {log_level: DEBUG}\n")
    with pytest.raises(ConfigError, match=r"line 3, column 1: 'runtime' is given twice"):
        load_config(sections, env={})
    assert load_config(DEFAULT_CONFIG, env={}).runtime.backup.keep == 7  # the shipped file has each key once


def test_broken_yaml_says_where(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not valid YAML at line 3, column 1"):
        load_config(_write(tmp_path, "gateway:\n  port: [1,\n"), env={})


def test_unknown_section_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown section 'handz'"):
        load_config(_write(tmp_path, "handz: {}\n"), env={}).check_sections(SECTIONS)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml", env={})
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(_write(tmp_path, "- a\n- b\n"), env={})


def test_sentinels_are_host_and_port(tmp_path) -> None:
    from bus.config import load_config
    from bus.settings import RedisSettings

    good = RedisSettings(sentinels=["127.0.0.1:26379", "[::1]:26380"], sentinel_master="m")
    assert good.sentinels[1] == "[::1]:26380"
    with pytest.raises(ValueError, match=r"sentinel 'redis-a': write host:port"):
        RedisSettings(sentinels=["redis-a"])
    config = load_config(None, env={"PINCER_REDIS__SENTINELS": '["10.0.0.5:26379"]', "PINCER_DATA_DIR": str(tmp_path)})
    from bus.service import redis_url

    assert redis_url(config) == "sentinel://mymaster@10.0.0.5:26379"  # no embedded Redis, no URL needed


def test_one_resolver_reads_every_reference_and_names_a_missing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PINCER_TEST_A", "alpha")
    monkeypatch.delenv("PINCER_TEST_GONE", raising=False)
    assert from_environment("${PINCER_TEST_A}", key="k") == "alpha"
    assert from_environment("Bearer ${PINCER_TEST_A}-${PINCER_TEST_A}", key="k") == "Bearer alpha-alpha"
    assert from_environment("plain $PINCER_TEST_A {x}", key="k") == "plain $PINCER_TEST_A {x}"  # only ${NAME}
    with pytest.raises(MissingVariable) as missing:
        from_environment("x ${PINCER_TEST_GONE}", key="channels.slack.bot_token", process="the channel")
    assert isinstance(missing.value, ConfigError) and isinstance(missing.value, ValueError)  # pydantic reports it
    assert str(missing.value).startswith("channels.slack.bot_token names ${PINCER_TEST_GONE}, but PINCER_TEST_GONE "
                                         "is not set in the environment of the channel: export PINCER_TEST_GONE")


def test_the_gateway_reads_which_channels_are_on_without_their_secrets() -> None:
    from gateway.channels.config import enabled_names

    raw = {"telegram": {"enabled": True, "bot_token": "${NOT_IN_THIS_PROCESS}"}, "slack": {"enabled": "false"},
           "email": {"enabled": "yes"}, "matrix": "not a mapping", "discord": {"enabled": "maybe"}}
    assert enabled_names(raw) == ["telegram", "email"]
    assert enabled_names(None) == []
