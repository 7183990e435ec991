"""Pincer as a user installs it: the wheel, built from this tree, in a fresh venv outside the checkout."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bus.presence import alive
from bus.redis_server import free_port
from bus.streams import Bus
from tests.conftest import OWNER_TOKEN, ROOT, Processes, gateway_client, gateway_health, stack_healthy, wait_until
from tests.fake_telegram import FakeTelegram
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


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def wait_for(bus: Bus, role: str, n: int) -> list[str]:
    """The ``n`` live instances of ``role``, once there are exactly that many."""
    for _ in range(600):
        found = await alive(bus, role)
        if len(found) == n:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"expected {n} {role} alive")


def start_stack(processes: Processes, *, hands: int = 2, brain: bool = True) -> None:
    """A Gateway, a Brain and ``hands`` workers, as separate processes, once /healthz counts them."""
    processes.start("gateway", name="gateway")
    if brain:
        processes.start("brain", name="brain")
    for i in range(hands):
        processes.start("hands", name=f"hands-{i}")
    wait_until(
        lambda: (h := gateway_health(processes.env)) and h.get("brains") == int(brain) and h.get("hands") == hands,
        timeout=60,
        what=f"gateway healthz with {int(brain)} brain and {hands} hands",
    )


def channel_rows(processes: Processes) -> list[dict[str, Any]]:
    """`pincer channels --json`: a row per channel process, as its last heartbeat reported it."""
    rows: list[dict[str, Any]] = json.loads(processes.run("channels", "--json").stdout)
    return rows


def channel_state(processes: Processes) -> str:
    """The first channel's state (connected, stalled, ...), or "none" while no channel reported."""
    rows = channel_rows(processes)
    return str(rows[0]["state"]) if rows else "none"


def send(env: dict[str, str], text: str, session: str = "e2e") -> httpx.Response:
    """One chat message through the Gateway's HTTP API, answered when the turn ends."""
    with gateway_client(env) as client:
        return client.post(f"/v1/sessions/{session}/messages", json={"text": text})


@pytest.fixture
def asking_stack(processes: Processes, pincer_env: dict[str, str], ws: Path) -> dict[str, str]:
    """A Gateway, a Brain and a Hands worker, exec asking a person first, in a workspace the sandbox reaches."""
    processes.env = {**pincer_env, "PINCER_WORKSPACE": str(ws), "PINCER_HANDS__EXEC__MODE": "ask",
                     "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true"}
    start_stack(processes, hands=1)
    return processes.env


def create_token(processes: Processes, name: str, *args: str) -> str:
    made = processes.run("token", "create", name, *args)
    assert made.returncode == 0, made.stderr
    assert "shown this once" in made.stderr
    return made.stdout.strip()


@pytest.fixture
def secured(processes: Processes, pincer_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """A stack with two agents, read_file kept for alice, and small per-token limits."""
    workspace = Path(tempfile.mkdtemp(prefix="pincer-e2e-sec-"))
    workspace.chmod(0o755)
    (workspace / "notes.txt").write_text("the secret word is pincer-42\n")
    processes.env = {**pincer_env, "PINCER_WORKSPACE": str(workspace),
                     "PINCER_BRAIN__AGENTS": "{coder: {}}",
                     "PINCER_HANDS__TOOLS__OWNER_ONLY": "[read_file]",
                     "PINCER_HANDS__TOOLS__OWNERS": "[alice]",
                     "PINCER_HANDS__EXEC__MODE": "ask", "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true",
                     "PINCER_GATEWAY__LIMITS__BURST": "6", "PINCER_GATEWAY__LIMITS__MESSAGES_PER_MINUTE": "6",
                     "PINCER_GATEWAY__LIMITS__OPEN_TURNS_PER_TOKEN": "1"}
    processes.start("gateway", name="gateway")
    processes.start("brain", name="brain")
    processes.start("hands", name="hands")
    wait_until(lambda: stack_healthy(processes.env), timeout=60, what="healthy stack")
    yield processes.env
    shutil.rmtree(workspace, ignore_errors=True)


@pytest.fixture
def telegram() -> Iterator[FakeTelegram]:
    """A local Bot API server speaking Telegram's documented HTTP shape (tests/fake_telegram.py)."""
    fake = FakeTelegram().start()
    yield fake
    fake.stop()


# -- the page in a browser: the system's Chromium, driven by Playwright ---------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
# As CI runs it (root, no display, a closed network): no sandbox of Chromium's own, nothing phoning home.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


@pytest.fixture
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail("Chromium is not installed: .ci/run installs it (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield launched
        launched.close()


def signed_in(browser, env: dict, **options):  # type: ignore[no-untyped-def]
    """A new browser context and page, signed in through a one-time link."""
    from playwright.sync_api import expect

    context = browser.new_context(**options)
    page = context.new_page()
    page.goto(sign_in_link(env))
    expect(page.locator("#app")).to_be_visible()
    return context, page


def sign_in_link(env: dict) -> str:
    made = subprocess.run(
        [sys.executable, "-m", "gateway", "open", "--print"],
        env={**env, "PINCER_TOKEN": OWNER_TOKEN},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[0]
