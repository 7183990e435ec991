"""``pincer up``: embedded Redis plus Gateway, Brain and N Hands as separate processes.

Each child runs in its own session (so one Ctrl-C reaches only the supervisor,
which then stops everyone in order), dies with the supervisor if it is killed
(PDEATHSIG), has its output prefixed with its role and kept in its own log
file, and is restarted with backoff if it crashes, unless it keeps crashing at
once. The supervisor owns its data dir (one lock) and keeps the daemon state
file current, so `pincer stop`, `status` and `logs` find everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brain.config import BrainSettings
from brain.llm import LOCAL, NOT_CONFIGURED, resolve_model
from bus.config import ENV_PREFIX, REFERENCE, Config, ConfigError, RedisSettings, RuntimeSettings, secret_variables
from bus.private_file import write_private
from bus.process_guard import die_with_parent
from bus.progress import Brief, Tee, for_stream
from bus.redis_server import EmbeddedRedis, free_port
from gateway.channels.config import ChannelSettings
from gateway.config import GatewaySettings
from gateway.runtime.daemon import AlreadyRunning, DaemonState, DataDirLock, Proc, StateFile, start_time, this_process
from gateway.runtime.logfiles import RoleLog
from gateway.tokens import TokenError, ensure_owner_token, owner_token_path
from hands.config import HandsSettings
from localmodel import KEY_VARIABLE
from localmodel.provision import prepare
from localmodel.weights import WeightsError

QUICK_EXIT_S = 5.0
LOCAL_LLM_TIMEOUT_S = 600.0
LOCAL_CONNECT_PATIENCE_S = 120.0  # a model server restarted by the supervisor loads its weights again first
MAX_QUICK_EXITS = 3


PREFIX = f"{'pincer':>9} | "


def say(line: str) -> None:
    print(f"{PREFIX}{line}", flush=True)


# Variables outside Pincer's settings that hold a credential: model providers' keys, cloud credentials.
# (Pincer's own secret settings are known by what they are: ``bus.config.secret_variables``.)
SECRET_NAME = re.compile(
    r"(_API_KEY|_APIKEY|_TOKEN|_SECRET|_SECRET_KEY|_PASSWORD|_PASSWD|_ACCESS_KEY|_ACCESS_KEY_ID|_CREDENTIALS"
    r"|_SESSION_TOKEN|_PRIVATE_KEY)$"
    r"|^(AWS|AZURE|GOOGLE|GCP|VERTEXAI|VERTEX|OPENAI|ANTHROPIC|GEMINI|GROQ|MISTRAL|COHERE|HF|HUGGINGFACE|OPENROUTER"
    r"|TOGETHER|TOGETHERAI|DEEPSEEK|XAI|FIREWORKS|PERPLEXITY|REPLICATE|DATABRICKS|WATSONX|SAMBANOVA|CEREBRAS)_",
    re.IGNORECASE)
PINCER_ROLES = ("gateway", "brain", "hands", "channels")
# Each secret setting goes to the role whose section it is; Redis' credentials to every Pincer role.
SECRETS = {**secret_variables({"redis": RedisSettings, "runtime": RuntimeSettings, "hands": HandsSettings,
                               "brain": BrainSettings, "gateway": GatewaySettings, "channels": ChannelSettings}),
           "PINCER_TOKEN": "gateway"}  # a client's token (`pincer chat`): no child needs it


def role_env(env: dict[str, str], role: str, *, withheld: frozenset[str] = frozenset()) -> dict[str, str]:
    """What one role may see of the environment: each secret setting only its own section's role (Redis'
    every Pincer role), the model providers' credentials only the Brain, every other setting every role.
    The local model's server (role ``model``) sees no secret at all; ``withheld`` (the variables the
    configuration names as `${NAME}`) no role sees: whoever needs one is handed its value as its setting."""
    def allowed(name: str) -> bool:
        if name in withheld:
            return False
        section = SECRETS.get(name.upper())
        if section is not None:
            return section == role or (section == "redis" and role in PINCER_ROLES)
        if name.upper().startswith(ENV_PREFIX):
            return True
        return role == "brain" or not SECRET_NAME.search(name)

    return {k: v for k, v in env.items() if allowed(k)}


def referenced_variables(raw: object) -> frozenset[str]:
    """The environment variables a configuration reads as `${NAME}` (a chat channel's token, say)."""
    if isinstance(raw, dict):
        return frozenset().union(*(referenced_variables(v) for v in raw.values()))
    if isinstance(raw, list):
        return frozenset().union(*(referenced_variables(v) for v in raw))
    return frozenset(REFERENCE.findall(raw)) if isinstance(raw, str) else frozenset()


ROLL_WAIT_S = 120.0  # how long a rolling restart waits for each process to be back before it stops


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # on top of what its role may see of the supervisor's
    role: str = ""
    process: asyncio.subprocess.Process | None = None
    started: float = 0.0
    quick_exits: int = 0
    pump: asyncio.Task[None] | None = field(default=None, repr=False)
    planned: bool = False  # stopped by a rolling restart: started again at once, not counted as a failure


def listen_tls(settings: RedisSettings) -> tuple[Path, Path] | None:
    """The certificate and key the embedded Redis needs to listen beyond loopback (ConfigError: exit 78)."""
    if not settings.listen:
        return None
    cert, key = settings.tls_cert_file, settings.tls_key_file
    missing = [name for name, path in (("redis.tls_cert_file", cert), ("redis.tls_key_file", key))
               if path is None or not Path(path).expanduser().is_file()]
    if missing:
        raise ConfigError(f"--listen {settings.listen} (redis.listen) serves workers on other hosts, so only over "
                          f"TLS: set {' and '.join(missing)} to a certificate for that address and its key "
                          "(PINCER_REDIS__TLS_CERT_FILE, PINCER_REDIS__TLS_KEY_FILE)")
    assert cert is not None and key is not None
    return Path(cert).expanduser().resolve(), Path(key).expanduser().resolve()


def embedded_redis(settings: RedisSettings, data_dir: Path) -> EmbeddedRedis:
    """The embedded Redis as configured (on loopback, or also on ``redis.listen`` with TLS)."""
    return EmbeddedRedis(data_dir, port=settings.embedded_port, listen=settings.listen, tls=listen_tls(settings))


class Supervisor:
    def __init__(self, config: Config, *, hands: int, env: dict[str, str], argv: list[str],
                 local_model: bool = False) -> None:
        self.config, self.hands, self.env, self.argv = config, hands, env, argv
        self.brain = config.section("brain", BrainSettings)
        self.local_model = local_model or self.brain.model == LOCAL
        self.model_file: Path | None = None
        self.gateway = config.section("gateway", GatewaySettings)
        self.runtime = config.runtime
        self.redis: EmbeddedRedis | None = None
        self.stop = asyncio.Event()
        self.roll = asyncio.Event()
        self.failed: str | None = None
        # Hands drain on SIGTERM for redis.drain_timeout_s; give them that, and a little more.
        self.grace_s = max(10.0, config.redis.drain_timeout_s + 5)
        self.lock = DataDirLock(self.runtime.data_path)
        self.state_file = StateFile(self.runtime.data_path)
        self.state = DaemonState(supervisor=this_process(), argv=argv, gateway_url=self.gateway.url,
                                 log_dir=str(self.runtime.logs_path))
        self.logs: dict[str, RoleLog] = {}
        self.withheld = referenced_variables(config.raw)

    async def run(self) -> int:
        try:
            self.lock.acquire()
        except AlreadyRunning as exc:
            say(f"error: {exc}")
            return 1
        try:
            self.state_file.write(self.state)
            if self.local_model:
                try:  # before any child: the first start installs and fetches for minutes
                    shown = Tee((for_stream(sys.stdout, say, prefix=PREFIX), Brief(self._preparing)))
                    self.model_file = await asyncio.to_thread(
                        prepare, self.runtime.data_path, self.brain.local.model_path, say, sink=shown)
                except WeightsError as exc:
                    say(f"error: the local model is not ready: {exc}")
                    return 1
            elif not self.brain.api_base and resolve_model(self.brain.model, self.env) is None:
                say(f"warning: {NOT_CONFIGURED}")
            return await self._run()
        finally:
            self.state_file.remove()
            for role_log in self.logs.values():
                role_log.close()
            self.lock.release()

    def _preparing(self, brief: str) -> None:
        """What the local model's first start is doing, for `pincer status` (the state file; empty when done)."""
        self.state.preparing = brief
        self.state_file.write(self.state)

    async def _run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop.set)
        loop.add_signal_handler(signal.SIGUSR1, self.roll.set)  # `pincer restart --rolling`, systemctl reload
        env = dict(self.env)
        if self.config.redis.sentinels:
            say(f"using the Redis the sentinels name master of {self.config.redis.sentinel_master!r}")
        elif not self.config.redis.url:
            self.redis = embedded_redis(self.config.redis, Path(self.config.runtime.data_dir))
            env["PINCER_REDIS_URL"] = await asyncio.to_thread(self.redis.start)
            say(f"embedded Redis on 127.0.0.1:{self.redis.port} (data in {self.redis.dir})")
            if self.redis.remote_url:
                remote = self.redis.url_file.with_name("redis.remote-url")
                write_private(remote, self.redis.remote_url + "\n")
                say(f"Redis also on {self.redis.listen}:{self.redis.port}, TLS only: workers elsewhere use the URL "
                    f"in {remote} (CA_FILE: the CA that signed redis.tls_cert_file)")
        else:
            say("using the Redis at redis.url")
        children: list[Child] = []
        brain_env: dict[str, str] = {}
        if self.model_file is not None:
            model, brain_env = self._local_model(self.model_file, env)
            children.append(model)
        # Each role runs as itself (`python -m brain`, ...): `ps` says what runs.
        children += [Child("gateway", [sys.executable, "-m", "gateway.server"], self._gateway_env(), role="gateway"),
                     Child("brain", [sys.executable, "-m", "brain"], brain_env, role="brain")]
        children += [Child(f"hands-{i}", [sys.executable, "-m", "hands"], role="hands")
                     for i in range(1, self.hands + 1)]
        children += self._channels()
        try:
            for child in children:
                await self._start(child, env)
                if child.name == "model" and not await self._model_answers(child, brain_env["PINCER_LLM_API_BASE"],
                                                                           brain_env["PINCER_LLM_API_KEY"]):
                    if not self.stop.is_set():  # not a Ctrl-C while it loaded
                        self.failed = "the local model's server did not start (see its lines above)"
                        self.stop.set()
                    break
            watchers = [asyncio.create_task(self._watch(child, env)) for child in children if child.process]
            announce = asyncio.create_task(self._announce())
            backups = asyncio.create_task(self._backups(env))
            rolling = asyncio.create_task(self._rolling(children))
            await self.stop.wait()
            announce.cancel()
            backups.cancel()
            rolling.cancel()
            say("stopping…")
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        finally:
            await asyncio.gather(*(self._terminate(child) for child in children), return_exceptions=True)
            if self.redis:
                await asyncio.to_thread(self.redis.stop)
        if self.failed:
            say(f"gave up: {self.failed}")
            return 1
        say("stopped")
        return 0

    def _channels(self) -> list[Child]:
        """A process per enabled chat channel. Its token is handed over as its own setting: a `${NAME}` in
        the file names a variable (TELEGRAM_BOT_TOKEN, say) that no other role may see."""
        settings = self.config.section("channels", ChannelSettings)
        return [Child(name, [sys.executable, "-m", "gateway.channels", name], role="channels",
                      env={f"PINCER_CHANNELS__{name.upper()}__{key.upper()}": value
                           for key, value in settings.of(name).secrets().items()})
                for name in settings.enabled()]

    def _local_model(self, model_file: Path, env: dict[str, str]) -> tuple[Child, dict[str, str]]:
        """The model's server as a child on a free loopback port, and what the Brain needs to use it."""
        port = free_port()
        warm = self.runtime.data_path / "models" / f"{model_file.name}.prefix.txt"  # read ahead at each start
        key = secrets.token_urlsafe(32)  # this start's: the server and the Brain have it, no one else
        child = Child("model", [sys.executable, "-m", "localmodel", "serve", "--model", str(model_file),
                                "--port", str(port), "--context", str(self.brain.local.context_tokens),
                                "--warm-file", str(warm)], {KEY_VARIABLE: key}, role="model")
        # Loopback never goes through a proxy the environment names for the internet.
        bypass = ",".join(filter(None, [env.get("NO_PROXY") or env.get("no_proxy"), "127.0.0.1", "localhost"]))
        return child, {"PINCER_MODEL": f"openai/{LOCAL}", "PINCER_LLM_API_BASE": f"http://127.0.0.1:{port}/v1",
                       "PINCER_LLM_API_KEY": key, "NO_PROXY": bypass, "no_proxy": bypass,
                       # On a CPU the first reply reads the whole prompt (~40 s for 13 tools on 2 cores).
                       "PINCER_BRAIN__LLM_TIMEOUT_S": str(max(self.brain.llm_timeout_s, LOCAL_LLM_TIMEOUT_S)),
                       "PINCER_BRAIN__LLM_CONNECT_PATIENCE_S": str(max(self.brain.llm_connect_patience_s,
                                                                       LOCAL_CONNECT_PATIENCE_S))}

    def _gateway_env(self) -> dict[str, str]:
        """The owner token for the Gateway alone: made on first start, kept 0600 in the data dir."""
        configured = self.gateway.static_token()
        if configured:
            return {"PINCER_GATEWAY_TOKEN": configured}  # the only role that may see it
        data_dir = Path(self.config.runtime.data_dir)
        try:
            token = ensure_owner_token(data_dir)
        except TokenError as exc:
            raise ConfigError(str(exc)) from None
        say(f"owner token in {owner_token_path(data_dir)} (`pincer chat` uses it)")
        return {"PINCER_GATEWAY_TOKEN": token}

    async def _start(self, child: Child, env: dict[str, str]) -> None:
        child.process = await asyncio.create_subprocess_exec(
            *child.argv,
            env={**role_env(env, child.role, withheld=self.withheld), **child.env},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        child.started = time.monotonic()
        if child.name not in self.logs:
            self.logs[child.name] = RoleLog(self.runtime.logs_path, child.name,
                                            max_bytes=int(self.runtime.log_max_mb * 2**20),
                                            backups=self.runtime.log_backups)
        child.pump = asyncio.create_task(_pump(child.name, child.process.stdout, self.logs[child.name]))
        self.state.children[child.name] = Proc(pid=child.process.pid, started=start_time(child.process.pid) or 0)
        self.state_file.write(self.state)

    async def _watch(self, child: Child, env: dict[str, str]) -> None:
        """Restart a child that exits, unless it keeps exiting at once."""
        while True:
            assert child.process is not None
            code = await child.process.wait()
            if child.pump:
                await child.pump
            if self.stop.is_set():
                return
            if child.planned:  # a rolling restart stopped it: the new one starts now
                child.planned = False
                await self._start(child, env)
                continue
            quick = time.monotonic() - child.started < QUICK_EXIT_S
            child.quick_exits = child.quick_exits + 1 if quick else 0
            if child.quick_exits >= MAX_QUICK_EXITS:
                self.failed = f"{child.name} exited with code {code} {MAX_QUICK_EXITS} times right after starting"
                self.stop.set()
                return
            delay = min(30.0, 0.5 * 2 ** child.quick_exits)
            say(f"{child.name} exited with code {code}; restarting in {delay:g}s")
            await asyncio.sleep(delay)
            await self._start(child, env)

    async def _rolling(self, children: list[Child]) -> None:
        """On SIGUSR1: each process in turn stopped (it drains what it runs: workers finish or hand back
        their calls, the Gateway its requests) and started again, the next one only once the pool is
        whole again; so a pool upgraded in place takes the new code with every turn kept."""
        order = {"hands": 0, "channels": 1, "brain": 2, "gateway": 3}
        while True:
            await self.roll.wait()
            self.roll.clear()
            for child in sorted((c for c in children if c.role in order), key=lambda c: order[c.role]):
                self._rolling_state(f"restarting {child.name}")
                say(f"rolling restart: {child.name}")
                child.planned = True
                old = child.process
                if old is not None and old.returncode is None:
                    await self._drain(old, child.name)  # its watcher starts the new one once it is gone
                if not await self._back(child, old.pid if old else None):
                    self._rolling_state(f"stopped: {child.name} did not come back whole within {ROLL_WAIT_S:g}s")
                    say(f"rolling restart stopped: {child.name} did not come back within {ROLL_WAIT_S:g}s")
                    break
            else:
                self.state.rolled += 1
                self._rolling_state("")
                say("rolling restart done")

    async def _drain(self, process: asyncio.subprocess.Process, name: str) -> None:
        """SIGTERM (the process drains), and SIGKILL past the grace; its log and restart are its watcher's."""
        _signal_group(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self.grace_s)
        except TimeoutError:
            say(f"{name} did not stop within {self.grace_s:g}s; killing it")
            _signal_group(process.pid, signal.SIGKILL)
            await process.wait()

    async def _back(self, child: Child, old: int | None) -> bool:
        """Whether ``child`` runs again as a new process and the pool answers whole within ROLL_WAIT_S."""
        deadline = time.monotonic() + ROLL_WAIT_S
        while time.monotonic() < deadline and not self.stop.is_set():
            process = child.process
            if process is not None and process.pid != old and process.returncode is None:
                health = await asyncio.to_thread(_health, f"{self.gateway.url}/healthz")
                if health.get("status") == "ok" and health.get("hands", 0) >= self.hands \
                        and health.get("brains", 0) >= 1:
                    return True
            await asyncio.sleep(0.2)
        return False

    def _rolling_state(self, where: str) -> None:
        self.state.rolling = where
        self.state_file.write(self.state)

    async def _terminate(self, child: Child) -> None:
        process = child.process
        if process is None or process.returncode is not None:
            return
        await self._drain(process, child.name)
        if child.pump:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(child.pump, 2)

    async def _model_answers(self, child: Child, api_base: str, key: str) -> bool:
        """Wait while the model loads (seconds) until its server answers, or its process ends."""
        while not self.stop.is_set():
            if child.process is None or child.process.returncode is not None:
                return False
            if await asyncio.to_thread(_health, f"{api_base}/models", {"Authorization": f"Bearer {key}"}):
                say(f"local model serving on {api_base}")
                return True
            await asyncio.sleep(0.5)
        return False

    async def _backups(self, env: dict[str, str]) -> None:
        """``runtime.backup``: a `pincer backup` at each instant of its cron, as a process of its own."""
        schedule = self.runtime.backup
        if not schedule.cron:
            return
        from datetime import datetime

        from cronsim import CronSim

        folder = schedule.dir.expanduser() if schedule.dir else self.runtime.data_path / "backups"
        argv = [sys.executable, "-m", "gateway", "backup", "--dir", str(folder), "--keep", str(schedule.keep),
                *(["--with-secrets"] if schedule.secrets else [])]
        while True:
            now = datetime.now().astimezone()
            due = next(CronSim(schedule.cron, now))
            await asyncio.sleep(max(0.0, (due - now).total_seconds()))
            process = await asyncio.create_subprocess_exec(
                *argv, env=role_env(env, "hands", withheld=self.withheld), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, preexec_fn=die_with_parent)
            said, _ = await process.communicate()
            lines = said.decode(errors="replace").strip().splitlines()
            say(f"scheduled backup {'done' if process.returncode == 0 else 'FAILED'}: {' | '.join(lines[-3:])}")

    async def _announce(self) -> None:
        """Say where the Gateway listens once it answers."""
        url = self.gateway.url
        for _ in range(600):
            health = await asyncio.to_thread(_health, f"{url}/healthz")
            if health.get("status") == "ok" and health.get("hands", 0) >= self.hands:
                say(f"ready: Gateway on {url} — chat with `pincer chat` "
                    f"(brains {health['brains']}, hands {health['hands']})")
                self.state.ready = True
                self.state_file.write(self.state)
                return
            await asyncio.sleep(0.5)


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


def _health(url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The Gateway's /healthz answer (503 included), or {} while it does not answer. urllib, not httpx:
    the supervisor stays small (httpx with its CLI's imports is ~9 MB of an idle daemon)."""
    try:
        with _DIRECT.open(urllib.request.Request(url, headers=headers or {}), timeout=2) as response:
            body = response.read()
    except urllib.error.HTTPError as refused:
        body = refused.read()
    except (OSError, ValueError):
        return {}
    try:
        found = json.loads(body)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


async def _pump(name: str, stream: asyncio.StreamReader | None, role_log: RoleLog) -> None:
    """Copy a child's output to its log file and to ours, one prefixed line at a time."""
    if stream is None:
        return
    while line := await stream.readline():
        text = line.decode(errors="replace").rstrip("\n")
        role_log.write(text)
        print(f"{name:>9} | {text}", flush=True)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
