"""Fixtures that start real things and always tear them down."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bus.redis_server import EmbeddedRedis, free_port
from bus.settings import RedisSettings
from bus.streams import Bus
from tests.mailservers import Dovecot, SmtpSink
from tests.scripted_llm import ScriptedLLM

ROOT = Path(__file__).resolve().parent.parent
# The Gateway's configured operator token (named "owner") in every test stack.
OWNER_TOKEN = f"pcr_test-owner-{uuid.uuid4().hex}"
SHIPPED_SKILLS = ROOT / "skills"
# What a Hands worker offers with the shipped skills only (to a sender who is not an owner) ...
TOOL_NAMES = ["ask_user", "delegate", "exec", "execute_python", "list_directory", "memory_delete", "memory_read",
              "memory_search", "memory_write", "process", "read_file", "read_files", "read_skill", "web_fetch",
              "web_search", "word_count", "write_file"]
# ... and to the owner: the owner-only tools too (hands.tools.owner_only).
OWNER_TOOL_NAMES = sorted([*TOOL_NAMES, "schedule"])


def wait_until(condition: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.05, what: str = "") -> Any:
    """Poll until ``condition()`` is truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")


MODEL_CLIENTS: list[Any] = []  # model clients tests made, for ``close_model_clients``


def closed_after_test(client: Any) -> Any:
    """A model client to close after its test (its connection pool): for modules that use the
    ``close_model_clients`` fixture."""
    MODEL_CLIENTS.append(client)
    return client


@pytest.fixture
async def close_model_clients() -> AsyncIterator[None]:
    yield
    while MODEL_CLIENTS:
        await MODEL_CLIENTS.pop().close()


async def async_wait_until(condition: Callable[[], Any], *, timeout: float = 20.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")


async def nothing_pending(bus: Bus, stream: str, group: str) -> None:
    """Every entry of ``stream`` acknowledged by ``group``. An ack follows its reply once Redis
    has the reply, a round trip after the caller may have read it: wait for it, do not assume it."""
    async def settled() -> bool:
        return (await bus.redis.xpending(stream, group))["pending"] == 0

    await async_wait_until(settled, timeout=10, what=f"nothing pending in {stream} for {group}")


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server on a free loopback port, for the whole test session."""
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    url = server.start()
    yield url
    server.stop()


@pytest.fixture
def prefix() -> str:
    """Each test gets its own key prefix, so tests sharing one Redis never see each other."""
    return f"t{uuid.uuid4().hex[:10]}:"


@pytest.fixture
async def bus(redis_url: str, prefix: str) -> AsyncIterator[Bus]:
    bus = Bus.from_settings(RedisSettings(prefix=prefix), redis_url)
    yield bus
    await bus.close()


@pytest.fixture
def scripted_llm() -> Iterator[ScriptedLLM]:
    server = ScriptedLLM().start()
    yield server
    server.stop()


def make_skill(root: Path, folder: str, frontmatter: str, handler: str | None = None, body: str = "") -> Path:
    skill = root / folder
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(f"---\n{textwrap.dedent(frontmatter).strip()}\n---\n{body}")
    if handler is not None:
        (skill / "handler.py").write_text(textwrap.dedent(handler))
    return skill


class Processes:
    """Real ``pincer`` processes, each in its own process group, killed as a group at teardown."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.tmp_path, self.env = tmp_path, env
        self.started: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(
        self, *args: str, name: str | None = None, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        name = name or f"{args[0]}-{len(self.started)}"
        log = self.tmp_path / f"{name}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", *args], cwd=self.tmp_path, env={**self.env, **(extra_env or {})},
            stdin=subprocess.DEVNULL, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.started.append((name, proc, log))
        return proc

    def run(self, *args: str, timeout: float = 60, extra_env: dict[str, str] | None = None,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", *args], cwd=self.tmp_path, env={**self.env, **(extra_env or {})},
            capture_output=True, text=True, timeout=timeout, input=input,
            stdin=subprocess.DEVNULL if input is None else None,
        )

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{log.read_text(errors='replace')}" for name, _, log in self.started)

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        with _SuppressLookup():
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with _SuppressLookup():
                os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()

    def stop_all(self) -> None:
        """SIGTERM every group first, then wait for each: they shut down side by side, not in turn."""
        running = [proc for _, proc, _ in self.started if proc.poll() is None]
        for proc in running:
            with _SuppressLookup():
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in running:
            self.stop(proc)


class _SuppressLookup:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, *_: Any) -> bool:
        return kind is not None and issubclass(kind, (ProcessLookupError, PermissionError))


@pytest.fixture
def pincer_env(tmp_path: Path, redis_url: str, prefix: str, scripted_llm: ScriptedLLM) -> dict[str, str]:
    """Environment for real pincer processes: our Redis and prefix, the scripted model, a temp workspace."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINCER_") and not k.endswith("_API_KEY")}
    env.update({
        "PINCER_REDIS_URL": redis_url,
        "PINCER_REDIS__PREFIX": prefix,
        "PINCER_MODEL": "openai/scripted",
        "PINCER_LLM_API_BASE": scripted_llm.api_base,
        "PINCER_LLM_API_KEY": "sk-scripted",
        "PINCER_BRAIN__LLM_RETRIES": "0",
        # litellm's own road for openai/ models too (the OpenAI-API tests take the direct one).
        "PINCER_BRAIN__OPENAI_DIRECT": "false",
        "PINCER_WORKSPACE": str(workspace),
        "PINCER_HANDS__SKILL_DIRS": f'["{SHIPPED_SKILLS}"]',  # not the developer's own skills
        "PINCER_DATA_DIR": str(tmp_path / "data"),
        "PINCER_GATEWAY_PORT": str(free_port()),
        "PINCER_GATEWAY_TOKEN": OWNER_TOKEN,
        "PINCER_RUNTIME__HEARTBEAT_S": "0.5",
        "PINCER_RUNTIME__LOG_LEVEL": "DEBUG",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    })
    return env


def gateway_url(env: dict[str, str]) -> str:
    return f"http://127.0.0.1:{env['PINCER_GATEWAY_PORT']}"


def gateway_health(env: dict[str, str]) -> dict[str, Any] | None:
    """The test stack's /healthz answer (503 included), or None while the Gateway does not listen."""
    try:
        found: dict[str, Any] = httpx.get(f"{gateway_url(env)}/healthz", timeout=2).json()
        return found
    except httpx.HTTPError:
        return None


def stack_healthy(env: dict[str, str]) -> bool:
    return (gateway_health(env) or {}).get("status") == "ok"


def gateway_client(env: dict[str, str], token: str | None = OWNER_TOKEN, timeout: float = 60) -> httpx.Client:
    """An HTTP client of the test stack's Gateway, sending ``token`` (the owner's by default)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=gateway_url(env), headers=headers, timeout=timeout)


@pytest.fixture
def processes(tmp_path: Path, pincer_env: dict[str, str], request: pytest.FixtureRequest) -> Iterator[Processes]:
    procs = Processes(tmp_path, pincer_env)
    yield procs
    procs.stop_all()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(procs.logs())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def processes_matching(text: str) -> list[str]:
    """Command lines of live processes that contain ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(cmdline)
    return found


@pytest.fixture
def ws() -> Iterator[Path]:
    """A workspace the sandbox uid can reach (pytest's own temp dirs are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="pincer-ws-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(identity_tree(path, ""), ignore_errors=True)


def identity_tree(workspace: Path, identity: str) -> Path:
    """Where an identity that is not an owner works, beside the workspace ``workspace`` (the default layout:
    bus/workspaces.py); ``identity`` "" is the folder of every such tree."""
    people = workspace.with_name(workspace.name + "-identities")
    return people / identity.replace(":", "~") if identity else people


@pytest.fixture(scope="session")
def mail_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and a certificate for 127.0.0.1, for the mail servers' TLS."""
    from tests.redis_topology import make_certificates

    where = tmp_path_factory.mktemp("mail-certs")
    make_certificates(where, "127.0.0.1")
    return where


@pytest.fixture
def dovecot(mail_certs: Path) -> Iterator[Dovecot]:
    """The system's Dovecot on loopback: the agent's mailbox (STARTTLS on its port, IMAPS on tls_port)."""
    server = Dovecot(mail_certs).start()
    yield server
    server.close()


@pytest.fixture
def smtp() -> Iterator[SmtpSink]:
    """aiosmtpd on loopback, plain text: where the agent's answers go."""
    sink = SmtpSink().start()
    yield sink
    sink.stop()
