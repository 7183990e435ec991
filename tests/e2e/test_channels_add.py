"""`pincer channels add` against the platform fakes (and a real Synapse, Dovecot and SMTP server for Matrix and
email): a refused credential saves nothing and says why; a good one is saved (config.yaml names it, secrets.env
holds it, 0600) and a real channel process, alone or under `pincer up`, runs on it."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bus.config import load_config
from bus.redis_server import free_port
from bus.secrets_file import read_secrets, save_secrets
from gateway.channels.config import ChannelSettings
from tests.conftest import Processes, wait_until
from tests.e2e.conftest import descendants
from tests.fake_discord import TOKEN as DISCORD_TOKEN
from tests.fake_discord import FakeDiscord
from tests.fake_slack import APP_TOKEN, BOT_TOKEN, FakeSlack
from tests.fake_telegram import TOKEN, FakeTelegram
from tests.mailservers import AGENT, PASSWORD, RECEIVER, Dovecot, SmtpSink
from tests.matrix_server import Synapse

pytestmark = pytest.mark.e2e


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    fake = FakeSlack().start()
    yield fake
    fake.stop()


@pytest.fixture
def discord_api() -> Iterator[FakeDiscord]:
    fake = FakeDiscord().start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def synapse() -> Iterator[Synapse]:
    server = Synapse().start()
    yield server
    server.close()


def secret_file(tmp_path: Path, name: str, value: str) -> str:
    path = tmp_path / name
    path.write_text(value + "\n")
    return str(path)


def nothing_saved(data: Path) -> bool:
    return not (data / "config.yaml").exists() and not (data / "secrets.env").exists()


def test_telegram_a_refused_token_saves_nothing_a_good_one_runs_the_channel(
        processes: Processes, telegram: FakeTelegram, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    refused = processes.run("channels", "add", "telegram", "--api-url", telegram.api_url,
                            "--token-file", secret_file(tmp_path, "bad", "123:wrong-token"))
    assert refused.returncode == 1 and "Telegram getMe: The token" in refused.stderr, refused.stderr
    assert "rejected by the server" in refused.stderr and "wrong-token" not in refused.stderr  # never echoed
    assert "nothing was saved" in refused.stderr and nothing_saved(data)

    added = processes.run("channels", "add", "telegram", "--api-url", telegram.api_url, "--allow", "111",
                          "--token-file", secret_file(tmp_path, "good", TOKEN))
    assert added.returncode == 0, added.stderr
    assert "@pincer_test_bot" in added.stdout
    assert TOKEN not in added.stdout + added.stderr + refused.stdout + refused.stderr
    text = (data / "config.yaml").read_text()
    assert TOKEN not in text
    assert yaml.safe_load(text) == {"channels": {"telegram": {
        "enabled": True, "bot_token": "${TELEGRAM_BOT_TOKEN}", "api_url": telegram.api_url, "allow_from": ["111"]}}}
    assert read_secrets(data / "secrets.env") == {"TELEGRAM_BOT_TOKEN": TOKEN}
    assert (data / "secrets.env").stat().st_mode & 0o777 == 0o600

    config = load_config(env={"PINCER_DATA_DIR": str(data)})
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", read_secrets(data / "secrets.env")["TELEGRAM_BOT_TOKEN"])
    settings = config.section("channels", ChannelSettings)
    assert settings.enabled() == ["telegram"] and settings.telegram.bot_token.get_secret_value() == TOKEN

    # The channel's own process: its token from secrets.env, through ${TELEGRAM_BOT_TOKEN} in config.yaml.
    polls = len(telegram.calls_of("getUpdates"))
    processes.start("channel", "telegram", name="telegram")
    wait_until(lambda: len(telegram.calls_of("getUpdates")) > polls, timeout=60, what="the channel polling")


def test_pincer_ups_children_get_secrets_env_under_the_environment(
        processes: Processes, pincer_env: dict[str, str], telegram: FakeTelegram, tmp_path: Path) -> None:
    env = {k: v for k, v in pincer_env.items() if k not in ("PINCER_REDIS_URL", "PINCER_GATEWAY_TOKEN")}
    # INFO: at DEBUG python-telegram-bot logs its API URL, which holds the token.
    processes.env = {**env, "PINCER_REDIS__PREFIX": "pincer:", "OPENAI_API_KEY": "from-the-environment",
                     "PINCER_RUNTIME__LOG_LEVEL": "INFO"}
    assert processes.run("channels", "add", "telegram", "--api-url", telegram.api_url,
                         "--token-file", secret_file(tmp_path, "good", TOKEN)).returncode == 0
    data = tmp_path / "data"
    save_secrets(data / "secrets.env", {"OPENAI_API_KEY": "from-the-file", "ANTHROPIC_API_KEY": "file-only"})
    up = processes.start("up", name="up")
    log = tmp_path / "up.log"
    wait_until(lambda: "ready: Gateway on" in log.read_text(), timeout=90, what="pincer up ready")
    wait_until(lambda: telegram.calls_of("getUpdates"), timeout=60, what="the channel polling with the saved token")
    state = json.loads((data / "pincer.json").read_text())
    seen = {role: dict(line.split("=", 1) for line in Path(f"/proc/{proc['pid']}/environ").read_text().split("\0")
                       if "=" in line) for role, proc in state["children"].items()}
    assert seen["brain"]["OPENAI_API_KEY"] == "from-the-environment"  # the environment wins over the file
    assert seen["brain"]["ANTHROPIC_API_KEY"] == "file-only"
    assert seen["telegram"]["PINCER_CHANNELS__TELEGRAM__BOT_TOKEN"] == TOKEN
    for role, variables in seen.items():
        if role != "brain":
            assert "ANTHROPIC_API_KEY" not in variables, role  # each role its own share, as with the environment
        if role != "telegram":
            assert TOKEN not in variables.values(), role
    assert TOKEN not in log.read_text() and "file-only" not in log.read_text()
    children = descendants(up.pid)
    assert processes.stop(up, signal.SIGTERM, timeout=30) == 0
    assert children


def test_slack_checks_both_tokens_then_its_channel_connects(processes: Processes, slack: FakeSlack,
                                                           tmp_path: Path) -> None:
    data = tmp_path / "data"
    common = ("channels", "add", "slack", "--api-url", slack.api_url)
    bad_bot = processes.run(*common, "--token-file", secret_file(tmp_path, "b1", "xoxb-wrong"),
                            "--app-token-file", secret_file(tmp_path, "a1", APP_TOKEN))
    assert bad_bot.returncode == 1 and "auth.test (bot token): invalid_auth" in bad_bot.stderr, bad_bot.stderr
    bad_app = processes.run(*common, "--token-file", secret_file(tmp_path, "b2", BOT_TOKEN),
                            "--app-token-file", secret_file(tmp_path, "a2", "xapp-wrong"))
    assert bad_app.returncode == 1 and "apps.connections.open (app token): invalid_auth" in bad_app.stderr
    assert nothing_saved(data)

    added = processes.run(*common, "--token-env", "BOT", "--app-token-env", "APP",
                          extra_env={"BOT": BOT_TOKEN, "APP": APP_TOKEN})
    assert added.returncode == 0, added.stderr
    assert read_secrets(data / "secrets.env") == {"SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_APP_TOKEN": APP_TOKEN}
    text = (data / "config.yaml").read_text()
    assert BOT_TOKEN not in text and APP_TOKEN not in text and "${SLACK_APP_TOKEN}" in text
    assert BOT_TOKEN not in added.stdout + added.stderr
    opened = slack.connections_opened
    processes.start("channel", "slack", name="slack")
    wait_until(lambda: slack.connections_opened > opened and "slack: connected" in processes.logs(), timeout=60,
               what="the channel connected by Socket Mode on the saved tokens")


def test_discord_reports_a_refused_token_and_names_the_bot_of_a_good_one(
        processes: Processes, discord_api: FakeDiscord, tmp_path: Path) -> None:
    common = ("channels", "add", "discord", "--api-url", discord_api.api_url)
    refused = processes.run(*common, "--token-file", secret_file(tmp_path, "bad", "not.the.token"))
    assert refused.returncode == 1 and "the bot token was refused" in refused.stderr, refused.stderr
    assert nothing_saved(tmp_path / "data")
    added = processes.run(*common, "--token-file", secret_file(tmp_path, "good", DISCORD_TOKEN))
    assert added.returncode == 0 and "Discord: the credentials work: @" in added.stdout, added.stderr
    assert read_secrets(tmp_path / "data" / "secrets.env") == {"DISCORD_BOT_TOKEN": DISCORD_TOKEN}


def private_secrets(data: Path) -> dict[str, str]:
    """secrets.env as saved: its own reader alone may read it (0600)."""
    assert (data / "secrets.env").stat().st_mode & 0o777 == 0o600
    return read_secrets(data / "secrets.env")


def test_matrix_a_refused_or_anothers_access_token_saves_nothing_a_good_one_is_saved(
        processes: Processes, synapse: Synapse, tmp_path: Path) -> None:
    data = tmp_path / "data"
    bot, someone = synapse.register(), synapse.register()
    common = ("channels", "add", "matrix", "--homeserver", synapse.url, "--user-id", bot.user_id)
    refused = processes.run(*common, "--token-file", secret_file(tmp_path, "bad", "syt_not_a_token"))
    assert refused.returncode == 1 and "Matrix whoami: M_UNKNOWN_TOKEN" in refused.stderr, refused.stderr
    assert "did not answer" not in refused.stderr  # the server's refusal, not an outage
    assert "nothing was saved" in refused.stderr and "syt_not_a_token" not in refused.stderr + refused.stdout
    theirs = processes.run(*common, "--token-file", secret_file(tmp_path, "theirs", someone.token))
    assert theirs.returncode == 1, theirs.stderr  # a real token, of another account than the bot named
    assert f"the access token is {someone.user_id}'s, not {bot.user_id}'s" in theirs.stderr
    assert someone.token not in theirs.stderr + theirs.stdout and nothing_saved(data)

    added = processes.run(*common, "--token-env", "BOT_TOKEN", extra_env={"BOT_TOKEN": bot.token})
    assert added.returncode == 0, added.stderr
    assert f"Matrix: the credentials work: {bot.user_id}" in added.stdout
    assert bot.token not in added.stdout + added.stderr
    text = (data / "config.yaml").read_text()
    assert bot.token not in text
    assert yaml.safe_load(text) == {"channels": {"matrix": {
        "enabled": True, "homeserver": synapse.url, "user_id": bot.user_id,
        "access_token": "${MATRIX_ACCESS_TOKEN}"}}}
    assert private_secrets(data) == {"MATRIX_ACCESS_TOKEN": bot.token}


def test_email_a_refused_password_or_a_server_away_saves_nothing_a_good_login_is_saved(
        processes: Processes, dovecot: Dovecot, smtp: SmtpSink, tmp_path: Path) -> None:
    data = tmp_path / "data"

    def add(password: str, *, smtp_port: int = smtp.port) -> Any:
        return processes.run("channels", "add", "email", "--tls", "none", "--imap-host", "127.0.0.1",
                             "--imap-port", str(dovecot.port), "--smtp-host", "127.0.0.1", "--smtp-port",
                             str(smtp_port), "--username", AGENT, "--address", AGENT, "--authserv-id", RECEIVER,
                             "--password-file", secret_file(tmp_path, "pw", password))

    refused = add("not-the-password")
    assert refused.returncode == 1 and f"email IMAP login: refused for {AGENT}" in refused.stderr, refused.stderr
    assert "nothing was saved" in refused.stderr and "not-the-password" not in refused.stderr + refused.stdout
    away = add(PASSWORD, smtp_port=free_port())  # IMAP takes the login, no SMTP server answers
    assert away.returncode == 1 and "email SMTP login" in away.stderr, away.stderr
    assert "the platform did not answer" in away.stderr and nothing_saved(data)

    added = add(PASSWORD)
    assert added.returncode == 0, added.stderr
    assert f"email: the credentials work: {AGENT}" in added.stdout
    assert PASSWORD not in added.stdout + added.stderr + refused.stdout + refused.stderr + away.stderr
    text = (data / "config.yaml").read_text()
    assert PASSWORD not in text
    saved = yaml.safe_load(text)["channels"]["email"]
    assert saved["password"] == "${AGENT_MAIL_PASSWORD}" and saved["username"] == AGENT
    assert (saved["imap_port"], saved["smtp_port"], saved["tls"]) == (str(dovecot.port), str(smtp.port), "none")
    assert saved["authserv_id"] == RECEIVER and "trust_from_header" not in saved
    assert private_secrets(data) == {"AGENT_MAIL_PASSWORD": PASSWORD}


def test_without_a_terminal_channels_add_names_the_flag_it_needs(processes: Processes, tmp_path: Path) -> None:
    done = processes.run("channels", "add", "matrix", "--homeserver", "http://127.0.0.1:9")
    assert done.returncode == 2 and "--user-id" in done.stderr, done.stderr
    assert nothing_saved(tmp_path / "data")


def at_a_terminal(processes: Processes, tmp_path: Path, args: tuple[str, ...], secret: str) -> tuple[int, bytes]:
    """`pincer channels add ...` driven through a pty as a person would: ``secret`` typed at the hidden question,
    every other question given its default; the exit code and all the screen showed."""
    import os
    import pty
    import select
    import subprocess
    import sys
    import time

    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "channels", "add", *args], cwd=tmp_path,
                            env=processes.env, stdin=child, stdout=child, stderr=child, start_new_session=True)
    os.close(child)
    screen, typed = b"", False
    deadline = time.monotonic() + 60
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([main], [], [], 0.2)[0]:
                try:
                    screen += os.read(main, 4096)
                except OSError:
                    break
                if not typed and b"typing is not shown" in screen:
                    os.write(main, secret.encode() + b"\n")
                    typed = True
                elif typed and screen.rstrip().endswith((b":", b"]")):
                    os.write(main, b"\n")  # every other question: its default
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)
    assert typed, screen.decode(errors="replace")
    return code, screen


def test_at_a_terminal_the_token_is_asked_hidden_and_checked_before_it_is_saved(
        processes: Processes, telegram: FakeTelegram, tmp_path: Path) -> None:
    """A refused token saves nothing, a good one is never echoed."""
    data = tmp_path / "data"
    args = ("telegram", "--api-url", telegram.api_url)
    code, screen = at_a_terminal(processes, tmp_path, args, "123:wrong-token")
    assert code == 1 and b"rejected by the server" in screen and b"nothing was saved" in screen
    assert b"wrong-token" not in screen and nothing_saved(data)
    code, screen = at_a_terminal(processes, tmp_path, args, TOKEN)
    assert code == 0, screen.decode(errors="replace")
    assert b"@pincer_test_bot" in screen and TOKEN.encode() not in screen
    assert read_secrets(data / "secrets.env") == {"TELEGRAM_BOT_TOKEN": TOKEN}


def test_at_a_terminal_a_matrix_access_token_is_asked_hidden_and_checked_before_it_is_saved(
        processes: Processes, synapse: Synapse, tmp_path: Path) -> None:
    """The homeserver and the bot's id from flags, its access token typed where it is not shown."""
    data = tmp_path / "data"
    bot = synapse.register()
    args = ("matrix", "--homeserver", synapse.url, "--user-id", bot.user_id)
    code, screen = at_a_terminal(processes, tmp_path, args, "syt_typed_wrong")
    assert code == 1 and b"Matrix whoami" in screen and b"nothing was saved" in screen, screen
    assert b"syt_typed_wrong" not in screen and nothing_saved(data)
    code, screen = at_a_terminal(processes, tmp_path, args, bot.token)
    assert code == 0, screen.decode(errors="replace")
    assert bot.user_id.encode() in screen and bot.token.encode() not in screen
    assert private_secrets(data) == {"MATRIX_ACCESS_TOKEN": bot.token}
