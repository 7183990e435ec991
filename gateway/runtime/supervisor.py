"""``pincer up`` until it only supervises: everything checked and prepared, then the watcher.

The configuration is validated, the data dir locked, the local model prepared, the embedded Redis
started and each child's command and environment worked out (each role sees only its own secrets);
then this process becomes `gateway.runtime.watch` (an exec, the same pid), which starts the children
and watches them with nothing but the standard library loaded.
"""

from __future__ import annotations

import os
import re
import secrets
import sys
from pathlib import Path

from brain.config import BrainSettings
from brain.llm import LOCAL, NOT_CONFIGURED, resolve_model
from bus.config import ENV_PREFIX, REFERENCE, Config, ConfigError, secret_variables
from bus.private_file import write_private
from bus.progress import Brief, Tee, for_stream
from bus.redis_server import EmbeddedRedis, free_port
from bus.settings import RedisSettings, RuntimeSettings
from gateway.channels.config import ChannelSettings
from gateway.config import GatewaySettings
from gateway.runtime.daemon import AlreadyRunning, DaemonState, DataDirLock, StateFile, this_process
from gateway.runtime.watch import PREFIX, Child, Plan, say
from gateway.tokens import TokenError, ensure_owner_token, owner_token_path
from hands.config import HandsSettings
from localmodel import KEY_VARIABLE
from localmodel.provision import prepare
from localmodel.weights import WeightsError

LOCAL_LLM_TIMEOUT_S = 600.0
LOCAL_CONNECT_PATIENCE_S = 120.0  # a model server restarted by the supervisor loads its weights again first


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
    """`pincer up` up to the moment it only supervises: the lock, the local model, Redis, each child's
    command and environment; then the exec into the watcher (gateway.runtime.watch) with that plan."""

    def __init__(self, config: Config, *, hands: int, env: dict[str, str], argv: list[str],
                 local_model: bool = False) -> None:
        self.config, self.hands, self.env, self.argv = config, hands, env, argv
        self.brain = config.section("brain", BrainSettings)
        self.local_model = local_model or self.brain.model == LOCAL
        self.model_file: Path | None = None
        self.gateway = config.section("gateway", GatewaySettings)
        self.runtime = config.runtime
        self.redis: EmbeddedRedis | None = None
        # Hands drain on SIGTERM for redis.drain_timeout_s; give them that, and a little more.
        self.grace_s = max(10.0, config.redis.drain_timeout_s + 5)
        self.lock = DataDirLock(self.runtime.data_path)
        self.state_file = StateFile(self.runtime.data_path)
        self.state = DaemonState(supervisor=this_process(), argv=argv, gateway_url=self.gateway.url,
                                 log_dir=str(self.runtime.logs_path))
        self.withheld = referenced_variables(config.raw)

    def run(self) -> int:
        """Prepare and become the watcher (never returns then); the exit code of a start that failed."""
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
                    self.model_file = prepare(self.runtime.data_path, self.brain.local.model_path, say, sink=shown)
                except WeightsError as exc:
                    say(f"error: the local model is not ready: {exc}")
                    return 1
            elif not self.brain.api_base and resolve_model(self.brain.model, self.env) is None:
                say(f"warning: {NOT_CONFIGURED}")
            hand_over(self.plan(), self.lock)
            return 1  # not reached: hand_over replaces this process
        finally:  # only a start that failed gets here
            if self.redis:
                self.redis.stop()
            self.state_file.remove()
            self.lock.release()

    def _preparing(self, brief: str) -> None:
        """What the local model's first start is doing, for `pincer status` (the state file; empty when done)."""
        self.state.preparing = brief
        self.state_file.write(self.state)

    def plan(self) -> Plan:
        """Redis started (from this thread: its PDEATHSIG follows the thread that started it, and the exec
        ends every other) and every child worked out, in the order they start."""
        env = dict(self.env)
        if self.config.redis.sentinels:
            say(f"using the Redis the sentinels name master of {self.config.redis.sentinel_master!r}")
        elif not self.config.redis.url:
            self.redis = embedded_redis(self.config.redis, Path(self.config.runtime.data_dir))
            env["PINCER_REDIS_URL"] = self.redis.start()
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
        model_api = None
        if self.model_file is not None:
            model, brain_env = self._local_model(self.model_file)
            children.append(model)
            model_api = (brain_env["PINCER_LLM_API_BASE"], brain_env["PINCER_LLM_API_KEY"])
        # Each role runs as itself (`python -m brain`, ...): `ps` says what runs.
        children += [Child("gateway", [sys.executable, "-m", "gateway.server"], self._gateway_env(), role="gateway"),
                     Child("brain", [sys.executable, "-m", "brain"], brain_env, role="brain")]
        children += [Child(f"hands-{i}", [sys.executable, "-m", "hands"], {}, role="hands")
                     for i in range(1, self.hands + 1)]
        children += self._channels()
        for child in children:  # what each may see of ours, and its own
            child.env = {**role_env(env, child.role, withheld=self.withheld), **child.env}
        schedule = self.runtime.backup
        folder = schedule.dir.expanduser() if schedule.dir else self.runtime.data_path / "backups"
        return Plan(
            children=children, state=self.state.model_dump(mode="json"), state_file=str(self.state_file.path),
            lock_fd=-1, hands=self.hands, gateway_url=self.gateway.url, grace_s=self.grace_s,
            log_dir=str(self.runtime.logs_path), log_max_bytes=int(self.runtime.log_max_mb * 2**20),
            log_backups=self.runtime.log_backups,
            redis_pid=self.redis.process.pid if self.redis and self.redis.process else 0,
            redis_url_file=str(self.redis.url_file) if self.redis else "", model_api=model_api,
            backup_cron=schedule.cron or "",
            backup_argv=[sys.executable, "-m", "gateway", "backup", "--dir", str(folder), "--keep", str(schedule.keep),
                         *(["--with-secrets"] if schedule.secrets else [])],
            backup_env=role_env(env, "hands", withheld=self.withheld))

    def _channels(self) -> list[Child]:
        """A process per enabled chat channel. Its token is handed over as its own setting: a `${NAME}` in
        the file names a variable (TELEGRAM_BOT_TOKEN, say) that no other role may see."""
        settings = self.config.section("channels", ChannelSettings)
        return [Child(name, [sys.executable, "-m", "gateway.channels", name], role="channels",
                      env={f"PINCER_CHANNELS__{name.upper()}__{key.upper()}": value
                           for key, value in settings.of(name).secrets().items()})
                for name in settings.enabled()]

    def _local_model(self, model_file: Path) -> tuple[Child, dict[str, str]]:
        """The model's server as a child on a free loopback port, and what the Brain needs to use it."""
        port = free_port()
        warm = self.runtime.data_path / "models" / f"{model_file.name}.prefix.txt"  # read ahead at each start
        key = secrets.token_urlsafe(32)  # this start's: the server and the Brain have it, no one else
        child = Child("model", [sys.executable, "-m", "localmodel", "serve", "--model", str(model_file),
                                "--port", str(port), "--context", str(self.brain.local.context_tokens),
                                "--warm-file", str(warm)], {KEY_VARIABLE: key}, role="model")
        # Loopback never goes through a proxy the environment names for the internet.
        bypass = ",".join(filter(None, [self.env.get("NO_PROXY") or self.env.get("no_proxy"), "127.0.0.1",
                                        "localhost"]))
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


def hand_over(plan: Plan, lock: DataDirLock) -> None:
    """Become the watcher: the same pid (the state file, `pincer stop` and systemd know it), the lock and the
    children kept, the plan in an anonymous file (it holds every child's secrets: no path to read them at)."""
    plan.lock_fd = lock.fileno()
    os.set_inheritable(plan.lock_fd, True)
    handed = os.memfd_create("pincer-plan", 0)
    os.set_inheritable(handed, True)
    os.write(handed, plan.dumps().encode())
    os.lseek(handed, 0, os.SEEK_SET)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "gateway.runtime.watch", str(handed)])
