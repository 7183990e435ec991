"""``pincer up``: embedded Redis and every process from one command; clean stop; data survives a restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Processes, gateway_client, wait_until
from tests.e2e.conftest import descendants, pid_alive
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.e2e


@pytest.fixture
def up_env(pincer_env: dict[str, str], processes: Processes) -> dict[str, str]:
    env = dict(pincer_env)
    del env["PINCER_REDIS_URL"]  # no Redis configured: pincer up must start its own
    del env["PINCER_GATEWAY_TOKEN"]  # nor a token: pincer up makes the owner's and pincer chat finds it
    env["PINCER_REDIS__PREFIX"] = "pincer:"
    processes.env = env
    return env


def start_up(processes: Processes, env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
    processes.env = env
    proc = processes.start("up", "--hands", "2", name=name)
    log = processes.tmp_path / f"{name}.log"
    wait_until(lambda: "ready: Gateway on" in log.read_text(), timeout=90, what="pincer up ready")
    return proc


def test_up_runs_everything_stops_cleanly_and_keeps_transcripts(processes: Processes, up_env: dict[str, str],
                                                               tmp_path: Path, scripted_llm: ScriptedLLM) -> None:
    (tmp_path / "workspace" / "notes.txt").write_text("the secret word is pincer-42\n")
    up = start_up(processes, up_env, "up-1")
    log = (tmp_path / "up-1.log").read_text()
    assert "embedded Redis on 127.0.0.1:" in log
    for role in ("gateway |", "brain |", "hands-1 |", "hands-2 |"):
        assert role in log  # each child's lines carry its role
    children = descendants(up.pid)
    assert len(children) >= 5  # redis-server, gateway, brain, two hands
    assert (tmp_path / "data" / "redis.url").stat().st_mode & 0o077 == 0  # the password stays private

    chat = processes.run("chat", "-m", 'CALL read_file {"path": "notes.txt"}', "--session", "kept")
    assert chat.returncode == 0, chat.stderr + processes.logs()
    assert "pincer-42" in chat.stdout

    assert processes.stop(up, signal.SIGTERM, timeout=30) == 0
    assert not [pid for pid in children if pid_alive(pid)], "pincer up left processes behind"
    assert "stopped" in (tmp_path / "up-1.log").read_text()

    # A second start on the same data directory finds the transcript again (append-only file). It also
    # takes a setting whose name ends like a secret's from the environment (they used to be dropped).
    up_env = {**up_env, "PINCER_GATEWAY__LIMITS__OPEN_TURNS_PER_TOKEN": "1"}
    up = start_up(processes, up_env, "up-2")
    token_file = tmp_path / "data" / "gateway.token"
    assert token_file.stat().st_mode & 0o077 == 0  # the owner token stays private too
    with gateway_client(up_env, token_file.read_text().strip()) as client:
        assert client.get("/v1/sessions/kept", headers={"Authorization": "Bearer wrong"}).status_code == 401
        entries = client.get("/v1/sessions/kept").json()["entries"]
    assert [e["role"] for e in entries] == ["user", "assistant", "tool", "assistant"]
    # ... and the conversation goes on from it: the model is sent the turn before the restart.
    again = processes.run("chat", "-m", "and now?", "--session", "kept")
    assert again.returncode == 0 and "echo: and now?" in again.stdout, again.stderr + processes.logs()
    sent = scripted_llm.requests[-1]["messages"]
    assert any(m["role"] == "tool" and "pincer-42" in (m.get("content") or "") for m in sent)
    slow = processes.start("chat", "-m", "SLEEP 20", "--session", "slow", name="slow-chat")
    with gateway_client(up_env, token_file.read_text().strip()) as client:
        wait_until(lambda: client.get("/v1/sessions/slow").status_code == 200, timeout=30, what="the slow turn")
        second = client.post("/v1/sessions/other/messages", json={"text": "hi"})
    assert second.status_code == 429 and "open_turns_per_token" in second.text, second.text
    processes.stop(slow, signal.SIGKILL)
    assert processes.stop(up, signal.SIGINT, timeout=30) == 0


def test_without_a_model_up_starts_and_chat_explains_what_to_configure(processes: Processes,
                                                                       up_env: dict[str, str]) -> None:
    env = {k: v for k, v in up_env.items() if k not in ("PINCER_MODEL", "PINCER_LLM_API_BASE", "PINCER_LLM_API_KEY")}
    processes.env = env
    up = start_up(processes, env, "up-nomodel")
    chat = processes.run("chat", "-m", "hello")
    assert chat.returncode == 1
    assert "MODEL_NOT_CONFIGURED" in chat.stderr and "PINCER_MODEL" in chat.stderr
    assert "pincer up --local-model" in chat.stderr  # the way with no key at all, and what it downloads
    said = (processes.tmp_path / "up-nomodel.log").read_text()
    assert "warning: No LLM model is configured" in said and "--local-model" in said  # said at start too
    assert up.poll() is None  # nothing crashed
    assert processes.stop(up) == 0


def test_a_local_model_that_cannot_chat_stops_startup_saying_why(processes: Processes, up_env: dict[str, str],
                                                                 tmp_path: Path) -> None:
    not_a_model = tmp_path / "weights.gguf"
    not_a_model.write_text("surely a model")
    up = processes.run("up", "--local-model", timeout=60,
                       extra_env={"PINCER_BRAIN__LOCAL__MODEL_PATH": str(not_a_model)})
    assert up.returncode == 1, up.stdout + up.stderr
    assert f"the local model is not ready: brain.local.model_path: {not_a_model} is not a GGUF model file" in up.stdout
    assert "embedded Redis" not in up.stdout  # refused before anything started


def test_a_bad_config_stops_startup_with_one_clear_message(processes: Processes, up_env: dict[str, str]) -> None:
    bad = processes.run("up", extra_env={"PINCER_GATEWAY_PORT": "not-a-port"})
    assert bad.returncode == 78  # EX_CONFIG: a service manager must not restart it
    assert bad.stderr.strip().count("\n") == 0
    assert "gateway.port" in bad.stderr and "PINCER_GATEWAY__PORT" in bad.stderr


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def test_model_keys_reach_the_brain_alone_and_private_files_take_no_link(processes: Processes,
                                                                         up_env: dict[str, str],
                                                                         tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (data / "redis.url").symlink_to(victim)  # planted where the Redis credential goes
    (data / "redis.url").chmod(0o644)
    env = {**up_env, "OPENAI_API_KEY": "sk-provider-secret", "AWS_SECRET_ACCESS_KEY": "aws-secret",
           "GITHUB_TOKEN": "ghp-secret"}
    up = start_up(processes, env, "up-secrets")
    try:
        state = json.loads((data / "pincer.json").read_text())
        for role, proc in state["children"].items():
            seen = environ(proc["pid"])
            assert "PINCER_REDIS_URL" in seen, role  # every role reaches Redis
            has_keys = {"OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "PINCER_LLM_API_KEY"} & set(seen)
            if role == "brain":
                assert seen["OPENAI_API_KEY"] == "sk-provider-secret" and "PINCER_GATEWAY_TOKEN" not in seen
            else:
                assert not has_keys, (role, has_keys)
            assert ("PINCER_GATEWAY_TOKEN" in seen) is (role == "gateway")
        assert victim.read_text() == "keep me"  # the link was replaced, not written through
        url_file = data / "redis.url"
        assert not url_file.is_symlink() and url_file.stat().st_mode & 0o777 == 0o600
    finally:
        assert processes.stop(up) == 0


def test_a_workspace_that_holds_the_data_dir_stops_startup(processes: Processes, up_env: dict[str, str],
                                                            tmp_path: Path) -> None:
    refused = processes.run("up", extra_env={"PINCER_WORKSPACE": str(tmp_path)})  # the data dir is tmp_path/data
    assert refused.returncode == 78 and refused.stderr.strip().count("\n") == 0
    assert "contains the data directory" in refused.stderr
    assert processes.run("hands", extra_env={"PINCER_WORKSPACE": str(tmp_path)}).returncode == 78


def test_up_starts_an_enabled_channel_hands_it_its_token_alone_and_restarts_it(
        processes: Processes, up_env: dict[str, str], tmp_path: Path) -> None:
    from tests.fake_telegram import TOKEN, FakeTelegram

    telegram = FakeTelegram().start()
    try:
        env = {**up_env, "TELEGRAM_BOT_TOKEN": TOKEN, "PINCER_CHANNELS__TELEGRAM__ENABLED": "true",
               "PINCER_CHANNELS__TELEGRAM__BOT_TOKEN": "${TELEGRAM_BOT_TOKEN}",
               "PINCER_CHANNELS__TELEGRAM__API_URL": telegram.api_url,
               "PINCER_CHANNELS__TELEGRAM__ALLOW_FROM": '["111"]',
               "PINCER_CHANNELS__TELEGRAM__POLL_TIMEOUT_S": "1"}
        up = start_up(processes, env, "up-channel")
        wait_until(lambda: telegram.calls_of("getUpdates"), timeout=60, what="the channel polling")
        channel = next(pid for pid in descendants(up.pid) if "gateway.channels" in _cmdline(pid))
        environ = Path(f"/proc/{channel}/environ").read_bytes().split(b"\0")
        assert f"PINCER_CHANNELS__TELEGRAM__BOT_TOKEN={TOKEN}".encode() in environ
        assert not any(b"TELEGRAM_BOT_TOKEN=" + TOKEN.encode() == e for e in environ)  # the variable stays home
        brain = next(pid for pid in descendants(up.pid) if _cmdline(pid).endswith("-m brain"))
        assert TOKEN.encode() not in Path(f"/proc/{brain}/environ").read_bytes()  # no other role sees it
        telegram.say(111, "hello from the phone")
        wait_until(lambda: any("echo: hello from the phone" in s.text for s in telegram.to(111)), timeout=60,
                   what="the answer")
        os.kill(channel, signal.SIGKILL)
        wait_until(lambda: any("gateway.channels" in _cmdline(p) and p != channel for p in descendants(up.pid)),
                   timeout=60, what="the channel restarted by pincer up")
        telegram.say(111, "still there?")
        wait_until(lambda: any("echo: still there?" in s.text for s in telegram.to(111)), timeout=60,
                   what="the restarted channel answering")
        assert processes.stop(up, signal.SIGTERM, timeout=30) == 0
    finally:
        telegram.stop()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""
