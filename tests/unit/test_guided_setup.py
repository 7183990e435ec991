"""`pincer setup` without a terminal (flags) and at one (a pty), and the data dir's secrets.env it writes."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bus.config import ConfigError, load_config
from bus.secrets_file import apply_secrets, read_secrets, save_secrets
from tests.conftest import ROOT

KEY = "sk-test-0123456789-secret"


def clean_env(tmp_path: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINCER_") and not k.endswith("_API_KEY")}
    return {**env, "PINCER_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT), **more}


def pincer(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=tmp_path, env=env or clean_env(tmp_path),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


def written(tmp_path: Path) -> tuple[dict[str, object], str, dict[str, str]]:
    """config.yaml parsed, its text, and secrets.env read back."""
    text = (tmp_path / "data" / "config.yaml").read_text()
    return yaml.safe_load(text), text, read_secrets(tmp_path / "data" / "secrets.env")


def test_flags_alone_write_a_commented_config_and_a_private_secrets_file(tmp_path: Path) -> None:
    done = pincer(tmp_path, "setup", "--model", "anthropic", "--api-key-env", "MY_KEY", "--owner", "Ada Lovelace",
                  env=clean_env(tmp_path, MY_KEY=KEY))
    assert done.returncode == 0, done.stderr
    config, text, secrets = written(tmp_path)
    assert config == {"brain": {"model": "anthropic/claude-3-5-haiku-latest",
                                "instructions": config["brain"]["instructions"]}}  # type: ignore[index]
    assert "Ada Lovelace" in config["brain"]["instructions"]  # type: ignore[index]
    assert text.startswith("# Written by `pincer setup`") and "packaged" in text
    assert secrets == {"ANTHROPIC_API_KEY": KEY}
    for name in ("config.yaml", "secrets.env"):
        assert (tmp_path / "data" / name).stat().st_mode & 0o777 == 0o600
    assert KEY not in text and KEY not in done.stdout + done.stderr
    assert "ANTHROPIC_API_KEY" in done.stdout  # the name is said, never the value
    loaded = load_config(env={"PINCER_DATA_DIR": str(tmp_path / "data")})
    assert loaded.source == tmp_path / "data" / "config.yaml"
    assert loaded.raw["brain"]["model"] == "anthropic/claude-3-5-haiku-latest"


def test_a_key_file_a_local_server_and_the_local_model(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    assert pincer(tmp_path, "setup", "--model", "groq/llama-3.1-8b-instant", "--api-key-file",
                  str(key_file)).returncode == 0
    assert written(tmp_path)[2] == {"GROQ_API_KEY": KEY}
    assert written(tmp_path)[0] == {"brain": {"model": "groq/llama-3.1-8b-instant"}}

    server = pincer(tmp_path, "setup", "--force", "--api-base", "http://127.0.0.1:11434/v1", "--model", "llama3.2",
                    "--yes")
    assert server.returncode == 0, server.stderr
    assert written(tmp_path)[0] == {"brain": {"model": "openai/llama3.2", "api_base": "http://127.0.0.1:11434/v1"}}
    assert written(tmp_path)[2] == {"GROQ_API_KEY": KEY}  # the file's other lines are kept

    assert pincer(tmp_path, "setup", "--force", "--local-model").returncode == 0
    assert written(tmp_path)[0] == {"brain": {"model": "local"}}


def test_an_existing_config_is_kept_unless_forced(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    mine = tmp_path / "data" / "config.yaml"
    mine.write_text("brain: {model: openai/gpt-4o}\n")
    refused = pincer(tmp_path, "setup", "--local-model")
    assert refused.returncode == 1 and str(mine) in refused.stderr and "--force" in refused.stderr
    assert mine.read_text() == "brain: {model: openai/gpt-4o}\n"
    assert not (tmp_path / "data" / "secrets.env").exists()
    assert pincer(tmp_path, "setup", "--local-model", "--force").returncode == 0
    assert written(tmp_path)[0] == {"brain": {"model": "local"}}


@pytest.mark.parametrize(("args", "flag"), [
    ((), "--model"),
    (("--model", "openai"), "--api-key-file PATH or --api-key-env VAR"),
    (("--api-base", "http://127.0.0.1:8000/v1"), "--model"),
    (("--local-model", "--channel", "telegram"), "--token-file PATH or --token-env VAR"),
    (("--model", "gpt-4o"), "PROVIDER/MODEL"),
])
def test_without_a_terminal_a_missing_answer_names_its_flag_and_nothing_is_written(
        tmp_path: Path, args: tuple[str, ...], flag: str) -> None:
    done = pincer(tmp_path, "setup", *args)
    assert done.returncode == 2 and flag in done.stderr, done.stderr
    assert not (tmp_path / "data").exists()


def test_at_a_terminal_the_questions_are_asked_and_the_key_is_never_echoed(tmp_path: Path) -> None:
    """Driven through a pty, as a person would: the menu, the default model, a hidden key, a name."""
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "setup"], cwd=tmp_path, env=clean_env(tmp_path),
                            stdin=child, stdout=child, stderr=child, start_new_session=True)
    os.close(child)
    screen = b""

    def expect(text: str) -> None:
        nonlocal screen
        deadline = time.monotonic() + 30
        while text.encode() not in screen:
            assert time.monotonic() < deadline, f"no {text!r} on the terminal: {screen.decode(errors='replace')}"
            if select.select([main], [], [], 0.5)[0]:
                try:
                    screen += os.read(main, 4096)
                except OSError:  # the child closed the terminal
                    break
        assert text.encode() in screen, screen.decode(errors="replace")

    try:
        expect("choose")
        os.write(main, b"1\n")  # OpenAI
        expect("OpenAI model [openai/gpt-4o-mini]")
        os.write(main, b"\n")
        expect("typing is not shown")
        os.write(main, KEY.encode() + b"\n")
        expect("Your name")
        os.write(main, b"Grace\n")
        expect("A chat app")
        os.write(main, b"\n")
        expect("next: `pincer up`")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)
    assert KEY.encode() not in screen  # getpass: the key was typed, never shown
    config, text, secrets = written(tmp_path)
    assert config["brain"]["model"] == "openai/gpt-4o-mini"  # type: ignore[index]
    assert secrets == {"OPENAI_API_KEY": KEY} and KEY not in text


def test_secrets_file_round_trip_keeps_other_lines_and_the_environment_wins(tmp_path: Path) -> None:
    path = tmp_path / "d" / "secrets.env"
    tricky = 'pa ss"w\\o$rd#1'
    save_secrets(path, {"A_TOKEN": "plain-value:1", "B_PASSWORD": tricky})
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    with path.open("a") as handle:
        handle.write("# mine\nexport C_KEY='single quoted'\n")
    save_secrets(path, {"A_TOKEN": "new"})
    assert read_secrets(path) == {"A_TOKEN": "new", "B_PASSWORD": tricky, "C_KEY": "single quoted"}
    assert "# mine" in path.read_text()
    env = {"B_PASSWORD": "from the environment"}
    assert sorted(apply_secrets(env, path)) == ["A_TOKEN", "C_KEY"]
    assert env["B_PASSWORD"] == "from the environment"


def test_a_bad_secrets_line_names_the_line_not_its_value(tmp_path: Path) -> None:
    path = tmp_path / "secrets.env"
    path.write_text("GOOD=1\nthis is hunter2\n")
    with pytest.raises(ConfigError) as refused:
        read_secrets(path)
    assert "line 2" in str(refused.value) and "hunter2" not in str(refused.value)
    with pytest.raises(ConfigError):
        save_secrets(path, {"X": "two\nlines"})


def test_every_pincer_command_reads_the_secrets_file_under_the_environment(tmp_path: Path) -> None:
    """A wrong value in secrets.env is the config's; the same variable in the environment wins over it."""
    save_secrets(tmp_path / "data" / "secrets.env", {"PINCER_GATEWAY_PORT": "not-a-port"})
    assert pincer(tmp_path, "gateway").returncode == 78  # read from the file: refused as a bad port
    listed = pincer(tmp_path, "tools", "--json", env=clean_env(tmp_path, PINCER_GATEWAY_PORT="8780"))
    assert "not-a-port" not in listed.stderr
