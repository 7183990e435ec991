"""What `pincer up` becomes once everything is checked and prepared: a small process that only supervises.

`gateway.runtime.supervisor` validates the configuration, takes the data dir's lock, prepares the local
model, starts the embedded Redis and works out every child's command and environment (a ``Plan``).
It then replaces itself (exec, the same pid) with this module, handing the plan over in an anonymous
file no path names. Here nothing but the standard library is loaded, so the process that stays up for
months holds what supervising needs and nothing of what checking needed (pydantic, the settings, TLS).

Each child runs in its own session (so one Ctrl-C reaches only the supervisor, which then stops everyone
in order), dies with the supervisor if it is killed (PDEATHSIG), has its output prefixed with its role
and kept in its own log file, and is restarted with backoff if it crashes, unless it keeps crashing at
once. The daemon state file stays current, so `pincer stop`, `status` and `logs` find everything.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # The watcher speaks plain HTTP to loopback only: no libssl (~9 MB) for asyncio
    sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]  # asyncio and http.client then go without

import asyncio
import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bus.private_file import write_private
from bus.process_guard import die_with_parent
from gateway.runtime.logfiles import RoleLog
from gateway.runtime.procinfo import start_time

QUICK_EXIT_S = 5.0
MAX_QUICK_EXITS = 3
ROLL_WAIT_S = 120.0  # how long a rolling restart waits for each process to be back before it stops
REDIS_STOP_S = 10.0
PREFIX = f"{'pincer':>9} | "


def say(line: str) -> None:
    print(f"{PREFIX}{line}", flush=True)


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]  # all it sees: what its role may of the supervisor's, and its own
    role: str = ""
    process: asyncio.subprocess.Process | None = field(default=None, repr=False)
    started: float = 0.0
    quick_exits: int = 0
    pump: asyncio.Task[None] | None = field(default=None, repr=False)
    planned: bool = False  # stopped by a rolling restart: started again at once, not counted as a failure


@dataclass
class Plan:
    """Everything the watcher needs, worked out by the supervisor before the exec; secrets included, so it
    travels in an anonymous file, never a path."""

    children: list[Child]
    state: dict[str, Any]  # the daemon state file's content (gateway.runtime.daemon.DaemonState, dumped)
    state_file: str
    lock_fd: int  # the data dir's lock, inherited open: held until this process ends
    hands: int
    gateway_url: str
    grace_s: float  # how long a stopping process may drain before it is killed
    log_dir: str
    log_max_bytes: int
    log_backups: int
    redis_pid: int = 0  # the embedded Redis (a child of this pid since before the exec), or 0
    redis_url_file: str = ""
    model_api: tuple[str, str] | None = None  # the local model's server: its API base and this start's key
    backup_cron: str = ""
    backup_argv: list[str] = field(default_factory=list)
    backup_env: dict[str, str] = field(default_factory=dict)

    def dumps(self) -> str:
        plain = asdict(self)
        for child in plain["children"]:
            for key in ("process", "pump", "started", "quick_exits", "planned"):
                child.pop(key)
        return json.dumps(plain)

    @classmethod
    def loads(cls, text: str) -> Plan:
        raw = json.loads(text)
        raw["children"] = [Child(**child) for child in raw["children"]]
        raw["model_api"] = tuple(raw["model_api"]) if raw["model_api"] else None
        return cls(**raw)


class Watcher:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.stop = asyncio.Event()
        self.roll = asyncio.Event()
        self.failed: str | None = None
        self.logs: dict[str, RoleLog] = {}

    def close(self) -> None:
        """After the run: the state file gone, the logs closed, the data dir's lock let go."""
        with contextlib.suppress(FileNotFoundError):
            Path(self.plan.state_file).unlink()
        for role_log in self.logs.values():
            role_log.close()
        os.close(self.plan.lock_fd)

    def _write_state(self, **changes: Any) -> None:
        self.plan.state.update(changes)
        write_private(Path(self.plan.state_file), json.dumps(self.plan.state, indent=2))

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop.set)
        loop.add_signal_handler(signal.SIGUSR1, self.roll.set)  # `pincer restart --rolling`, systemctl reload
        children = self.plan.children
        try:
            for child in children:
                await self._start(child)
                if child.name == "model" and not await self._model_answers(child):
                    if not self.stop.is_set():  # not a Ctrl-C while it loaded
                        self.failed = "the local model's server did not start (see its lines above)"
                        self.stop.set()
                    break
            watchers = [asyncio.create_task(self._watch(child)) for child in children if child.process]
            others = [asyncio.create_task(work) for work in (self._announce(), self._backups(),
                                                              self._rolling(children))]
            await self.stop.wait()
            for task in others:
                task.cancel()
            say("stopping…")
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        finally:
            await asyncio.gather(*(self._terminate(child) for child in children), return_exceptions=True)
            await asyncio.to_thread(self._stop_redis)
        if self.failed:
            say(f"gave up: {self.failed}")
            return 1
        say("stopped")
        return 0

    async def _start(self, child: Child) -> None:
        child.process = await asyncio.create_subprocess_exec(
            *child.argv, env=child.env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)
        child.started = time.monotonic()
        if child.name not in self.logs:
            self.logs[child.name] = RoleLog(Path(self.plan.log_dir), child.name, max_bytes=self.plan.log_max_bytes,
                                            backups=self.plan.log_backups)
        child.pump = asyncio.create_task(_pump(child.name, child.process.stdout, self.logs[child.name]))
        pid = child.process.pid
        self._write_state(children={**self.plan.state["children"],
                                    child.name: {"pid": pid, "started": start_time(pid) or 0}})

    async def _watch(self, child: Child) -> None:
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
                await self._start(child)
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
            await self._start(child)

    async def _rolling(self, children: list[Child]) -> None:
        """On SIGUSR1: each process in turn stopped (it drains what it runs: workers finish or hand back
        their calls, the Gateway its requests) and started again, the next one only once the pool is
        whole again; so a pool upgraded in place takes the new code with every turn kept."""
        order = {"hands": 0, "channels": 1, "brain": 2, "gateway": 3}
        while True:
            await self.roll.wait()
            self.roll.clear()
            for child in sorted((c for c in children if c.role in order), key=lambda c: order[c.role]):
                self._write_state(rolling=f"restarting {child.name}")
                say(f"rolling restart: {child.name}")
                child.planned = True
                old = child.process
                if old is not None and old.returncode is None:
                    await self._drain(old, child.name)  # its watcher starts the new one once it is gone
                if not await self._back(child, old.pid if old else None):
                    self._write_state(rolling=f"stopped: {child.name} did not come back whole within "
                                              f"{ROLL_WAIT_S:g}s")
                    say(f"rolling restart stopped: {child.name} did not come back within {ROLL_WAIT_S:g}s")
                    break
            else:
                self._write_state(rolled=self.plan.state["rolled"] + 1, rolling="")
                say("rolling restart done")

    async def _drain(self, process: asyncio.subprocess.Process, name: str) -> None:
        """SIGTERM (the process drains), and SIGKILL past the grace; its log and restart are its watcher's."""
        _signal_group(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self.plan.grace_s)
        except TimeoutError:
            say(f"{name} did not stop within {self.plan.grace_s:g}s; killing it")
            _signal_group(process.pid, signal.SIGKILL)
            await process.wait()

    async def _back(self, child: Child, old: int | None) -> bool:
        """Whether ``child`` runs again as a new process and the pool answers whole within ROLL_WAIT_S."""
        deadline = time.monotonic() + ROLL_WAIT_S
        while time.monotonic() < deadline and not self.stop.is_set():
            process = child.process
            if process is not None and process.pid != old and process.returncode is None:
                health = await asyncio.to_thread(_health, f"{self.plan.gateway_url}/healthz")
                if health.get("status") == "ok" and health.get("hands", 0) >= self.plan.hands \
                        and health.get("brains", 0) >= 1:
                    return True
            await asyncio.sleep(0.2)
        return False

    async def _terminate(self, child: Child) -> None:
        process = child.process
        if process is None or process.returncode is not None:
            return
        await self._drain(process, child.name)
        if child.pump:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(child.pump, 2)

    def _stop_redis(self) -> None:
        """The embedded Redis: SIGTERM (it flushes its append-only file), SIGKILL past REDIS_STOP_S."""
        pid = self.plan.redis_pid
        if not pid:
            return
        with contextlib.suppress(FileNotFoundError):
            Path(self.plan.redis_url_file).unlink()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + REDIS_STOP_S
        try:
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    return
                time.sleep(0.05)
        except ChildProcessError:  # already reaped
            return

    async def _model_answers(self, child: Child) -> bool:
        """Wait while the model loads (seconds) until its server answers, or its process ends."""
        assert self.plan.model_api is not None
        api_base, key = self.plan.model_api
        while not self.stop.is_set():
            if child.process is None or child.process.returncode is not None:
                return False
            if await asyncio.to_thread(_health, f"{api_base}/models", {"Authorization": f"Bearer {key}"}):
                say(f"local model serving on {api_base}")
                return True
            await asyncio.sleep(0.5)
        return False

    async def _backups(self) -> None:
        """``runtime.backup``: a `pincer backup` at each instant of its cron, as a process of its own."""
        if not self.plan.backup_cron:
            return
        from datetime import datetime

        from cronsim import CronSim

        while True:
            now = datetime.now().astimezone()
            due = next(CronSim(self.plan.backup_cron, now))
            await asyncio.sleep(max(0.0, (due - now).total_seconds()))
            process = await asyncio.create_subprocess_exec(
                *self.plan.backup_argv, env=self.plan.backup_env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, preexec_fn=die_with_parent)
            said, _ = await process.communicate()
            lines = said.decode(errors="replace").strip().splitlines()
            say(f"scheduled backup {'done' if process.returncode == 0 else 'FAILED'}: {' | '.join(lines[-3:])}")

    async def _announce(self) -> None:
        """Say where the Gateway listens once it answers."""
        url = self.plan.gateway_url
        for _ in range(600):
            health = await asyncio.to_thread(_health, f"{url}/healthz")
            if health.get("status") == "ok" and health.get("hands", 0) >= self.plan.hands:
                say(f"ready: Gateway on {url} — chat with `pincer chat` "
                    f"(brains {health['brains']}, hands {health['hands']})")
                self._write_state(ready=True)
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


def main(argv: list[str]) -> int:
    """``python -m gateway.runtime.watch PLAN_FD``: the plan read from the inherited file, then closed."""
    with os.fdopen(int(argv[0]), encoding="utf-8") as handed:
        plan = Plan.loads(handed.read())
    watcher = Watcher(plan)
    try:
        return asyncio.run(watcher.run())
    finally:
        watcher.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
