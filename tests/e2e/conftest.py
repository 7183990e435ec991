"""Pincer as a user installs it: the wheel, built from this tree, in a fresh venv outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from bus.redis_server import free_port
from tests.conftest import ROOT
from tests.scripted_llm import ScriptedLLM


@dataclass(frozen=True)
class Installed:
    venv: Path

    @property
    def pincer(self) -> str:
        return str(self.venv / "bin" / "pincer")

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """``pip install <wheel>`` into a new venv (once per test run): no source tree, no PYTHONPATH."""
    where = tmp_path_factory.mktemp("installed")
    quiet = ["--quiet", "--quiet", "--disable-pip-version-check"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", *quiet, "--no-deps", "-w", str(where / "dist"), str(ROOT)],
                   check=True, timeout=300, cwd=where)
    wheel = next((where / "dist").glob("pincer-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", str(where / "venv")], check=True, timeout=120)
    subprocess.run([str(where / "venv" / "bin" / "python"), "-m", "pip", "install", *quiet, str(wheel)],
                   check=True, timeout=600, cwd=where)
    return Installed(where / "venv")


def installed_env(tmp_path: Path, scripted_llm: ScriptedLLM) -> dict[str, str]:
    """A user's environment: their own home and data dir, a model, and nothing of this checkout."""
    home = tmp_path / "home"
    (home / "workspace").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PINCER_", "PYTHON", "VIRTUAL_ENV")) and not k.endswith("_API_KEY")}
    env.update({
        "HOME": str(home),
        "PINCER_DATA_DIR": str(home / ".pincer"),
        "PINCER_WORKSPACE": str(home / "workspace"),
        "PINCER_MODEL": "openai/scripted",
        "PINCER_LLM_API_BASE": scripted_llm.api_base,
        "PINCER_LLM_API_KEY": "sk-scripted",
        "PINCER_GATEWAY_PORT": str(free_port()),
        "PINCER_RUNTIME__HEARTBEAT_S": "0.5",
        "PYTHONUNBUFFERED": "1",
    })
    return env
