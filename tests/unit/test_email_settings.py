"""The email channel's settings: a From line is believed only with a proof, or by an operator's knowing choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from bus.config import ConfigError, load_config
from gateway.channels.config import ChannelSettings

MAILBOX = {"PINCER_CHANNELS__EMAIL__ENABLED": "true", "PINCER_CHANNELS__EMAIL__IMAP_HOST": "imap.example.com",
           "PINCER_CHANNELS__EMAIL__SMTP_HOST": "smtp.example.com", "PINCER_CHANNELS__EMAIL__USERNAME": "a@example.com",
           "PINCER_CHANNELS__EMAIL__PASSWORD": "pw", "PINCER_CHANNELS__EMAIL__ADDRESS": "a@example.com"}


def channels(tmp_path: Path, **env: str) -> ChannelSettings:
    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    return load_config(config, env={**MAILBOX, **env}).section("channels", ChannelSettings)


@pytest.mark.parametrize("allow_from", ['["alice@example.com"]', '["@example.com"]', "[]"])
def test_an_enabled_channel_without_a_proof_refuses_to_start_and_says_what_to_set(
        tmp_path: Path, allow_from: str) -> None:
    # no allow_from is refused too: a stranger paired by code is then let in by their From line alone
    with pytest.raises(ConfigError) as refused:
        channels(tmp_path, PINCER_CHANNELS__EMAIL__ALLOW_FROM=allow_from)
    said = str(refused.value)
    assert "channels.email.authserv_id" in said and "trust_from_header: true" in said
    assert "PINCER_CHANNELS__EMAIL__AUTHSERV_ID" in said and "'pw'" not in said  # the password is not shown


def test_a_proof_or_a_knowing_choice_lets_it_start(tmp_path: Path) -> None:
    proven = channels(tmp_path, PINCER_CHANNELS__EMAIL__ALLOW_FROM='["alice@example.com"]',
                      PINCER_CHANNELS__EMAIL__AUTHSERV_ID=" mx.example.com ")
    assert proven.email.authserv_id == "mx.example.com" and not proven.email.trust_from_header
    trusted = channels(tmp_path, PINCER_CHANNELS__EMAIL__ALLOW_FROM='["alice@example.com"]',
                       PINCER_CHANNELS__EMAIL__TRUST_FROM_HEADER="true")
    assert trusted.email.trust_from_header and trusted.email.authserv_id == ""
    assert not ChannelSettings.model_validate({"email": {"allow_from": ["alice@example.com"]}}).email.enabled


@pytest.mark.parametrize("authserv_id", ["mx.example.com; dmarc=pass", "mx example.com", "(mx.example.com)",
                                         '"mx.example.com"'])
def test_authserv_id_is_one_name(tmp_path: Path, authserv_id: str) -> None:
    with pytest.raises(ConfigError, match="authserv_id is one word"):
        channels(tmp_path, PINCER_CHANNELS__EMAIL__AUTHSERV_ID=authserv_id)


def test_allow_from_takes_addresses_and_a_domain_only_as_at_domain(tmp_path: Path) -> None:
    allowed = channels(tmp_path, PINCER_CHANNELS__EMAIL__AUTHSERV_ID="mx.example.com",
                       PINCER_CHANNELS__EMAIL__ALLOW_FROM='["alice@example.com", "@family.example"]')
    assert allowed.email.allow_from == ["alice@example.com", "@family.example"]
    for entry in ("example.com", "alice", "alice@@example.com", "@"):
        with pytest.raises(ConfigError, match=r"or a whole domain written @example\.com"):
            channels(tmp_path, PINCER_CHANNELS__EMAIL__AUTHSERV_ID="mx.example.com",
                     PINCER_CHANNELS__EMAIL__ALLOW_FROM=f'["{entry}"]')
