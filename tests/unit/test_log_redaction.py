"""No credential from the environment reaches a log line, whoever logs it."""

from __future__ import annotations

import io
import logging

import pytest

from bus.log import REDACTED, secrets_in, setup_logging

TOKEN = "123456:AAH-secret-bot-token-value"


def test_credential_names_are_recognised_and_short_or_plain_values_left() -> None:
    env = {"TELEGRAM_BOT_TOKEN": TOKEN, "OPENAI_API_KEY": "sk-abcdefgh",
           "PINCER_CHANNELS__EMAIL__PASSWORD": "hunter2!!",
           "PINCER_GATEWAY_PORT": "8780", "HOME": "/root/secret-home", "SHORT_TOKEN": "abc",
           "PINCER_OWNER_TOKEN_FILE": "/etc/pincer/token-path-is-not-secret"}
    assert secrets_in(env) == [TOKEN, "sk-abcdefgh", "hunter2!!"]


def test_a_library_logging_a_url_with_the_token_is_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", TOKEN)
    setup_logging("channel", "t1", "DEBUG")
    stream = io.StringIO()
    logging.getLogger().handlers[0].setStream(stream)  # type: ignore[attr-defined]
    try:
        logging.getLogger("telegram.ext").debug("Calling %s", f"https://api.telegram.org/bot{TOKEN}/getUpdates")
        logging.getLogger("gateway").info("plain line %s", 42)
    finally:
        setup_logging("test", "t", "WARNING")
    written = stream.getvalue()
    assert TOKEN not in written and f"bot{REDACTED}/getUpdates" in written and "plain line 42" in written
