"""The Matrix device store's key at rest: the configured one, else a random one of this install's kept beside
the store (0600, never through a planted link), the same on every start; an old store keeps its old key."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gateway.channels.config import MatrixSettings
from gateway.channels.matrix_keys import LEGACY_STORE_KEY, store_key

SETTINGS = {"homeserver": "https://matrix.example", "user_id": "@pincer:example", "access_token": "t",
            "encryption": True}


def test_each_install_gets_a_random_key_of_its_own_kept_private(tmp_path: Path) -> None:
    settings = MatrixSettings.model_validate(SETTINGS)
    first, second = tmp_path / "a" / "matrix", tmp_path / "b" / "matrix"
    key = store_key(settings, first)
    assert len(key) >= 32 and key != LEGACY_STORE_KEY and key != store_key(settings, second)
    kept = first.with_name("matrix.key")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and kept.read_text() == key
    assert not first.exists() or kept.parent != first  # beside the store, not inside it
    assert store_key(settings, first) == key  # the same on the next start


def test_a_configured_key_wins_and_an_old_store_keeps_the_fixed_one(tmp_path: Path) -> None:
    configured = MatrixSettings.model_validate({**SETTINGS, "store_key": "operator-chosen"})
    assert store_key(configured, tmp_path / "matrix") == "operator-chosen"
    assert not (tmp_path / "matrix.key").exists()
    old = tmp_path / "old" / "matrix"
    old.mkdir(parents=True)
    (old / "@pincer:example_DEVICE.db").write_bytes(b"made with the fixed key")
    assert store_key(MatrixSettings.model_validate(SETTINGS), old) == LEGACY_STORE_KEY  # it still opens


def test_a_link_planted_at_the_key_file_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("")
    os.symlink(elsewhere, tmp_path / "matrix.key")
    with pytest.raises(OSError):
        store_key(MatrixSettings.model_validate(SETTINGS), tmp_path / "matrix")
    assert elsewhere.read_text() == ""
