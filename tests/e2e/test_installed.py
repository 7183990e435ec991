"""The installed wheel works from any directory: its config and skills are package data."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import wait_until
from tests.e2e.conftest import Installed, installed_env
from tests.scripted_llm import ScriptedLLM

# The first test to use the installed wheel builds it and installs its dependencies from the package
# index (minutes on a machine with no download cache); pipx and uv install them again.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_the_wheel_runs_pincer_up_and_a_tool_turn_from_an_empty_directory(
        installed: Installed, tmp_path: Path, scripted_llm: ScriptedLLM) -> None:
    env = installed_env(tmp_path, scripted_llm)
    empty = tmp_path / "empty"
    empty.mkdir()
    where = subprocess.run([installed.python, "-c", "import bus, hands.sandbox, skills; print(bus.__file__)"],
                           env=env, cwd=empty, capture_output=True, text=True, check=True).stdout
    assert str(installed.venv) in where  # the installed package, not this checkout

    skills = subprocess.run([installed.pincer, "skills", "--json"], env=env, cwd=empty, capture_output=True,
                            text=True, timeout=60)
    assert skills.returncode == 0, skills.stderr
    assert [t["name"] for t in json.loads(skills.stdout)["tools"]] == ["word_count"]  # shipped as package data

    (Path(env["PINCER_WORKSPACE"]) / "notes.txt").write_text("the secret word is pincer-42\n")
    log = tmp_path / "up.log"
    up = subprocess.Popen([installed.pincer, "up", "--hands", "1"], env=env, cwd=empty, stdout=log.open("wb"),
                          stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: "ready: Gateway on" in log.read_text() or up.poll() is not None, timeout=120,
                   what="the installed pincer up to be ready")
        assert up.poll() is None, log.read_text()
        chat = subprocess.run([installed.pincer, "chat", "-m", 'CALL read_file {"path": "notes.txt"}'], env=env,
                              cwd=empty, capture_output=True, text=True, timeout=60)
        assert chat.returncode == 0, chat.stderr + log.read_text()
        assert "pincer-42" in chat.stdout and "read_file" in chat.stderr
        policy = subprocess.run([installed.pincer, "policy", "explain", "exec"], env=env, cwd=empty,
                                capture_output=True, text=True, timeout=60)
        assert policy.returncode == 0 and "ALLOWED" in policy.stdout, policy.stderr
        opened = subprocess.run([installed.pincer, "open", "--print"], env=env, cwd=empty, capture_output=True,
                                text=True, timeout=60)
        assert opened.returncode == 0, opened.stderr
        link = httpx.URL(opened.stdout.strip().splitlines()[0])
        with httpx.Client(timeout=10, follow_redirects=True) as browser:  # the page and its files, from the wheel
            login = browser.get(link)  # as a browser does: the part after '#' stays with the page's script
            assert login.status_code == 200 and '<script src="/static/login.js"' in login.text
            assert "history.replaceState" in browser.get(link.join("/static/login.js")).text
            code = link.fragment.removeprefix("code=")
            assert browser.post(link.join("/login"), json={"code": code}).status_code == 200
            page = browser.get(link.join("/"))
            assert page.status_code == 200 and '<script src="/static/app.js"' in page.text
            assert browser.get(link.join("/v1/me")).json()["name"] == "owner"  # signed in by the cookie
            assert "DOMPurify" in browser.get(page.url.join("/static/vendor/purify.min.js")).text
            assert "uPlot" in browser.get(page.url.join("/static/vendor/uPlot.iife.min.js")).text  # the spend chart
            assert browser.get(page.url.join("/static/vendor/uPlot.min.css")).status_code == 200
    finally:
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0, log.read_text()


@pytest.mark.parametrize("installer", ["pipx", "uv"])
def test_pipx_and_uv_tool_install_give_a_working_pincer(installer: str, tmp_path: Path,
                                                        scripted_llm: ScriptedLLM) -> None:
    import sys

    from tests.conftest import ROOT

    env = {**installed_env(tmp_path, scripted_llm), "PIPX_HOME": str(tmp_path / "pipx"),
           "PIPX_BIN_DIR": str(tmp_path / "bin"), "UV_TOOL_DIR": str(tmp_path / "uv-tools"),
           "UV_TOOL_BIN_DIR": str(tmp_path / "bin"), "UV_PYTHON_DOWNLOADS": "never"}
    python = getattr(sys, "_base_executable", sys.executable)  # a real interpreter, not this venv's
    command = [sys.executable, "-m", "pipx", "install", "--python", python, str(ROOT)] if installer == "pipx" else \
        [str(Path(sys.executable).parent / "uv"), "tool", "install", "--python", python, str(ROOT)]
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    skills = subprocess.run([str(tmp_path / "bin" / "pincer"), "skills", "--json"], env=env, cwd=empty,
                            capture_output=True, text=True, timeout=120)
    assert skills.returncode == 0, skills.stderr
    assert [t["name"] for t in json.loads(skills.stdout)["tools"]] == ["word_count"]
