"""`pincer up`'s own decisions before the supervisor runs: what a detached start waits for."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from bus.config import DEFAULT_CONFIG, load_config
from gateway import cli, daemon


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
    config = load_config(DEFAULT_CONFIG, env={"PINCER_DATA_DIR": str(tmp_path / "data"), "PINCER_WORKSPACE": str(tmp_path / "ws"),
                                              **env})
    args = argparse.Namespace(hands=1, detach=True, local_model=flag)
    assert cli._up(args, config) == 0
    assert seen.get("timeout_s") == waits
    assert ("--local-model" in seen["argv"]) is flag  # a restart starts it as it was started
